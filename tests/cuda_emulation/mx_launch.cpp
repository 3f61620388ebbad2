// Compiled after emu.h and mx_gpu.MX_SOURCES (with -DMX_HOST): runs the variant's coccl_mx on
// a grid of `blocks` CUDA blocks of THREADS threads, one block after another (each thread
// a std::thread, as emu.h has it), with the arguments in the order mx_gpu.py passes them;
// and the element conversions on their own, for tests/test_codec_mx_emulated.py.
static_assert(THREADS == EMU_THREADS, "emu_run_grid runs EMU_THREADS threads a block");

extern "C" void emu_mx_launch(const void* src, void* dst, long long count, long long k,
                              long long blocks) {
  emu_run_grid(blocks, [=] { coccl_mx(src, dst, count, k); });
}

// The direct rounding (the numba kernels' algorithm), the reference for the kernels'
// code_magic: saturating RNE of float32 bits to a code with eb exponent and mb mantissa
// bits (FORMAT.md; minifloat.bits_to_code): the normal range rounds the mantissa, the
// subnormal range the 24-bit significand shifted right by 151 - bias - mb - e (capped at
// 31).
static u32 to_code(u32 bits, int eb, int mb, int bias, u32 qmax_bits) {
  const int nb = eb + mb;
  const u32 sign = (bits >> (31 - nb)) & (1u << nb);
  const u32 a = bits & 0x7fffffffu;
  const u32 ac = a < qmax_bits ? a : qmax_bits;
  const u32 shift = 23u - (u32)mb;
  const u32 half = (1u << (shift - 1u)) - 1u;
  const u32 normal = ((ac + half + ((ac >> shift) & 1u)) >> shift) - ((u32)(127 - bias) << mb);
  const u32 e = ac >> 23;
  const u32 m = (ac & 0x7fffffu) | 0x800000u;
  u32 sshift = (u32)(151 - bias - mb) - e;
  sshift = sshift < 31u ? sshift : 31u;
  const u32 shalf = ((1u << sshift) >> 1) - 1u;
  const u32 sub = (m + shalf + ((m >> sshift) & 1u)) >> sshift;
  return (ac >= ((u32)(128 - bias) << 23) ? normal : sub) | sign;
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
