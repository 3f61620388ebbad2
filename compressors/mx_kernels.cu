// coccl GPU kernels of the microscaled codecs mx and taco_fp, bit-exact with FORMAT.md and
// with the numba kernels (mx_cpu.py, taco_fp_cpu.py).
//
// Part 1 of 4 of one source (mx_gpu.MX_SOURCES: this file, the defines and helpers, then
// mx_encode_kernels.cu and mx_decode_kernels.cu, the mx chunk bodies, then
// mx_entry_kernels.cu, taco_fp's and the kernels), compiled once per variant by compressors/mx_gpu.py
// (NVRTC through cupy.RawModule) with -D defines; every variant defines one kernel,
// `coccl_mx(const void* src, void* dst, long long count, long long K)`, K the number of
// blocks (groups) of the payload:
//
//   OP     1 mx encode, 2 mx decode, 4 taco_fp encode, 5 taco_fp decode; and the two steps
//          before an mx encode with scale e4m3, which leave the per-payload scale S in the
//          payload's own S slot, where the encode (OP 1) reads it:
//          3 partials: CUDA block b writes the largest |x| of the finite mx blocks it
//            covers, as float32 bits, to bytes [4b, 4b + 4) of the payload's code area
//            (dst; the encode overwrites them; 4 * gridDim.x <= K * BPB as long as the
//            grid is at most ceil(K / 64) blocks, which mx_gpu keeps)
//          6 scale: one CUDA block reads the `count` partials from the code area of the
//            payload dst (src unused; 0 partials for an empty payload) and writes
//            S = max(amax / (448 * qmax), 2^-126) to the S slot
//          So no step needs memory beyond x and the payload: nothing is allocated per call
//          and nothing is shared between calls (CUDA graph capture, concurrent streams).
//   ELEM   element format: 0 e2m1, 1 e3m2, 2 e2m3
//   BS     mx block size (16, 32) or taco_fp group size (32..512, a power of two)
//   SC     mx scale: 0 e8m0, 1 e4m3 (with the float32 per-payload scale)
//   XT     element type of x (encode) or out (decode): 0 float32, 1 float16, 2 bfloat16
//   ACC    decode: add into a float32 out (1) or overwrite (0)
//   CINV_BITS  taco_fp: bits of (float)(1/sqrt(G)) computed in double
//   THREADS    threads per CUDA block (a multiple of 32, at most 1024)
//   UNR    chunks per lane per step of the grid-stride loop (loads issued together)
//
// Layout of the work: a lane (thread) owns a chunk of EPL consecutive elements, whose codes
// fill whole 32-bit words: mx 8 (FP4) or 16 (FP6) elements, taco_fp 32 (one run of the
// energy sum). A block (group) is LPB = BS / EPL neighbouring lanes of one warp, which
// combine their maxima (and taco_fp its energy tree and the Walsh-Hadamard stages across
// runs) with xor shuffles; so every lane of a warp runs every iteration of the loops, and
// lanes past the payload compute on zeros and store nothing. Elements are loaded 16 bytes
// at a time and codes stored as whole words where the addresses are aligned (x, out and
// the payload need not be: element and byte stores otherwise), consecutive lanes on
// consecutive bytes; an mx decode whose lane writes more than 16 bytes stores a warp's
// whole span through shared memory (store_span; a decode-accumulate also loads it so).
// An mx decode into a float32 or bfloat16 out runs a lean loop over whole warp spans
// (FAST: the next step's loads in flight; E8M0 values two at a time on bf16x2).
//
// Arithmetic: IEEE float32, RNE, no contraction into FMA and no flush of subnormals: CuPy
// compiles with -ftz=true, so every float operation is inline PTX without .ftz, and
// comparisons of non-negative floats are done on their bits. (The E4M3 encode computes
// FORMAT.md's quotients without a division: explicit fma.rn for exact remainders, and
// double, both argued to round to the same float32 where they are used.) Compiled with -DMX_HOST after
// tests/cuda_emulation/emu.h (plain C++, g++ -ffp-contract=off, a thread per CUDA thread),
// the same source runs on the host: tests/test_codec_mx_emulated.py checks it there
// against the numba kernels.

