// Compiled after emu.h and gpu_kernels.CODEC_SOURCES (one variant, OP): runs the variant's
// coccl_codec on a grid of emu_grid blocks of EMU_THREADS threads (emu_run_grid), with the
// arguments in the order gpu_kernels.py passes them (the ring hops, OP 8, 9 and 10 without
// DEC, take own, the payload in and the payload out; with DEC, emu_launch_dec, also the
// decoded output). A variant called through the other entry point aborts.
#include <cstdlib>

#define EMU_HOP (OP == 8 || OP == 9 || OP == 10)
int emu_grid = 1;
extern "C" void emu_set_grid(int grid) { emu_grid = grid; }
extern "C" void emu_launch(void* a0, void* a1, void* a2, long long c, long long k) {
#if EMU_HOP && DEC
  (void)a0, (void)a1, (void)a2, (void)c, (void)k;
  std::abort();
#elif EMU_HOP
  emu_run_grid(emu_grid, [=] { coccl_codec(a0, a1, a2, c, k); });
#else
  (void)a2;
  emu_run_grid(emu_grid, [=] { coccl_codec(a0, a1, c, k); });
#endif
}
extern "C" void emu_launch_dec(void* a0, void* a1, void* a2, void* a3, long long c,
                               long long k) {
#if EMU_HOP && DEC
  emu_run_grid(emu_grid, [=] { coccl_codec(a0, a1, a2, a3, c, k); });
#else
  (void)a0, (void)a1, (void)a2, (void)a3, (void)c, (void)k;
  std::abort();
#endif
}
