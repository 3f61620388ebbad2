// Compiled after emu.h and codec_kernels.cu (one variant, OP): runs the variant's
// coccl_codec on a grid of emu_grid blocks of EMU_THREADS threads, one block after the
// other, with the arguments in the order gpu_kernels.py passes them (the ring hops, OP 8,
// 9 and 10 without DEC, take own, the payload in and the payload out).
int emu_grid = 1;
extern "C" void emu_set_grid(int grid) { emu_grid = grid; }
extern "C" void emu_launch(void* a0, void* a1, void* a2, long long c, long long k) {
  gridDim.x = (unsigned)emu_grid;
  for (int b = 0; b < emu_grid; ++b) {
    blockIdx.x = (unsigned)b;
    g_block = std::make_unique<std::barrier<>>(EMU_THREADS);
    g_warp.clear();
    for (int w = 0; w < EMU_THREADS / 32; ++w)
      g_warp.push_back(std::make_unique<std::barrier<>>(32));
    std::vector<std::thread> ts;
    for (int t = 0; t < EMU_THREADS; ++t)
      ts.emplace_back([=] {
        threadIdx.x = t;
#if OP == 8 || OP == 9 || OP == 10
        coccl_codec(a0, a1, a2, c, k);
#else
        (void)a2;
        coccl_codec(a0, a1, c, k);
#endif
      });
    for (auto& t : ts) t.join();
  }
}