#ifndef OP
#error "OP must be defined"
#endif
#ifndef ELEM
#define ELEM 0
#endif
#ifndef BS
#define BS 32
#endif
#ifndef SC
#define SC 0
#endif
#ifndef XT
#define XT 0
#endif
#ifndef ACC
#define ACC 0
#endif
#ifndef CINV_BITS
#define CINV_BITS 0x3db504f3u
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef UNR
#define UNR 1
#endif

// The E4M3 encode's and the lean decodes' (FAST below) launch bound: RESIDENT CUDA blocks
// an SM must hold at once (mx_gpu passes it and sizes the grid to one wave of them; 8 of
// 256 threads: 32 registers). The other kernels leave registers to ptxas.
#ifndef RESIDENT
#define RESIDENT 8
#endif
#if OP == 1 && SC
#define ENC_BOUNDS __launch_bounds__(THREADS, RESIDENT)
#else
#define ENC_BOUNDS __launch_bounds__(THREADS)  // (a minimum of 1 would change ptxas' choices)
#endif

#if OP == 2 && !ACC && XT != 1
#define DEC_BOUNDS __launch_bounds__(THREADS, RESIDENT)
#else
#define DEC_BOUNDS __launch_bounds__(THREADS)
#endif

#if THREADS % 32 != 0
#error "THREADS must be a multiple of 32"
#endif

typedef unsigned int u32;
typedef unsigned char u8;
typedef long long i64;

#if ELEM == 0
#define EBITS 2
#define MBITS 1
#define BIAS 1
#define QMAX_BITS 0x40c00000u  // 6
#define QMAX_VAL 6.0
#define EMAX 2
#elif ELEM == 1
#define EBITS 3
#define MBITS 2
#define BIAS 3
#define QMAX_BITS 0x41e00000u  // 28
#define QMAX_VAL 28.0
#define EMAX 4
#else
#define EBITS 2
#define MBITS 3
#define BIAS 1
#define QMAX_BITS 0x40f00000u  // 7.5
#define QMAX_VAL 7.5
#define EMAX 2
#endif
#define CBITS (1 + EBITS + MBITS)  // bits per code: 4 or 6
#define BPB (BS * CBITS / 8)       // code bytes per block (group)

// The E4M3 encode of a 16-bit x keeps the loaded words (two elements each: fewer
// registers) and takes each element out of its word where it is used; with FP4 a lane
// takes 16 elements (a whole NVFP4 block), so the block's scale arithmetic is done once.
#define E4M3_WORDS (OP == 1 && XT != 0 && SC == 1)

#if OP == 4 || OP == 5
#define EPL 32  // elements per lane: one run of 32 of the energy
#elif E4M3_WORDS
#define EPL 16
#else
#define EPL (CBITS == 4 ? 8 : 16)
#endif
#define WPL (EPL * CBITS / 32)  // code words per lane
#define LPB (BS / EPL)          // lanes per block (group)

// The bfloat16 encode with E8M0 scales keeps x's elements as loaded, two to a 32-bit word,
// and computes both elements' codes with each instruction (bf16x2 and 16x2 integer ops).
// Its add.bf16x2 and mul.bf16x2 need sm_90; older GPUs run the float32 path (same bytes).
#if defined(MX_HOST) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define PAIRS (OP == 1 && XT == 2 && SC == 0)
#else
#define PAIRS 0
#endif

#define BITS_NAN 0x7fc00000u
#define BITS_INF 0x7f800000u
#define BITS_ONE 0x3f800000u
#define BITS_FLT_MAX 0x7f7fffffu
#define BITS_MIN_NORMAL 0x00800000u
#define BITS_448 0x43e00000u
#define BITS_LAMBDA 0x358637bdu  // 1e-6f
#define BITS_1EM3 0x3a83126fu    // 1e-3f
#define BITS_1E3 0x447a0000u     // 1e3f
#define E8M0_NAN 0xffu
#define E4M3_NAN 0x7fu
#define FULL 0xffffffffu

