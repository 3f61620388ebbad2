// Compiled after emu.h and mx_kernels.cu (with -DMX_HOST): runs the variant's coccl_mx on
// a grid of `blocks` CUDA blocks of THREADS threads, one block after another (each thread
// a std::thread, as emu.h has it), with the arguments in the order mx_gpu.py passes them;
// and the element conversions on their own, for tests/test_codec_mx_emulated.py.
static_assert(THREADS <= EMU_THREADS, "emu.h has slots for EMU_THREADS threads");

extern "C" void emu_mx_launch(const void* src, void* dst, long long count, long long k,
                              long long blocks) {
  g_block = std::make_unique<std::barrier<>>(THREADS);
  g_warp.clear();
  for (int w = 0; w < THREADS / 32; ++w) g_warp.push_back(std::make_unique<std::barrier<>>(32));
  gridDim.x = (unsigned)blocks;
  for (long long b = 0; b < blocks; ++b) {
    blockIdx.x = (unsigned)b;
    std::vector<std::thread> ts;
    for (int t = 0; t < THREADS; ++t)
      ts.emplace_back([=] {
        threadIdx.x = t;
        coccl_mx(src, dst, count, k);
      });
    for (auto& t : ts) t.join();
  }
}

// elem_code (the kernels' short form) and to_code (the direct one) of n float32 bit patterns.
extern "C" void emu_codes(const unsigned* in, unsigned* fast, unsigned* direct, long long n) {
  for (long long i = 0; i < n; ++i) {
    fast[i] = elem_code(in[i]);
    direct[i] = to_code(in[i], EBITS, MBITS, BIAS, QMAX_BITS);
  }
}

// The value of every element code, as float32 bits.
extern "C" void emu_values(unsigned* out) {
  for (unsigned c = 0; c < (1u << CBITS); ++c) out[c] = as_u(elem_value(c));
}
