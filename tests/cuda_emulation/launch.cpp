// Compiled after emu.h, codec_kernels.cu, codec_tile_helpers.cu, tah_tables.cu,
// tah_select.cu, tah_kernels.cu, tah_encode.cu, tah_decode.cu and tah_score.cu:
// runs the variant's tah_kernel on a grid of emu_grid blocks of EMU_THREADS threads, one
// block after the other (the kernels' blocks share nothing but global memory), with the
// arguments in the order tah_gpu.py passes them.
int emu_grid = 1;
extern "C" void emu_set_grid(int grid) { emu_grid = grid; }
extern "C" void emu_launch(void* a0, void* a1, long long c, long long r, long long k, long long p,
                           long long q) {
  emu_run_grid(emu_grid, [=] {
#if TAH_OP == 1
    tah_kernel(a0, (unsigned char*)a1, c, r, k, p, q, 0);
#elif TAH_OP == 2
    tah_kernel(a0, (unsigned char*)a1, c, r, k, p, q);
#elif TAH_OP == 3
    tah_kernel((const unsigned char*)a0, a1, c, r, k, p, q);
#elif TAH_OP == 4 || TAH_OP == 7
    tah_kernel((unsigned char*)a0, c, r, k, p, q);
#elif TAH_OP == 5 || TAH_OP == 6
    tah_kernel((unsigned char*)a0, c, r, k, p);
#endif
  });
}
// The scores kernel (TAH_OP 1) with its eighth argument, the byte offset of its sums.
extern "C" void emu_launch8(void* a0, void* a1, long long c, long long r, long long k,
                            long long p, long long q, long long s) {
#if TAH_OP == 1
  emu_run_grid(emu_grid, [=] { tah_kernel(a0, (unsigned char*)a1, c, r, k, p, q, s); });
#endif
}