#ifdef MX_HOST
#define DEV static inline
DEV float as_f(u32 u) { float f; memcpy(&f, &u, 4); return f; }
DEV u32 as_u(float f) { u32 u; memcpy(&u, &f, 4); return u; }
DEV float f_add(float a, float b) { return a + b; }
DEV float f_sub(float a, float b) { return a - b; }
DEV float f_mul(float a, float b) { return a * b; }
DEV float f_div(float a, float b) { return a / b; }
DEV float f_sqrt(float a) { return sqrtf(a); }
DEV float f_fma(float a, float b, float c) { return fmaf(a, b, c); }
DEV double d_of(float f) { return (double)f; }
DEV float f_of(double d) { return (float)d; }
DEV double d_mul(double a, double b) { return a * b; }
DEV double d_fma(double a, double b, double c) { return fma(a, b, c); }
DEV float rcp_approx(float a) { return 1.0f / a; }  // an approximation within 1 ulp
DEV float f_min_nan(float a, float b) { return a != a || b != b ? as_f(BITS_NAN) : fminf(a, b); }
DEV float f_max_nan(float a, float b) { return a != a || b != b ? as_f(BITS_NAN) : fmaxf(a, b); }
DEV float h2f(u32 h) {  // exact float16 -> float32
  u32 sign = (h & 0x8000u) << 16, a = h & 0x7fffu;
  if (a >= 0x7c00u) return as_f(sign | 0x7f800000u | ((a & 0x3ffu) << 13));
  return as_f(sign | as_u(f_mul(as_f(a << 13), as_f(0x77800000u))));  // * 2^112
}
DEV u32 f2h(float f) {  // RNE with subnormals and overflow to Inf, NaN -> 0x7fff
  u32 u = as_u(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) return sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10));
  float t = f_add(f_mul(as_f(a), as_f(0x4b800000u)), as_f(0x4b400000u));
  return sign | (as_u(t) - 0x4b400000u);
}
#else
#define DEV __device__ __forceinline__
DEV float as_f(u32 u) { return __uint_as_float(u); }
DEV u32 as_u(float f) { return __float_as_uint(f); }
DEV float f_add(float a, float b) { float d; asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_sub(float a, float b) { float d; asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_mul(float a, float b) { float d; asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_div(float a, float b) { float d; asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_sqrt(float a) { float d; asm("sqrt.rn.f32 %0, %1;" : "=f"(d) : "f"(a)); return d; }
DEV float f_fma(float a, float b, float c) {
  float d;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}
// float <-> double without .ftz (CuPy's -ftz=true would flush subnormals in a plain cast)
DEV double d_of(float f) { double d; asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(f)); return d; }
DEV float f_of(double d) { float f; asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(d)); return f; }
DEV double d_mul(double a, double b) { double d; asm("mul.rn.f64 %0, %1, %2;" : "=d"(d) : "d"(a), "d"(b)); return d; }
DEV double d_fma(double a, double b, double c) {
  double d;
  asm("fma.rn.f64 %0, %1, %2, %3;" : "=d"(d) : "d"(a), "d"(b), "d"(c));
  return d;
}
// Within an ulp of 1 / a where a and 1 / a are normal floats (the only use; .ftz: one MUFU)
DEV float rcp_approx(float a) { float d; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(a)); return d; }
// min and max that return NaN if either operand is (sm_80)
DEV float f_min_nan(float a, float b) { float d; asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_max_nan(float a, float b) { float d; asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float h2f(u32 h) {
  float f;
  unsigned short s = (unsigned short)h;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
  return f;
}
DEV u32 f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return (u32)h;
}
#endif

DEV u32 umax(u32 a, u32 b) { return a > b ? a : b; }
DEV bool aligned(const void* p, unsigned a) { return ((unsigned long long)p & (a - 1)) == 0; }

// ------------------------------------------------------------ pairs of bfloat16
// A word holds two bfloat16 values, the first in the low half. bf2_mul and bf2_add round to
// nearest even and keep subnormals (the bf16x2 instructions have no .ftz); bf2_amax: the
// larger |a|, |b| of each half, NaN if either is (its sign bit junk); bf2_max_abs and
// bf2_min_abs: max(|a|, |b|) and min(|a|, |b|) with the sign of a ^ b, for non-NaN
// inputs (the encode uses them on finite values only).
#ifdef MX_HOST
DEV double bf_value(u32 h) { return (double)as_f(h << 16); }
DEV u32 bf_round(double r) {  // r (exact, or within half an ulp of a double) to bfloat16
  if (r != r) return 0x7fc0u;
  const double a = fabs(r);
  const double ulp = a >= 0x1p-126 ? ldexp(1.0, ilogb(a) - 7) : 0x1p-133;
  const float q = (float)(nearbyint(a / ulp) * ulp);  // exact: at most 9 significant bits
  return (as_u(q) >> 16) | (std::signbit(r) ? 0x8000u : 0u);
}
template <class F> DEV u32 halves(u32 a, u32 b, F f) {
  return (f(a & 0xffffu, b & 0xffffu) & 0xffffu) | (f(a >> 16, b >> 16) << 16);
}
DEV u32 bf2_mul(u32 a, u32 b) {
  return halves(a, b, [](u32 x, u32 y) { return bf_round(bf_value(x) * bf_value(y)); });
}
DEV u32 bf2_add(u32 a, u32 b) {
  return halves(a, b, [](u32 x, u32 y) { return bf_round(bf_value(x) + bf_value(y)); });
}
DEV u32 bf2_amax(u32 a, u32 b) {
  return halves(a, b, [](u32 x, u32 y) {
    const u32 mx = x & 0x7fffu, my = y & 0x7fffu;
    return mx > 0x7f80u || my > 0x7f80u ? 0x7fffu : ((x ^ y) & 0x8000u) | umax(mx, my);
  });
}
DEV u32 bf2_max_abs(u32 a, u32 b) {
  return halves(a, b, [](u32 x, u32 y) { return ((x ^ y) & 0x8000u) | umax(x & 0x7fffu, y & 0x7fffu); });
}
DEV u32 bf2_min_abs(u32 a, u32 b) {
  return halves(a, b, [](u32 x, u32 y) {
    const u32 mx = x & 0x7fffu, my = y & 0x7fffu;
    return ((x ^ y) & 0x8000u) | (mx < my ? mx : my);
  });
}
DEV u32 mulhi(u32 a, u32 b) { return (u32)(((unsigned long long)a * b) >> 32); }
DEV u32 prmt_sx(u32 a, u32 b, u32 sel) {  // prmt.b32: a selector nibble's bit 3 replicates
  const unsigned long long v = ((unsigned long long)b << 32) | a;  // the byte's top bit
  u32 r = 0;
  for (int i = 0; i < 4; ++i) {
    const u32 s = (sel >> (4 * i)) & 15u, byte = (u32)(v >> (8 * (s & 7u))) & 0xffu;
    r |= (s & 8u ? (byte >> 7) * 0xffu : byte) << (8 * i);
  }
  return r;
}
DEV u32 prmt(u32 a, u32 b, u32 sel) {  // __byte_perm: bytes of {b, a}, no sign replication
  const unsigned long long v = ((unsigned long long)b << 32) | a;
  u32 r = 0;
  for (int i = 0; i < 4; ++i) r |= (u32)((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
#else
DEV u32 bf2_mul(u32 a, u32 b) { u32 d; asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 bf2_add(u32 a, u32 b) { u32 d; asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 bf2_amax(u32 a, u32 b) { u32 d; asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 bf2_max_abs(u32 a, u32 b) { u32 d; asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 bf2_min_abs(u32 a, u32 b) { u32 d; asm("min.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 mulhi(u32 a, u32 b) { return __umulhi(a, b); }
DEV u32 prmt(u32 a, u32 b, u32 sel) { return __byte_perm(a, b, sel); }
DEV u32 prmt_sx(u32 a, u32 b, u32 sel) { u32 d; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel)); return d; }
#endif

// ------------------------------------------------------------ elements in and out
DEV u32 load_bits(const void* x, i64 e) {  // element e of x as float32 bits (exact)
#if XT == 0
  return ((const u32*)x)[e];
#elif XT == 1
  return as_u(h2f(((const unsigned short*)x)[e]));
#else
  return (u32)((const unsigned short*)x)[e] << 16;
#endif
}

DEV u32 half_bits(u32 h) {  // a 16-bit element (low bits of h) as float32 bits
#if XT == 1
  return as_u(h2f(h & 0xffffu));
#else
  return h << 16;
#endif
}

// The lane's chunk, elements [e0, e0 + EPL), as float32 bits (zero past count); `vec`: x is
// 16-byte aligned (so is every chunk: EPL elements are a multiple of 16 bytes).
DEV void load_chunk(const void* x, i64 e0, i64 count, bool vec, u32* b) {
  if (vec && e0 + EPL <= count) {
#if XT == 0
    const uint4* p = (const uint4*)((const u32*)x + e0);
    for (int q = 0; q < EPL / 4; ++q) {
      const uint4 t = __ldg(p + q);
      b[4 * q] = t.x, b[4 * q + 1] = t.y, b[4 * q + 2] = t.z, b[4 * q + 3] = t.w;
    }
#else
    const uint4* p = (const uint4*)((const unsigned short*)x + e0);
    for (int q = 0; q < EPL / 8; ++q) {
      const uint4 t = __ldg(p + q);
      const u32 w[4] = {t.x, t.y, t.z, t.w};
      for (int i = 0; i < 4; ++i) {
        b[8 * q + 2 * i] = half_bits(w[i]);
        b[8 * q + 2 * i + 1] = half_bits(w[i] >> 16);
      }
    }
#endif
  } else {
    for (int i = 0; i < EPL; ++i) b[i] = e0 + i < count ? load_bits(x, e0 + i) : 0u;
  }
}

#if PAIRS || E4M3_WORDS
// The lane's chunk as EPL / 2 words of two 16-bit elements, as they lie in x (zero past
// count); `vec` as load_chunk's.
DEV void load_pairs(const void* x, i64 e0, i64 count, bool vec, u32* w) {
  const unsigned short* h = (const unsigned short*)x + e0;
  if (vec && e0 + EPL <= count) {
    for (int q = 0; q < EPL / 8; ++q) {
      const uint4 t = __ldg((const uint4*)h + q);
      w[4 * q] = t.x, w[4 * q + 1] = t.y, w[4 * q + 2] = t.z, w[4 * q + 3] = t.w;
    }
  } else {
    for (int k = 0; k < EPL / 2; ++k) {
      const i64 e = e0 + 2 * k;
      w[k] = (e < count ? (u32)h[2 * k] : 0u) | (e + 1 < count ? (u32)h[2 * k + 1] << 16 : 0u);
    }
  }
}
#endif

DEV u32 f2bf(float f) {  // RNE, NaN -> 0x7fff
  u32 u = as_u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

DEV u32 out_bits(float y) {  // y in out's element type (16 or 32 bits)
#if XT == 0
  return as_u(y);
#elif XT == 1
  return f2h(y);
#else
  return f2bf(y);
#endif
}

// Two values in out's 16-bit type, the first in the low half. bfloat16 on the GPU: one
// cvt.rn.bf16x2.f32 (round to nearest even, subnormals kept: the instruction has no .ftz;
// a NaN may come out with other bits than f2bf's 0x7fff, FORMAT.md fixes NaN-ness only).
DEV u32 out_pair(float lo, float hi) {
#if XT == 2 && !defined(MX_HOST)
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return out_bits(lo) | (out_bits(hi) << 16);
#endif
}

DEV void store_out(void* out, i64 e, float y) {
#if ACC
  ((float*)out)[e] = f_add(((float*)out)[e], y);  // ACC needs a float32 out
#elif XT == 0
  ((float*)out)[e] = y;
#else
  ((unsigned short*)out)[e] = (unsigned short)out_bits(y);
#endif
}

// The lane's decoded values y[0..EPL) to out[e0..), the first count only; `vec`: out is
// 16-byte aligned.
DEV void store_chunk(void* out, i64 e0, i64 count, bool vec, const float* y) {
  if (vec && e0 + EPL <= count) {
#if ACC || XT == 0
    uint4* p = (uint4*)((u32*)out + e0);
    for (int q = 0; q < EPL / 4; ++q) {
      u32 w[4];
      for (int i = 0; i < 4; ++i) w[i] = as_u(y[4 * q + i]);
#if ACC
      const uint4 o = p[q];
      const u32 ow[4] = {o.x, o.y, o.z, o.w};
      for (int i = 0; i < 4; ++i) w[i] = as_u(f_add(as_f(ow[i]), as_f(w[i])));
#endif
      p[q] = make_uint4(w[0], w[1], w[2], w[3]);
    }
#else
    uint4* p = (uint4*)((unsigned short*)out + e0);
    for (int q = 0; q < EPL / 8; ++q) {
      u32 w[4];
      for (int i = 0; i < 4; ++i) w[i] = out_pair(y[8 * q + 2 * i], y[8 * q + 2 * i + 1]);
      p[q] = make_uint4(w[0], w[1], w[2], w[3]);
    }
#endif
  } else {
    for (int i = 0; i < EPL; ++i)
      if (e0 + i < count) store_out(out, e0 + i, y[i]);
  }
}

DEV u32 ld32(const u8* p) {
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

DEV void st32(u8* p, u32 v) {
  p[0] = (u8)v;
  p[1] = (u8)(v >> 8);
  p[2] = (u8)(v >> 16);
  p[3] = (u8)(v >> 24);
}

// The lane's WPL code words at p (little-endian bytes); `al`: the payload's alignment (the
// words of a lane start at a multiple of 4 * WPL bytes from it).
DEV void store_words(u8* p, const u32* w, unsigned al) {
  if (WPL % 4 == 0 && al >= 16) {
    for (int q = 0; q < WPL / 4; ++q)
      ((uint4*)p)[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
  } else if (al >= 4) {
    for (int q = 0; q < WPL; ++q) ((u32*)p)[q] = w[q];
  } else {
    for (int q = 0; q < WPL; ++q) st32(p + 4 * q, w[q]);
  }
}

DEV void load_words(const u8* p, u32* w, unsigned al) {
  if (WPL % 4 == 0 && al >= 16) {
    for (int q = 0; q < WPL / 4; ++q) {
      const uint4 t = __ldg((const uint4*)p + q);
      w[4 * q] = t.x, w[4 * q + 1] = t.y, w[4 * q + 2] = t.z, w[4 * q + 3] = t.w;
    }
  } else if (al >= 4) {
    for (int q = 0; q < WPL; ++q) w[q] = __ldg((const u32*)p + q);
  } else {
    for (int q = 0; q < WPL; ++q) w[q] = ld32(p + 4 * q);
  }
}

DEV unsigned alignment(const void* p) { return aligned(p, 16) ? 16u : (aligned(p, 4) ? 4u : 1u); }

// Codes c[0..EPL) into WPL words (FORMAT.md: FP4 two per byte, low nibble first; FP6 four
// per three bytes, little-endian 24-bit words), and back.
DEV void pack_words(const u32* c, u32* w) {
  for (int q = 0; q < WPL; ++q) w[q] = 0;
  for (int i = 0; i < EPL; ++i) {
    const int bit = CBITS * i;
    w[bit >> 5] |= c[i] << (bit & 31);
    if ((bit & 31) + CBITS > 32) w[(bit >> 5) + 1] |= c[i] >> (32 - (bit & 31));
  }
}

DEV u32 code_at(const u32* w, int i) {
  const int bit = CBITS * i;
  u32 v = w[bit >> 5] >> (bit & 31);
  if ((bit & 31) + CBITS > 32) v |= w[(bit >> 5) + 1] << (32 - (bit & 31));
  return v & ((1u << CBITS) - 1u);
}

// The largest of v over the LPB lanes of the lane's block (group); every lane gets it.
DEV u32 group_max(u32 v) {
  for (int h = 1; h < LPB; h <<= 1) v = umax(v, __shfl_xor_sync(FULL, v, h));
  return v;
}

// ------------------------------------------------------------ minifloat conversions
// Saturating RNE of float32 bits to a minifloat code (FORMAT.md; minifloat.bits_to_code) in
// few integer operations (the integer pipe is what limits an encode; the emulation test
// compares it with the direct rounding, tests/cuda_emulation/mx_launch.cpp's to_code):
// |v| (`a`, clamped to qmax) is rounded to its binade's code step by the float add of
// 2^23 steps (add.rn without .ftz: nearest, ties to even, subnormals kept), whose low
// bits are then round(|v| / step); below the smallest normal binade (biased exponent
// e0 = 128 - bias) the step is the subnormals'. A round up into the next binade carries
// into the code's exponent field. The magnitude's code, no sign; any format of mb <= 3
// mantissa bits and qmax below 2^24 steps.
DEV u32 code_magic(u32 a, u32 qmax_bits, u32 e0, u32 mb) {
  const u32 ac = a < qmax_bits ? a : qmax_bits;
  const u32 ex = umax(ac >> 23, e0);  // the binade's biased exponent
  const u32 f = as_u(f_add(as_f(ac), as_f((ex + (23 - mb)) << 23)));  // + 2^23 code steps
  // (f - that addend's bits) + ((ex - e0) << mb), as one multiply-add and a constant
  return f + ex * ((1u << mb) - (1u << 23)) - (((23 - mb) << 23) + (e0 << mb));
}

// The element code of |v| (`a`), with the sign of `bits`.
DEV u32 elem_code_abs(u32 a, u32 bits) {
  const u32 code = code_magic(a, QMAX_BITS, 128 - BIAS, MBITS);  // below the sign bit: + is |
  return code + ((bits >> (31 - EBITS - MBITS)) & (1u << (EBITS + MBITS)));
}

// The E4M3 code of v >= 0 (saturating RNE, subnormals kept).
DEV u32 e4m3_code(float v) { return code_magic(as_u(v), BITS_448, 121, 3); }

DEV u32 elem_code(u32 bits) { return elem_code_abs(bits & 0x7fffffffu, bits); }

// 2^k as float32, -149 <= k <= 127 (subnormal below -126).
DEV float pow2(int k) { return k >= -126 ? as_f((u32)(k + 127) << 23) : as_f(1u << (k + 149)); }

// The exact value of an element code: its magnitude bits placed at the top of a float32's
// mantissa read as a float (a subnormal for exponent 0) times 2^(127 - BIAS), exactly.
DEV float elem_value(u32 c) {
  const u32 sign = (c >> (EBITS + MBITS)) << 31;
  const u32 mag = (c & ((1u << (EBITS + MBITS)) - 1u)) << (23 - MBITS);
  return as_f(as_u(f_mul(as_f(mag), as_f((u32)(254 - BIAS) << 23))) | sign);
}

DEV float e4m3_value(u32 c) {  // exact; the NaN codes give NaN
  if ((c & 0x7fu) == E4M3_NAN) return as_f(BITS_NAN);
  const u32 sign = (c >> 7) << 31;
  const u32 e = (c >> 3) & 15u, m = c & 7u;
  const float mag = e == 0 ? f_mul((float)m, pow2(-9)) : as_f(((e + 120u) << 23) | (m << 20));
  return as_f(as_u(mag) | sign);
}

DEV float sat_inf(float y) {  // ±Inf -> ±FLT_MAX, NaN stays NaN
  const u32 u = as_u(y);
  return (u & 0x7fffffffu) == BITS_INF ? as_f((u & 0x80000000u) | BITS_FLT_MAX) : y;
}

DEV u32 lane_amax(const u32* b) {
  u32 m = 0;
  for (int i = 0; i < EPL; ++i) m = umax(m, b[i] & 0x7fffffffu);
  return m;
}

DEV int floor_log2_bits(u32 a) {  // a > 0, finite
  if (a >= BITS_MIN_NORMAL) return (int)(a >> 23) - 127;
  int n = 0;
  while (a >> (n + 1)) ++n;
  return n - 149;
}

// The largest of every thread's m in the CUDA block (red: THREADS / 32 shared words).
DEV u32 block_max(u32 m, u32* red) {
  for (int h = 16; h > 0; h >>= 1) m = umax(m, __shfl_xor_sync(FULL, m, h));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  u32 r = 0;
  for (int w = 0; w < THREADS / 32; ++w) r = umax(r, red[w]);
  return r;
}
