// Compiled after emu.h and mx_kernels.cu (with -DMX_HOST): runs the variant's coccl_mx on
// a grid of `blocks` CUDA blocks of THREADS threads, one block after another (each thread
// a std::thread, as emu.h has it), with the arguments in the order mx_gpu.py passes them;
// and the element conversions on their own, for tests/test_codec_mx_emulated.py.
static_assert(THREADS == EMU_THREADS, "emu_run_grid runs EMU_THREADS threads a block");

extern "C" void emu_mx_launch(const void* src, void* dst, long long count, long long k,
                              long long blocks) {
  emu_run_grid(blocks, [=] { coccl_mx(src, dst, count, k); });
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
