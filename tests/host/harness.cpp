// Runs one coccl_int kernel variant (compiled in with its -D defines) on the host:
//   harness IN COUNT K KEY NOUT OUT [INIT]
// reads the kernel's source buffer from IN, writes NOUT bytes of its destination to OUT;
// INIT, if given, is the destination's initial contents (decode with ACC). Both buffers
// are 16-byte aligned, as CuPy's allocations are.
extern "C" void coccl_int(const void* src, void* dst, long long count, long long K,
                          unsigned long long key);

static std::vector<unsigned char> read_file(const char* path) {
  std::vector<unsigned char> v;
  FILE* f = fopen(path, "rb");
  for (int c; (c = fgetc(f)) != EOF;) v.push_back((unsigned char)c);
  fclose(f);
  return v;
}

int main(int argc, char** argv) {
  const std::vector<unsigned char> in = read_file(argv[1]);
  const long long count = atoll(argv[2]), K = atoll(argv[3]);
  const unsigned long long key = strtoull(argv[4], nullptr, 10);
  const size_t nout = (size_t)atoll(argv[5]);
  std::vector<uint4> src(in.size() / 16 + 1), dst(nout / 16 + 1);
  memcpy(src.data(), in.data(), in.size());
  if (argc > 7) {
    const std::vector<unsigned char> init = read_file(argv[7]);
    memcpy(dst.data(), init.data(), init.size());
  }
  std::barrier<> bar(32);
  g_bar = &bar;
  std::vector<std::thread> lanes;
  for (int l = 0; l < 32; ++l)
    lanes.emplace_back([&, l] {
      threadIdx.x = l;
      coccl_int(src.data(), dst.data(), count, K, key);
    });
  for (std::thread& t : lanes) t.join();
  FILE* f = fopen(argv[6], "wb");
  fwrite(dst.data(), 1, nout, f);
  fclose(f);
}
