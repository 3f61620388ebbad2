// coccl GPU codec kernels: taco (FP8 + Walsh-Hadamard) and int8, bit-exact with FORMAT.md.
//
// Part 1 of 5 of one source (gpu_kernels.CODEC_SOURCES: this file, then
// codec_tile_helpers.cu, codec_encode_kernels.cu, codec_epl_kernels.cu and
// codec_decode_kernels.cu), compiled once per variant by compressors/gpu_kernels.py (NVRTC
// through cupy.RawModule) with -D defines; every variant defines exactly one kernel,
// `coccl_codec(const void* src, void* dst, long long count, long long K)`. This part holds
// the defines, the float32 arithmetic and the conversions (16-bit outputs, input elements,
// FP8); codec_tile_helpers.cu the memory and cross-lane helpers. The int and tah kernels
// are compiled after those two alone, with OP=0; the codec kernels are in the other three.
//
//   OP      1 taco encode (32 elements per lane), 2 taco decode, 3 int8 encode,
//           4 int8 decode, 5 int8 encode (any group size), 6 int8 decode (any group
//           size), 7 taco encode (EPL elements per lane, the default), 8 taco ring hop
//           (encode(own + decode(payload)) in one pass; five arguments, see the kernel),
//           9 int8 ring hop (the same for int8), 10 taco ring hop (kernel 8 with EPL
//           elements per lane, kernel 7's layout)
//   DEC     ring hops (8, 9, 10): 1 adds a fourth pointer argument, dec, after dst, and the
//           kernel also writes dec = decode(dst) (`count` elements of type XT), bitwise
//           what the decode kernel makes of dst
//   GS      group size G (taco: 32..512; int8 fast kernels: 32..1024; all powers of two)
//   XT      element type of x (encode) or out (decode): 0 float32, 1 float16, 2 bfloat16
//   FMT     taco: 0 e4m3, 1 e5m2
//   ASH, DUAL   taco switches (0/1)
//   ACC     decode: add into a float32 out (1) or overwrite (0)
//   CINV_BITS   taco: bits of (float)(1/sqrt(G)) computed in double (FORMAT.md)
//   STAGE   1: coalesced global accesses staged through shared memory; 0: each lane
//           accesses its own 32 consecutive elements with 16-byte vectors
//   THREADS threads per block (multiple of 32)
//   MIN_BLOCKS  __launch_bounds__ minimum blocks per SM (sizes the register budget)
//   SW_CVT  1: use the software conversions even where the hardware has instructions
//           (so that a test can compare the two on one GPU)
//   RAW_CHECK  taco encode with ash: 1 looks for NaN/Inf in every group's elements;
//           0 (default) only in groups whose energy is not finite (the same result)
//   EPL     taco encode kernel 7 and hop kernel 10: elements per lane (32..128, at most G)
//   EXT     taco encode with DUAL: 1 (default) lets a group whose s would leave COCCL's
//           clamps take the extended range (FORMAT.md taco step 4b); 0 keeps COCCL's
//           clamps for every group (the codec's coccl_clamps option). Decoding needs no
//           switch: an extended group is marked by its stored alpha.
//
// Arithmetic: FORMAT.md requires IEEE float32 with round-to-nearest-even, no FMA
// contraction and no flush of subnormals. CuPy appends -ftz=true to every compile, which
// turns __fmul_rn, fmaxf, __fdiv_rn... into their .ftz forms, so every float operation
// here is inline PTX without .ftz (add.rn/mul.rn/div.rn/sqrt.rn are never contracted),
// and float comparisons are done on the bits. No CUDA header is included.
//
// Layout of the fast kernels: a warp works on tiles of 1024 consecutive elements; lane l
// holds elements [32 l, 32 l + 32) of the tile in registers, so a group of G elements lives
// in G/32 consecutive lanes. The Hadamard stages h = 1..16 run in registers, the stages
// h = 32.. across lanes with shuffles; the energy is each lane's sequential sum of its 32
// squares followed by the xor butterfly across the group's lanes, which is FORMAT.md's
// pairwise tree. With STAGE=1 the tile is read and written with fully coalesced 16-byte
// accesses through a per-warp shared-memory buffer (xor-swizzled, no bank conflicts).
// The taco decode's whole tiles (taco_decode_tiles_t) instead transpose the values between
// the stages h = 16 and h = 32, so that those across lanes run in registers too.
//
// The same file also compiles as plain C++ (no __CUDA_ARCH__) against a small host
// emulation of the CUDA built-ins, which is how the software paths were checked; on the
// GPU the paths under `#if __CUDA_ARCH__ >= 890` / `>= 800` use the hardware conversions.

#ifndef OP
#error "OP must be defined"
#endif
#ifndef GS
#define GS 128
#endif
#ifndef XT
#define XT 0
#endif
#ifndef FMT
#define FMT 0
#endif
#ifndef ASH
#define ASH 1
#endif
#ifndef DUAL
#define DUAL 1
#endif
#ifndef ACC
#define ACC 0
#endif
#ifndef DEC
#define DEC 0
#endif
#ifndef CINV_BITS
#define CINV_BITS 0x3db504f3u
#endif
#ifndef PREFETCH
#define PREFETCH 0  // encode: load the next tile before computing this one (no staging)
#endif
#ifndef STAGE
#define STAGE 1
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef SW_CVT
#define SW_CVT 0
#endif
#ifndef RAW_CHECK
#define RAW_CHECK 0  // taco encode with ash: check every group's elements for NaN/Inf
#endif
#ifndef EXT
#define EXT 1  // taco encode: the extended range (0: COCCL's clamps, bit for bit)
#endif

// Hardware conversions: FP8 on sm_89+, packed bf16x2/f16x2 on sm_80+.
#if defined(__CUDA_ARCH__) && !SW_CVT && __CUDA_ARCH__ >= 890
#define HW_FP8 1
#else
#define HW_FP8 0
#endif
#if defined(__CUDA_ARCH__) && !SW_CVT && __CUDA_ARCH__ >= 800
#define HW_CVT2 1
#else
#define HW_CVT2 0
#endif

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define DEV __device__ __forceinline__
#define FULL_MASK 0xffffffffu

#define WARPS (THREADS / 32)
#define EB (XT == 0 ? 4 : 2)      // bytes per element of x / out
#define NW (8 * EB)               // 32-bit words holding a lane's 32 elements
#define CPL (2 * EB)              // 16-byte chunks holding a lane's 32 elements
#define LPG (GS / 32)             // lanes per group (fast kernels)

#if XT == 0
#define INF_BITS 0x7f800000u
#elif XT == 1
#define INF_BITS 0x7c00u
#else
#define INF_BITS 0x7f80u
#endif

#if FMT == 0
#define QMAX_BITS 0x43e00000u  // 448
#else
#define QMAX_BITS 0x47600000u  // 57344
#endif

#define BITS_NAN 0x7fc00000u
#define BITS_LAMBDA 0x358637bdu  // 1e-6f
#define BITS_1EM3 0x3a83126fu    // 1e-3f
#define BITS_1E3 0x447a0000u     // 1e3f
#define BITS_1EM12 0x2b8cbcccu   // 1e-12f
#define BITS_1E6 0x49742400u     // 1e6f
#define BITS_127 0x42fe0000u     // 127.0f
#define BITS_ONE 0x3f800000u     // 1.0f
#define BITS_MAGIC 0x4b400000u   // 12582912.0f = 1.5 * 2^23
#define BITS_INF 0x7f800000u
#define BITS_FLT_MAX 0x7f7fffffu
#define BITS_2M128 0x00200000u   // 2^-128 (subnormal): int8 scales up to it take step 4
#define EXT_SHIFT 116            // taco step 4b scales by 2^p, |p| <= 116

__host__ __device__ constexpr int ilog2(int v) { return v <= 1 ? 0 : 1 + ilog2(v >> 1); }
#define LOG2_GS ilog2(GS)

// ------------------------------------------------------------------ bit casts
DEV float as_f(u32 u) { return __uint_as_float(u); }
DEV u32 as_u(float f) { return __float_as_uint(f); }

// ------------------------------------------------- float32 arithmetic (RNE, no FTZ)
#if defined(__CUDA_ARCH__)
DEV float f_add(float a, float b) { float d; asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_sub(float a, float b) { float d; asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_mul(float a, float b) { float d; asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_fma(float a, float b, float c) { float d; asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c)); return d; }
DEV float f_div(float a, float b) { float d; asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_sqrt(float a) { float d; asm("sqrt.rn.f32 %0, %1;" : "=f"(d) : "f"(a)); return d; }
DEV float f_max(float a, float b) { float d; asm("max.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_min(float a, float b) { float d; asm("min.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
DEV float f_abs(float a) { float d; asm("abs.f32 %0, %1;" : "=f"(d) : "f"(a)); return d; }
// cvt.rni.s32.f32: round half to even; NaN -> 0; out of range saturates.
DEV int f2i_rn(float a) { int d; asm("cvt.rni.s32.f32 %0, %1;" : "=r"(d) : "f"(a)); return d; }
DEV float h2f(u32 h) {
  float f;
  unsigned short s = (unsigned short)h;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
  return f;
}
#else
// Host emulation (compile with -ffp-contract=off and SSE math): plain IEEE float32.
DEV float f_add(float a, float b) { return a + b; }
DEV float f_sub(float a, float b) { return a - b; }
DEV float f_mul(float a, float b) { return a * b; }
DEV float f_fma(float a, float b, float c) { return fmaf(a, b, c); }
DEV float f_div(float a, float b) { return a / b; }
DEV float f_sqrt(float a) { return sqrtf(a); }
DEV float f_max(float a, float b) { return fmaxf(a, b); }
DEV float f_min(float a, float b) { return fminf(a, b); }
DEV float f_abs(float a) { return as_f(as_u(a) & 0x7fffffffu); }
DEV int f2i_rn(float a) {
  if (a != a) return 0;
  if (a >= 2147483648.0f) return 2147483647;
  if (a < -2147483648.0f) return (int)0x80000000u;
  return (int)nearbyintf(a);
}
DEV float h2f(u32 h) {  // exact float16 -> float32
  u32 sign = (h & 0x8000u) << 16, a = h & 0x7fffu;
  if (a >= 0x7c00u) return as_f(sign | 0x7f800000u | ((a & 0x3ffu) << 13));
  return as_f(sign | as_u(f_mul(as_f(a << 13), as_f(0x77800000u))));  // * 2^112
}
#endif

// ------------------------------------------------- range helpers (FORMAT.md)
// Comparisons of non-negative floats are done on their bits (the same order).
DEV float next_up(float a) { return as_f(as_u(a) + 1u); }    // a >= 0, finite
DEV float next_down(float a) { return as_f(as_u(a) - 1u); }  // a > 0

// The fitted scale of a group with absmax amax > 0 (int8 step 4, taco step 4b without
// ash): amax / qmax, one float32 step up if that rounding left amax / s above qmax (or
// underflowed to 0), else one step down if qmax * s overflows.
DEV float fit_scale(float amax, float qmax) {
  float s = f_div(amax, qmax);
  if (as_u(s) == 0u || as_u(f_div(amax, s)) > as_u(qmax))
    s = next_up(s);
  else if (as_u(f_mul(s, qmax)) == BITS_INF)
    s = next_down(s);
  return s;
}

// ±Inf -> ±FLT_MAX, NaN stays NaN (taco decode of an extended group).
DEV float sat_inf(float y) {
  const u32 u = as_u(y);
  return (u & 0x7fffffffu) == BITS_INF ? as_f((u & 0x80000000u) | BITS_FLT_MAX) : y;
}

// Whether a stored alpha (bits) marks an extended taco group: positive (+Inf included,
// NaN not) and outside [1e-3, 1e3].
DEV bool extended_alpha(u32 a) {
  return (a != 0u && a < BITS_1EM3) || (a > BITS_1E3 && a <= BITS_INF);
}

// ------------------------------------------------------- float32 -> 16-bit outputs
DEV u32 f2bf_sw(float f) {  // RNE, NaN -> 0x7fff (what cvt.rn.bf16.f32 gives)
  u32 u = as_u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

DEV u32 f2h_sw(float f) {  // RNE with subnormals and overflow to Inf, NaN -> 0x7fff
  u32 u = as_u(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf
  if (a >= 0x38800000u) {                        // >= 2^-14: normal half
    u32 r = (a + 0xfffu + ((a >> 13) & 1u)) >> 13;
    return sign | (r - (112u << 10));
  }
  // subnormal half: m = RNE(|f| * 2^24), exact scaling then rounding via the magic add
  float t = f_add(f_mul(as_f(a), as_f(0x4b800000u)), as_f(BITS_MAGIC));
  return sign | (as_u(t) - BITS_MAGIC);
}

DEV u32 pack_out2(float lo, float hi) {  // two outputs of type XT (XT != 0) in one word
#if XT == 2
#if HW_CVT2
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return f2bf_sw(lo) | (f2bf_sw(hi) << 16);
#endif
#else
#if HW_CVT2
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#elif defined(__CUDA_ARCH__) && !SW_CVT
  unsigned short a, b;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(a) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(hi));
  return (u32)a | ((u32)b << 16);
#else
  return f2h_sw(lo) | (f2h_sw(hi) << 16);
#endif
#endif
}

DEV u32 out_bits1(float f) {  // one output element of type XT, as raw bits
#if XT == 0
  return as_u(f);
#elif XT == 2
  return pack_out2(f, 0.0f) & 0xffffu;
#else
  return pack_out2(f, 0.0f) & 0xffffu;
#endif
}

// A lane's 32 output values v as raw words of type XT (little-endian pairs for 16 bits).
DEV void pack_out32(const float* v, u32* ow) {
#if XT == 0
#pragma unroll
  for (int r = 0; r < 32; ++r) ow[r] = as_u(v[r]);
#else
#pragma unroll
  for (int i = 0; i < 16; ++i) ow[i] = pack_out2(v[2 * i], v[2 * i + 1]);
#endif
}

// A lane's 32 output values v of type XT at elements [base, base + 32) of ob, those below
// count: 16-byte vectors when ob is aligned and the 32 all exist, else one by one. The
// decode kernels' unstaged store and the ring hops' decoded output (DEC) share it.
DEV void store_out32(char* ob, i64 base, i64 count, bool vout, const float* v) {
  if (vout && base + 32 <= count) {
    u32 ow[NW];
    pack_out32(v, ow);
    uint4* o = (uint4*)(ob + base * EB);
#pragma unroll
    for (int j = 0; j < CPL; ++j)
      o[j] = make_uint4(ow[4 * j], ow[4 * j + 1], ow[4 * j + 2], ow[4 * j + 3]);
  } else {
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      if (base + r < count) {
#if XT == 0
        ((float*)ob)[base + r] = v[r];
#else
        ((unsigned short*)ob)[base + r] = (unsigned short)out_bits1(v[r]);
#endif
      }
    }
  }
}

// ------------------------------------------------------- input elements -> float32
// w: the lane's 32 elements as raw words (little-endian: element 2k in the low half).
DEV float elem_f32(const u32* w, int r) {
#if XT == 0
  return as_f(w[r]);
#elif XT == 2
  return as_f((r & 1) ? (w[r >> 1] & 0xffff0000u) : (w[r >> 1] << 16));
#else
  return h2f((r & 1) ? (w[r >> 1] >> 16) : (w[r >> 1] & 0xffffu));
#endif
}

// The largest |x| of a lane's N raw elements, still as the element's own bits (exact:
// for non-negative floats the integer order is the value order).
template <int N = 32>
DEV u32 raw_absmax(const u32* w) {
#if XT == 0
  u32 m = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) m = max(m, w[i] & 0x7fffffffu);
  return m;
#else
  u32 m = 0;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) m = __vmaxu2(m, w[i] & 0x7fff7fffu);
  return max(m & 0xffffu, m >> 16);
#endif
}

DEV float raw_to_f32(u32 b) {  // raw element bits (as from raw_absmax) -> float32
#if XT == 0
  return as_f(b);
#elif XT == 2
  return as_f(b << 16);
#else
  return h2f(b);
#endif
}

DEV u32 load_elem_raw(const char* xb, i64 e) {
#if XT == 0
  return *(const u32*)(xb + 4 * e);
#else
  return *(const unsigned short*)(xb + 2 * e);
#endif
}

// ------------------------------------------------------------------------- FP8
DEV u32 f32_to_fp8_sw(float f) {  // saturating RNE, bit-exact with cvt.rn.satfinite
  u32 u = as_u(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;
#if FMT == 0
  if (a >= 0x43e00000u) return sign | 0x7eu;  // |f| >= 448 (and Inf): saturate
  if (a >= 0x3c800000u) {                     // >= 2^-6: normal
    u32 r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return sign | (r - (120u << 3));
  }
  float t = f_add(f_mul(as_f(a), as_f(0x44000000u)), as_f(BITS_MAGIC));  // |f| * 2^9
#else
  if (a >= 0x47600000u) return sign | 0x7bu;  // |f| >= 57344 (and Inf): saturate
  if (a >= 0x38800000u) {                     // >= 2^-14: normal
    u32 r = (a + 0xfffffu + ((a >> 21) & 1u)) >> 21;
    return sign | (r - (112u << 2));
  }
  float t = f_add(f_mul(as_f(a), as_f(0x47800000u)), as_f(BITS_MAGIC));  // |f| * 2^16
#endif
  return sign | (as_u(t) - BITS_MAGIC);
}

// Four float32 -> four fp8 codes, a in the lowest byte.
DEV u32 pack4_fp8(float a, float b, float c, float d) {
#if HW_FP8
  u32 w;
#if FMT == 0
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
#else
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
#endif
  return w;
#else
  return f32_to_fp8_sw(a) | (f32_to_fp8_sw(b) << 8) | (f32_to_fp8_sw(c) << 16) |
         (f32_to_fp8_sw(d) << 24);
#endif
}

DEV float fp8_to_f32_sw(u32 b) {  // exact
  u32 sign = (b & 0x80u) << 24, a = b & 0x7fu;
#if FMT == 0
  if (a == 0x7fu) return as_f(0x7fffffffu);
  return as_f(sign | as_u(f_mul(as_f(a << 20), as_f(0x7b800000u))));  // * 2^120
#else
  if (a >= 0x7cu) return as_f(sign | 0x7f800000u | ((a & 3u) << 21));
  return as_f(sign | as_u(f_mul(as_f(a << 21), as_f(0x77800000u))));  // * 2^112
#endif
}

// Four fp8 codes (lowest byte first) -> four float32, exact.
DEV void unpack4_fp8(u32 w, float* v) {
#if defined(__CUDA_ARCH__) && !SW_CVT && (FMT == 1 || HW_FP8)
  u32 h01, h23;
#if FMT == 0
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "mov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\t"
      "cvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
      : "=r"(h01), "=r"(h23) : "r"(w));
#else
  h01 = __byte_perm(w, 0u, 0x1404u);  // e5m2 is the top byte of a float16
  h23 = __byte_perm(w, 0u, 0x3424u);
#endif
  v[0] = h2f(h01 & 0xffffu);
  v[1] = h2f(h01 >> 16);
  v[2] = h2f(h23 & 0xffffu);
  v[3] = h2f(h23 >> 16);
#else
  v[0] = fp8_to_f32_sw(w & 0xffu);
  v[1] = fp8_to_f32_sw((w >> 8) & 0xffu);
  v[2] = fp8_to_f32_sw((w >> 16) & 0xffu);
  v[3] = fp8_to_f32_sw(w >> 24);
#endif
}
