// coccl GPU codec kernels: taco (FP8 + Walsh-Hadamard) and int8, bit-exact with FORMAT.md.
//
// One source, compiled once per variant by compressors/gpu_kernels.py (NVRTC through
// cupy.RawModule) with -D defines; every variant defines exactly one kernel,
// `coccl_codec(const void* src, void* dst, long long count, long long K)`.
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
#define PREFETCH 0  // load the next tile while computing this one (kernel 1; kernel 2 staged)
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

// ----------------------------------------------------------------- memory helpers
// cp.async (sm_80+): a 16-byte global -> shared copy that holds no register while in
// flight (ASYNC7 0: none; callers then copy through registers).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ASYNC7 1
// The shared-memory (32-bit) address of a generic pointer into shared memory.
DEV u32 smem_addr(const void* p) {
  u32 d;
  asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}"
      : "=r"(d) : "l"(p));
  return d;
}
// A 16-byte copy to the shared-memory address d (as smem_addr gives).
DEV void cp_async16_to(u32 d, const uint4* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
DEV void cp_async16(uint4* dst, const uint4* src) { cp_async16_to(smem_addr(dst), src); }
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
DEV void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
DEV void cp_async_wait2() { asm volatile("cp.async.wait_group 2;" ::: "memory"); }
#else
#define ASYNC7 0
#endif

DEV int swz(int c) { return c ^ ((c >> 3) & 7); }  // 16-byte chunk -> smem slot

DEV uint4 ldg4(const uint4* p) { return __ldg(p); }

// A warp's tile read coalesced (t: chunk j * 32 + lane of it, CH chunks per lane) handed
// to the lanes that own it: lane l gets chunks [l * CH, l * CH + CH) as words w.
template <int CH>
DEV void staged_transpose(const uint4* t, uint4* sb, int lane, u32* w) {
#pragma unroll
  for (int j = 0; j < CH; ++j) sb[swz(j * 32 + lane)] = t[j];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    uint4 q = sb[swz(lane * CH + j)];
    w[4 * j] = q.x;
    w[4 * j + 1] = q.y;
    w[4 * j + 2] = q.z;
    w[4 * j + 3] = q.w;
  }
  __syncwarp();
}

// Coalesced read of a warp's tile (CH chunks per lane) into the lanes' own words.
template <int CH>
DEV void staged_load(const uint4* g, uint4* sb, int lane, u32* w) {
  uint4 t[CH];
#pragma unroll
  for (int j = 0; j < CH; ++j) t[j] = ldg4(g + j * 32 + lane);
  staged_transpose<CH>(t, sb, lane, w);
}

// The lanes' own words -> coalesced write of the warp's tile.
template <int CH>
DEV void staged_store(uint4* g, uint4* sb, int lane, const u32* w) {
#pragma unroll
  for (int j = 0; j < CH; ++j)
    sb[swz(lane * CH + j)] = make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < CH; ++j) g[j * 32 + lane] = sb[swz(j * 32 + lane)];
  __syncwarp();
}

// A lane's 32 input elements starting at element `base`, zero past `count`.
DEV void lane_load(const char* xb, i64 base, i64 count, bool vec, u32* w) {
  if (vec && base + 32 <= count) {
    const uint4* p = (const uint4*)(xb + base * EB);
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      uint4 q = ldg4(p + j);
      w[4 * j] = q.x;
      w[4 * j + 1] = q.y;
      w[4 * j + 2] = q.z;
      w[4 * j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = 0;
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      const i64 e = base + r;
      const u32 h = e < count ? load_elem_raw(xb, e) : 0u;
#if XT == 0
      w[r] = h;
#else
      w[r >> 1] |= h << (16 * (r & 1));
#endif
    }
  }
}

// 32 bytes (8 words) at p, all of them or only the first `n` (n < 32).
DEV void store_bytes32(unsigned char* p, const u32* c, bool vec, int n) {
  if (vec && n >= 32) {
    uint4* q = (uint4*)p;
    q[0] = make_uint4(c[0], c[1], c[2], c[3]);
    q[1] = make_uint4(c[4], c[5], c[6], c[7]);
  } else {
#pragma unroll
    for (int r = 0; r < 32; ++r)
      if (r < n) p[r] = (unsigned char)(c[r >> 2] >> (8 * (r & 3)));
  }
}

DEV void load_bytes32(const unsigned char* p, u32* c, bool vec) {
  if (vec) {
    const uint4* q = (const uint4*)p;
    uint4 a = ldg4(q), b = ldg4(q + 1);
    c[0] = a.x; c[1] = a.y; c[2] = a.z; c[3] = a.w;
    c[4] = b.x; c[5] = b.y; c[6] = b.z; c[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      c[i] = (u32)p[4 * i] | ((u32)p[4 * i + 1] << 8) | ((u32)p[4 * i + 2] << 16) |
             ((u32)p[4 * i + 3] << 24);
  }
}

DEV void st32(unsigned char* p, u32 v, bool aligned) {
  if (aligned) {
    *(u32*)p = v;
  } else {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
  }
}

DEV u32 ld32(const unsigned char* p, bool aligned) {
  if (aligned) return __ldg((const u32*)p);
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// A function the compiler keeps out of line: a rare path that would otherwise be inlined
// as instructions predicated off (which every warp still issues).
#if defined(__CUDA_ARCH__)
#define COLD __device__ __noinline__
#else
#define COLD inline
#endif

// The words at unaligned addresses ps (low half) and pa (high half), byte by byte (a
// payload's scales when it is not 4-byte aligned); returned by value, as a call's
// reference arguments would live in local memory.
COLD u64 ld32x2_bytes(const unsigned char* ps, const unsigned char* pa) {
  return (u64)ld32(ps, false) | ((u64)ld32(pa, false) << 32);
}

// Group g's scales in a taco payload of K groups whose codes end at byte ncodes
// (FORMAT.md: every group's s, then every group's alpha, each there only when DUAL / ASH);
// a4: the scales are 4-byte aligned. Loading leaves s and alpha as they are where absent.
DEV void taco_load_scales(const unsigned char* pay, i64 ncodes, i64 K, i64 g, bool a4, float& s,
                          float& alpha) {
  const unsigned char* ps = pay + ncodes + 4 * g;
  const unsigned char* pa = ps + (DUAL ? 4 * K : 0);
  if (a4) {
    if (DUAL) s = as_f(__ldg((const u32*)ps));
    if (ASH) alpha = as_f(__ldg((const u32*)pa));
  } else {
    const u64 w = ld32x2_bytes(ps, pa);
    if (DUAL) s = as_f((u32)w);
    if (ASH) alpha = as_f((u32)(w >> 32));
  }
}

DEV void taco_store_scales(unsigned char* pay, i64 ncodes, i64 K, i64 g, bool a4, u32 sbits,
                           u32 abits) {
  if (DUAL) st32(pay + ncodes + 4 * g, sbits, a4);
  if (ASH) st32(pay + ncodes + (DUAL ? 4 * K : 0) + 4 * g, abits, a4);
}

// ------------------------------------------------------ the ring hops' arguments
// Kernels 8, 9 and 10 take (own, src, dst[, dec], count, K): own's `count` elements, the
// received payload src, the payload dst they write and, with DEC, the decoded output dec.
#if DEC
#define HOP_DEC_PARAM void *dec,
#define HOP_DEC_ARG dec
#else
#define HOP_DEC_PARAM
#define HOP_DEC_ARG nullptr
#endif
#define HOP_PARAMS \
  const void *own, const void *__restrict__ src, void *__restrict__ dst, HOP_DEC_PARAM i64 count, \
      i64 K

// A hop's buffers as bytes, and which allow 16-byte accesses (vout: true without dec).
struct HopIo {
  const char* xb;
  const unsigned char* pin;
  unsigned char* pout;
  char* ob;
  bool vin, vpi, vpo, vout;
};

DEV HopIo hop_io(const void* own, const void* src, void* dst, void* dec) {
  HopIo io;
  io.xb = (const char*)own;
  io.pin = (const unsigned char*)src;
  io.pout = (unsigned char*)dst;
  io.ob = (char*)dec;
  io.vin = (((u64)io.xb) & 15) == 0;
  io.vpi = (((u64)io.pin) & 15) == 0;
  io.vpo = (((u64)io.pout) & 15) == 0;
  io.vout = (((u64)io.ob) & 15) == 0;
  return io;
}

// --------------------------------------------------------- group reductions
template <int L = LPG>  // L lanes per group
DEV u32 group_umax(u32 m) {
#pragma unroll
  for (int t = 1; t < L; t <<= 1) m = max(m, (u32)__shfl_xor_sync(FULL_MASK, m, t));
  return m;
}

// --------------------------------------------------------------- Walsh-Hadamard
// Stages h = 1 .. G/2 in order; pairs (i, i+h) with bit h of i clear: v_i = a + b,
// v_{i+h} = a - b. A lane holds N consecutive elements of a group spread over L lanes:
// stages h < N are inside the lane, the others across lanes.
template <int N = 32, int L = LPG>
DEV void wht_group(float* v, int lig) {
#pragma unroll
  for (int h = 1; h < N; h <<= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = f_add(a, b);
        v[i + h] = f_sub(a, b);
      }
    }
  }
#pragma unroll
  for (int t = 1; t < L; t <<= 1) {
    // The lane whose bit is clear holds a and computes a + b; its partner holds b and
    // computes a - b. fma(+-1, own, partner) rounds (partner +- own) exactly once and
    // its product is exact, so it is bitwise the plain add/sub, not a contraction.
    const float sgn = (lig & t) ? -1.0f : 1.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = f_fma(sgn, v[i], __shfl_xor_sync(FULL_MASK, v[i], t));
  }
}

// =============================================================== taco decode
#if OP == 2 || OP == 8 || OP == 10
// N values v of one group after the inverse Hadamard, times the group's
// s * c / max(alpha, 1e-12) (FORMAT.md; an extended group by its own rule).
template <int N>
DEV void taco_scale_lane(float s, float alpha, float* v) {
#if ASH
  const float c = as_f(CINV_BITS);
#else
  const float c = as_f(BITS_ONE);
#endif
  const float kp = f_div(f_mul(s, c), f_max(alpha, as_f(BITS_1EM12)));
#if ASH
  if (extended_alpha(as_u(alpha))) {  // FORMAT.md: an extended group (rare)
    const float sc = f_mul(s, c), ia = f_div(as_f(BITS_ONE), alpha);
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = sat_inf(f_mul(f_mul(v[r], sc), ia));
    return;
  }
#endif
#pragma unroll
  for (int r = 0; r < N; ++r) v[r] = f_mul(v[r], kp);
}

// One lane's N codes cw of a group (spread over L lanes, lig: the lane's index in it)
// decoded in place of v: FP8 values, the inverse Hadamard when ASH, times the group's
// s * c / max(alpha, 1e-12) (FORMAT.md), s and alpha 1 where the payload has none. Shared
// by the decode kernel (2) and the ring hops (8, 10), so they decode bitwise alike.
template <int N = 32, int L = LPG>
DEV void taco_dequant_lane(const u32* cw, float s, float alpha, int lig, float* v) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) unpack4_fp8(cw[i], v + 4 * i);
#if ASH
  wht_group<N, L>(v, lig);
#else
  (void)lig;
#endif
  taco_scale_lane<N>(s, alpha, v);
}

// The decode of codes and scales an encode has just made (taco_encode_lane's codes, sbits,
// abits): taco_dequant_lane on the values the decode kernel would load from the payload.
template <int N = 32, int L = LPG>
DEV void taco_dequant_encoded(const u32* codes, u32 sbits, u32 abits, int lig, float* v) {
  taco_dequant_lane<N, L>(codes, DUAL ? as_f(sbits) : as_f(BITS_ONE),
                          ASH ? as_f(abits) : as_f(BITS_ONE), lig, v);
}
#endif

// =============================================================== taco encode
#if OP == 1 || OP == 7 || OP == 8 || OP == 10
// The largest |v| of a group's float32 values, as bits (exact: for non-negative floats
// the integer order is the value order; a NaN is above +Inf).
template <int N, int L>
DEV u32 group_absmax_bits(const float* v) {
  u32 m = 0;
#pragma unroll
  for (int r = 0; r < N; ++r) m = max(m, as_u(v[r]) & 0x7fffffffu);
  return group_umax<L>(m);
}

// One lane's part of a group: N consecutive elements, as exact float32 values v (which
// the encode overwrites), of a group spread over L lanes (lig: the lane's index in it).
// Codes: N/4 words; sbits/abits: the group's scales, the same in all its lanes.
template <int N, int L>
DEV void taco_encode_lane(float* v, int lig, u32* codes, u32& sbits, u32& abits) {
  const float qmax = as_f(QMAX_BITS);
  float alpha = as_f(BITS_ONE), c = as_f(BITS_ONE), amax = 0.0f;
#if ASH
  // FORMAT.md's energy: runs of 32 squares summed in order (0 + x*x is x*x, so a run
  // starts from its first square), then the runs added as a pairwise tree: first the
  // lane's own N/32 runs, then across the group's lanes (the xor butterfly).
  float er[N / 32];
#pragma unroll
  for (int q = 0; q < N / 32; ++q) {
    er[q] = f_mul(v[32 * q], v[32 * q]);
#pragma unroll
    for (int r = 1; r < 32; ++r) er[q] = f_add(er[q], f_mul(v[32 * q + r], v[32 * q + r]));
  }
#pragma unroll
  for (int d = 1; d < N / 32; d <<= 1) {
#pragma unroll
    for (int q = 0; q < N / 32; q += 2 * d) er[q] = f_add(er[q], er[q + d]);
  }
  float e = er[0];
#pragma unroll
  for (int t = 1; t < L; t <<= 1) e = f_add(e, __shfl_xor_sync(FULL_MASK, e, t));
  // A NaN or +-Inf element makes the energy NaN or +Inf, so a finite energy proves the
  // group finite and the per-element check runs only when the energy is not finite
  // (a non-finite element, or finite squares whose sum overflowed). The branch is taken
  // by whole warps, because the check shuffles across the group's lanes.
  bool bad = false;
  if (RAW_CHECK || __any_sync(FULL_MASK, (as_u(e) & 0x7fffffffu) >= 0x7f800000u))
    bad = group_absmax_bits<N, L>(v) >= 0x7f800000u;
  // m = e / G: G is a power of two, so e * 2^-log2(G) is the same correctly rounded value
  const float m = f_mul(e, as_f((u32)(127 - LOG2_GS) << 23));
  alpha = f_div(qmax, f_sqrt(f_add(m, as_f(BITS_LAMBDA))));
  alpha = f_min(f_max(alpha, as_f(BITS_1EM3)), as_f(BITS_1E3));
#pragma unroll
  for (int r = 0; r < N; ++r) v[r] = f_mul(v[r], alpha);
  wht_group<N, L>(v, lig);
  amax = 0.0f;
#pragma unroll
  for (int r = 0; r < N; ++r) amax = f_max(amax, f_abs(v[r]));
#pragma unroll
  for (int t = 1; t < L; t <<= 1) amax = f_max(amax, __shfl_xor_sync(FULL_MASK, amax, t));
  c = as_f(CINV_BITS);
#else
  const u32 mb = group_absmax_bits<N, L>(v);
  const bool bad = mb >= 0x7f800000u;
  amax = as_f(mb);
#endif
  (void)amax;
#if DUAL
  float s = f_div(f_max(f_mul(amax, c), as_f(BITS_1EM12)), qmax);
  bool divide = false;  // step 4b without ash: the codes are v / s
#if EXT
  // FORMAT.md step 4b, the extended range: s would leave its clamps (group-uniform, as
  // amax is the group's, so no lane of a group shuffles alone).
  if (!bad && as_u(amax) != 0u && (as_u(s) < BITS_1EM12 || as_u(s) > BITS_1E6)) {
#if ASH
    const int e = (int)(as_u(amax) >> 23);
    const int p = min(max(127 - e, -EXT_SHIFT), EXT_SHIFT);
    const float pw = as_f((u32)(127 + p) << 23);
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = f_mul(v[r], pw);
    alpha = f_mul(alpha, pw);
    s = f_div(f_mul(f_mul(amax, pw), c), qmax);
#else
    s = fit_scale(amax, qmax);
    divide = true;
#endif
  } else
#endif
  {
    s = f_min(f_max(s, as_f(BITS_1EM12)), as_f(BITS_1E6));
  }
  const float k = f_div(c, s);
#else
  const float s = as_f(BITS_ONE);
  const float k = c;
  const bool divide = false;
#endif
  if (divide) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      codes[i] = pack4_fp8(f_div(v[4 * i], s), f_div(v[4 * i + 1], s), f_div(v[4 * i + 2], s),
                           f_div(v[4 * i + 3], s));
  } else {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      codes[i] = pack4_fp8(f_mul(v[4 * i], k), f_mul(v[4 * i + 1], k), f_mul(v[4 * i + 2], k),
                           f_mul(v[4 * i + 3], k));
  }
  sbits = as_u(s);
  abits = as_u(alpha);
  if (bad) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) codes[i] = 0x7f7f7f7fu;
    sbits = BITS_NAN;
    abits = BITS_NAN;
  }
}
#endif

// =============================================================== int8 encode
#if OP == 3 || OP == 5 || OP == 9
// FORMAT.md int8 steps 3-5: the scale of a group whose largest |x| has the bits mb (in
// the values' own type) and the value amax; tiny: step 4 (codes x / scale) applies.
DEV float int8_scale(u32 mb, bool bad, float amax, bool& tiny) {
  float scale = f_div(amax, as_f(BITS_127));
  tiny = !bad && mb != 0u && as_u(scale) <= BITS_2M128;
  if (tiny)
    scale = fit_scale(amax, as_f(BITS_127));
  else if (!bad && as_u(f_mul(scale, as_f(BITS_127))) == BITS_INF)
    scale = next_down(scale);
  return scale;
}

DEV int int8_clamp(int q) { return min(max(q, -127), 127); }
#endif

#if OP == 3 || OP == 9
// One lane's 32 values v of a group (spread over LPG lanes) whose largest |x| has the
// bits mb in the values' own type (inf: that type's infinity) and the value amax: the
// codes and the group's scale, FORMAT.md's int8 arithmetic. Shared by the encode kernel
// (3) and the ring hop (9), so the two quantize bitwise alike.
DEV void int8_quantize_lane(const float* v, u32 mb, u32 inf, float amax, u32* codes,
                            u32& sbits) {
  const bool bad = mb >= inf;
  bool tiny;
  const float scale = int8_scale(mb, bad, amax, tiny);
  const float inv = mb != 0 ? f_div(as_f(BITS_ONE), scale) : 0.0f;
  if (tiny) {  // rare: step 4 divides
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u32 word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        word |= ((u32)int8_clamp(f2i_rn(f_div(v[4 * i + j], scale))) & 0xffu) << (8 * j);
      codes[i] = word;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u32 word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        word |= ((u32)int8_clamp(f2i_rn(f_mul(v[4 * i + j], inv))) & 0xffu) << (8 * j);
      codes[i] = bad ? 0u : word;
    }
  }
  sbits = bad ? BITS_NAN : as_u(scale);
}
#endif

#if OP == 3
DEV void int8_encode_lane(const u32* w, u32* codes, u32& sbits) {
  const u32 mb = group_umax(raw_absmax(w));
  float v[32];
#pragma unroll
  for (int r = 0; r < 32; ++r) v[r] = elem_f32(w, r);
  int8_quantize_lane(v, mb, INF_BITS, raw_to_f32(mb), codes, sbits);
}
#endif

// ======================================================== fast encode kernel (1, 3)
#if OP == 1 || OP == 3
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  __shared__ uint4 smem[WARPS * 32 * CPL];
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int lig = lane & (LPG - 1);
  uint4* sb = smem + wib * 32 * CPL;
  const bool vin = (((u64)xb) & 15) == 0;
  const bool vpay = (((u64)pay) & 15) == 0;
#if OP == 1
  const i64 ncodes = K << LOG2_GS;  // the last group is stored whole
  const bool a4 = (((u64)pay) & 3) == 0;
#else
  const i64 ncodes = count;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
#endif
  const i64 ntiles = (ncodes + 1023) >> 10;
  const i64 stride = (i64)gridDim.x * WARPS;
#if PREFETCH
  // Software pipelining: the next tile's loads are in flight while this tile computes,
  // so one warp overlaps its own memory latency with its arithmetic.
  u32 wn[NW];
  {
    const i64 first = (i64)blockIdx.x * WARPS + wib;
    if (first < ntiles) lane_load(xb, (first << 10) + lane * 32, count, vin, wn);
  }
#endif
  for (i64 tile = (i64)blockIdx.x * WARPS + wib; tile < ntiles; tile += stride) {
    const i64 t0 = tile << 10;
    const i64 base = t0 + lane * 32;
    const i64 g = base >> LOG2_GS;
    u32 w[NW];
#if PREFETCH
    const bool staged = false;
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = wn[i];
    if (tile + stride < ntiles) lane_load(xb, ((tile + stride) << 10) + lane * 32, count, vin, wn);
#else
    const bool staged = STAGE && vin && vpay && (t0 + 1024 <= count);
    if (staged)
      staged_load<CPL>((const uint4*)(xb + t0 * EB), sb, lane, w);
    else
      lane_load(xb, base, count, vin, w);
#endif
    u32 codes[8];
#if OP == 1
    u32 sbits, abits;
    float v[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) v[r] = elem_f32(w, r);
    taco_encode_lane<32, LPG>(v, lig, codes, sbits, abits);
#else
    u32 sbits;
    int8_encode_lane(w, codes, sbits);
#endif
    if (staged) {
      staged_store<2>((uint4*)(pay + t0), sb, lane, codes);
    } else if (base < ncodes) {
      const i64 left = ncodes - base;
      store_bytes32(pay + base, codes, vpay, left >= 32 ? 32 : (int)left);
    }
    if (lig == 0 && g < K) {
#if OP == 1
      taco_store_scales(pay, ncodes, K, g, a4, sbits, abits);
#else
      st32(pay + count + 4 * g, sbits, a4);
#endif
    }
  }
}
#endif

// =================================== taco encode, EPL elements per lane (7)
// The same encode with each lane holding EPL = min(G, 128) consecutive elements, so that a
// G <= 128 group lives in one lane: no shuffles, and the group's scalar arithmetic (the
// divisions and the square root) is paid once per group instead of once per 32 elements.
// A warp's tile (32 * EPL elements) is read and its codes written with coalesced 16-byte
// accesses through per-warp shared-memory buffers (lane-strided accesses straight from
// global memory saturated the memory pipeline at half the copy bandwidth). Two buffers per
// warp: the next tile is copied in (cp.async, sm_80+) while this one is computed, since
// with ~12 warps per SM a warp cannot wait for its own loads.
#if OP == 7 || OP == 10
#ifndef EPL
#define EPL 128
#endif
#define L7 (GS / EPL)        // lanes per group
#define CH7 (EPL * EB / 16)  // 16-byte chunks of a lane's elements
#define CC7 (EPL / 16)       // 16-byte chunks of a lane's codes

// Shared-memory slot of chunk c of lane l, for CH chunks per lane: the xor keeps the
// 8 lanes of a quarter-warp on distinct 16-byte bank groups both when each lane walks
// its own chunks and when the warp walks the tile in order (no bank conflicts).
template <int CH>
DEV int slot7(int l, int c) {
  const int f = CH >= 8 ? (l & 7) : (((l * CH) >> 3) & (CH - 1));
  return l * CH + (c ^ f);
}

// The slot of a warp's tile chunk j * 32 + lane when the warp walks the tile in order: it
// is chunk lane % CH of lane j * (32 / CH) + lane / CH (CH divides 32), written so that
// the compiler folds the unrolled j.
template <int CH>
DEV int tile_slot7(int j, int lane) {
  return slot7<CH>(j * (32 / CH) + lane / CH, lane & (CH - 1));
}

// tile_slot7's period in j: tile_slot7(j + P, lane) = tile_slot7(j, lane) + 32 P (the
// swizzle f repeats every 8 lanes, 8 lanes are P * 32 / CH chunks apart). So a tile walk
// needs P addresses a tile; its other chunks are those plus constant offsets.
template <int CH>
__host__ __device__ constexpr int period7() {
  return CH >= 8 ? CH / 4 : 1;
}

// The EPL kernels' buffers are addressed by 32-bit shared-memory addresses on the GPU
// (what ld/st.shared and cp.async take; a generic pointer costs a conversion per access)
// and by plain addresses in the host emulation. A buffer of CH chunks a lane starts on a
// multiple of 16 * CH bytes (EPL_SMEM_ALIGN), so lane l's chunk c lies at the xor
// (buf + 16 * slot7(l, 0)) ^ (16 * c): one logic operation a chunk.
#define EPL_SMEM_ALIGN 512  // 16 bytes x the most chunks a lane holds (32: 128 float32)
#if ASYNC7
typedef u32 saddr;
DEV saddr saddr_of(const uint4* p) { return smem_addr(p); }
DEV uint4 lds16(saddr a) {
  uint4 q;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "r"(a) : "memory");
  return q;
}
DEV void sts16(saddr a, const uint4& q) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
               ::"r"(a), "r"(q.x), "r"(q.y), "r"(q.z), "r"(q.w) : "memory");
}
#else
typedef u64 saddr;
DEV saddr saddr_of(const uint4* p) { return (u64)p; }
DEV uint4 lds16(saddr a) { return *(const uint4*)a; }
DEV void sts16(saddr a, const uint4& q) { *(uint4*)a = q; }
#endif

// Lane `lane`'s row of a buffer at shared address buf (CH chunks a lane): its chunk c is
// at lane_row7(...) ^ (16 * c).
template <int CH>
DEV saddr lane_row7(saddr buf, int lane) {
  return buf + (saddr)(16 * slot7<CH>(lane, 0));
}

// Start copying a warp's tile at `tile_bytes` (32 lanes' CH chunks each, in order) into
// the buffer at buf, chunk c of lane l at slot7<CH>(l, c).
template <int CH>
DEV void tile_fetch7(const char* tile_bytes, saddr buf, int lane) {
  const uint4* g = (const uint4*)tile_bytes + lane;
  constexpr int P = period7<CH>();
  saddr at[P];
#pragma unroll
  for (int p = 0; p < P; ++p) at[p] = buf + (saddr)(16 * tile_slot7<CH>(p, lane));
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const saddr d = at[j % P] + (saddr)(16 * 32 * (j - j % P));
#if ASYNC7
    cp_async16_to(d, g + j * 32);
#else
    sts16(d, ldg4(g + j * 32));
#endif
  }
}

// The lanes' words (CH chunks each, lane l's chunk c at slot7<CH>(l, c) of the buffer at
// buf) written as a warp's tile at `tile_bytes` with coalesced 16-byte stores.
template <int CH>
DEV void tile_store7(char* tile_bytes, saddr buf, int lane, const u32* w) {
  const saddr row = lane_row7<CH>(buf, lane);
#pragma unroll
  for (int c = 0; c < CH; ++c)
    sts16(row ^ (saddr)(16 * c), make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]));
  __syncwarp();
  uint4* g = (uint4*)tile_bytes + lane;
  constexpr int P = period7<CH>();
  saddr at[P];
#pragma unroll
  for (int p = 0; p < P; ++p) at[p] = buf + (saddr)(16 * tile_slot7<CH>(p, lane));
#pragma unroll
  for (int j = 0; j < CH; ++j) g[j * 32] = lds16(at[j % P] + (saddr)(16 * 32 * (j - j % P)));
  __syncwarp();
}

// A lane's EPL codes at cp: 16-byte stores when aligned, else byte by byte.
DEV void lane_store_codes7(unsigned char* cp, const u32* codes, bool v16) {
  if (v16) {
#pragma unroll
    for (int j = 0; j < CC7; ++j)
      ((uint4*)cp)[j] =
          make_uint4(codes[4 * j], codes[4 * j + 1], codes[4 * j + 2], codes[4 * j + 3]);
  } else {
#pragma unroll
    for (int r = 0; r < EPL; ++r) cp[r] = (unsigned char)(codes[r >> 2] >> (8 * (r & 3)));
  }
}
#endif

#if OP == 7
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  alignas(EPL_SMEM_ALIGN) __shared__ uint4 smem[2 * WARPS * 32 * CH7];
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const int lig = lane & (L7 - 1);
  const saddr wbuf = saddr_of(smem + (threadIdx.x >> 5) * 64 * CH7);  // two buffers a warp
  const saddr bufb = 16 * 32 * CH7;                                   // bytes of one
  const bool vin = (((u64)xb) & 15) == 0;
  const bool vpay = (((u64)pay) & 15) == 0;
  const bool a4 = (((u64)pay) & 3) == 0;
  const i64 ncodes = K << LOG2_GS;  // the last group is stored whole
  const i64 ntiles = (ncodes + 32 * EPL - 1) / (32 * EPL);
  const i64 stride = (i64)gridDim.x * WARPS;
  // A tile whose elements all exist is fetched whole (warp-uniform); others load per lane.
  // Those are the tiles below nwhole: (t + 1) * 32 * EPL <= count, and t < ntiles.
  const i64 nwhole = vin ? min(count / (32 * EPL), ntiles) : 0;
  auto fetched = [&](i64 t) { return t < nwhole; };
  i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int cur = 0;
  if (fetched(tile)) tile_fetch7<CH7>(xb + tile * 32 * EPL * EB, wbuf, lane);
#if ASYNC7
  cp_async_commit();
#endif
  // Whole warps iterate together (the group's lanes shuffle when L7 > 1); a lane past the
  // last group encodes zeros and stores nothing.
  for (; tile < ntiles; tile += stride, cur ^= 1) {
    const i64 t0 = tile * 32 * EPL;
    const i64 base = t0 + lane * EPL;
    const saddr sb = wbuf + (cur ? bufb : 0);
    if (fetched(tile + stride))
      tile_fetch7<CH7>(xb + (tile + stride) * 32 * EPL * EB, wbuf + (cur ? 0 : bufb), lane);
#if ASYNC7
    cp_async_commit();  // possibly empty: one group per iteration keeps the count simple
    cp_async_wait1();   // all but the newest group: this tile is in
#endif
    __syncwarp();
    float v[EPL];
    if (fetched(tile)) {
      const saddr row = lane_row7<CH7>(sb, lane);
#pragma unroll
      for (int c = 0; c < CH7; ++c) {
        const uint4 q = lds16(row ^ (saddr)(16 * c));
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int r = 0; r < 16 / EB; ++r) v[c * (16 / EB) + r] = elem_f32(w, r);
      }
      __syncwarp();
    } else {
#pragma unroll
      for (int r = 0; r < EPL; ++r) {
        const i64 e = base + r;
        const u32 w[1] = {e < count ? load_elem_raw(xb, e) : 0u};
        v[r] = elem_f32(w, 0);
      }
    }
    u32 codes[EPL / 4], sbits, abits;
    taco_encode_lane<EPL, L7>(v, lig, codes, sbits, abits);
    if (t0 + 32 * EPL <= ncodes && vpay) {  // warp-uniform: the whole tile, coalesced
      tile_store7<CC7>((char*)(pay + t0), sb, lane, codes);
    } else if (base < ncodes) {
      lane_store_codes7(pay + base, codes, vpay);
    }
    if (lig == 0 && base < ncodes)
      taco_store_scales(pay, ncodes, K, base >> LOG2_GS, a4, sbits, abits);
  }
}
#endif

// ========================== taco ring hop, EPL elements per lane (10)
// Kernel 8's hop (with DEC, its decoded output too) in kernel 7's layout: each lane holds
// EPL consecutive elements (a group over L7 = G / EPL lanes: fewer shuffles, the group's
// scalars paid by fewer lanes). A warp's tile of 32 * EPL codes is copied into shared
// memory (cp.async) while the previous tile computes, in two buffers; its 32 * EPL own
// elements, needed only after the decode, in one buffer, copied in as soon as the previous
// tile has added its own (with DEC: once its decoded values have left through it). The
// codes and decoded values leave through those buffers with coalesced stores. One own
// buffer instead of two lets a block of four warps keep 64 float32 elements a lane within
// 48 KiB. Bitwise kernel 8: the same dequantization, addition and encode of every element
// and group.
#if OP == 10
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) coccl_codec(HOP_PARAMS) {
  // Per warp a tile's own elements (32 * CH7 chunks) and two tiles' codes (32 * CC7 each).
  alignas(EPL_SMEM_ALIGN) __shared__ uint4 smem[WARPS * 32 * (CH7 + 2 * CC7)];
  const int lane = threadIdx.x & 31;
  const int lig = lane & (L7 - 1);
  const HopIo io = hop_io(own, src, dst, HOP_DEC_ARG);
  const char* xb = io.xb;
  const unsigned char* pin = io.pin;
  unsigned char* pout = io.pout;
  const bool vin = io.vin, vpi = io.vpi, vpo = io.vpo;
  const saddr sb = saddr_of(smem + (threadIdx.x >> 5) * 32 * (CH7 + 2 * CC7));  // own
  const saddr scodes = sb + 16 * 32 * CH7;  // the two codes buffers
  const saddr bufc = 16 * 32 * CC7;          // bytes of one
  const bool a4i = (((u64)pin) & 3) == 0;
  const bool a4o = (((u64)pout) & 3) == 0;
  const i64 ncodes = K << LOG2_GS;  // a multiple of EPL: a lane's codes are all in or all out
  const i64 ntiles = (ncodes + 32 * EPL - 1) / (32 * EPL);
  const i64 stride = (i64)gridDim.x * WARPS;
  // A tile whose elements all exist, in aligned buffers, is fetched whole (warp-uniform);
  // others load per lane. Those are the tiles below nwhole: (t + 1) * 32 * EPL <= count,
  // and t < ntiles.
  const i64 nwhole = vin && vpi ? min(count / (32 * EPL), ntiles) : 0;
  auto fetched = [&](i64 t) { return t < nwhole; };
  auto fetch_codes = [&](i64 t, saddr b) {
    if (fetched(t)) tile_fetch7<CC7>((const char*)pin + t * 32 * EPL, b, lane);
#if ASYNC7
    cp_async_commit();  // possibly empty: one group per call keeps the count simple
#endif
  };
  auto fetch_own = [&](i64 t) {
    if (fetched(t)) tile_fetch7<CH7>(xb + t * 32 * EPL * EB, sb, lane);
#if ASYNC7
    cp_async_commit();
#endif
  };
  // cp.async groups in the order committed: codes(t), own(t), codes(t + stride),
  // own(t + stride), ...: each iteration commits the next tile's codes, then waits for
  // all but the two newest groups (this tile's codes are in) before the decode and for
  // all but the newest (this tile's own) before the addition.
  i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int cur = 0;
  fetch_codes(tile, scodes);
  fetch_own(tile);
  // Whole warps iterate together (a group's lanes shuffle); a lane past the last group
  // computes on zeros and stores nothing.
  for (; tile < ntiles; tile += stride, cur ^= 1) {
    const i64 t0 = tile * 32 * EPL;
    const i64 base = t0 + lane * EPL;
    const i64 g = base >> LOG2_GS;
    const bool live = base < ncodes;
    const bool whole = fetched(tile);
    const saddr sc = scodes + (cur ? bufc : 0);  // the tile's codes
    fetch_codes(tile + stride, scodes + (cur ? 0 : bufc));
#if ASYNC7
    cp_async_wait2();  // all but the two newest groups: this tile's codes are in
#endif
    __syncwarp();
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    if (live) taco_load_scales(pin, ncodes, K, g, a4i, s, alpha);
    u32 cw[EPL / 4];
    if (whole) {
      const saddr row = lane_row7<CC7>(sc, lane);
#pragma unroll
      for (int j = 0; j < CC7; ++j) {
        const uint4 q = lds16(row ^ (saddr)(16 * j));
        cw[4 * j] = q.x, cw[4 * j + 1] = q.y, cw[4 * j + 2] = q.z, cw[4 * j + 3] = q.w;
      }
    } else if (live) {
#pragma unroll
      for (int j = 0; j < EPL / 32; ++j) load_bytes32(pin + base + 32 * j, cw + 8 * j, vpi);
    } else {
#pragma unroll
      for (int i = 0; i < EPL / 4; ++i) cw[i] = 0;
    }
    float v[EPL];
    taco_dequant_lane<EPL, L7>(cw, s, alpha, lig, v);
#if ASYNC7
    cp_async_wait1();  // all but the newest group: this tile's own elements are in
#endif
    __syncwarp();
    if (whole) {
      const saddr row = lane_row7<CH7>(sb, lane);
#pragma unroll
      for (int c = 0; c < CH7; ++c) {
        const uint4 q = lds16(row ^ (saddr)(16 * c));
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int r = 0; r < 16 / EB; ++r) {
          const int i = c * (16 / EB) + r;
          v[i] = f_add(elem_f32(w, r), v[i]);
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < EPL; ++r) {
        const i64 e = base + r;
        const u32 w[1] = {e < count ? load_elem_raw(xb, e) : 0u};
        v[r] = e < count ? f_add(elem_f32(w, 0), v[r]) : 0.0f;
      }
    }
    __syncwarp();  // the own buffer and this tile's codes buffer are read
#if !DEC
    fetch_own(tile + stride);
#endif
    u32 codes[EPL / 4], sbits, abits;
    taco_encode_lane<EPL, L7>(v, lig, codes, sbits, abits);
    if (whole && vpo)
      tile_store7<CC7>((char*)(pout + t0), sc, lane, codes);
    else if (live)
      lane_store_codes7(pout + base, codes, vpo);
    if (live && lig == 0) taco_store_scales(pout, ncodes, K, g, a4o, sbits, abits);
#if DEC
    taco_dequant_encoded<EPL, L7>(codes, sbits, abits, lig, v);
    if (whole && io.vout) {
      u32 ow[CH7 * 4];
#pragma unroll
      for (int j = 0; j < EPL / 32; ++j) pack_out32(v + 32 * j, ow + NW * j);
      tile_store7<CH7>(io.ob + t0 * EB, sb, lane, ow);
    } else if (live) {
#pragma unroll
      for (int j = 0; j < EPL / 32; ++j)
        store_out32(io.ob, base + 32 * j, count, io.vout, v + 32 * j);
    }
    fetch_own(tile + stride);  // the decoded values have left through the own buffer
#endif
  }
}
#endif

// =============================================================== int8 decode
#if OP == 4 || OP == 6 || OP == 9
// Int8 code q as a float32, exactly: (1.5 * 2^23 + q) - 1.5 * 2^23. A value decodes as
// int8_float(q) * scale (FORMAT.md); the decode kernels (4, 6) and the ring hop (9) all
// use this, so they decode bitwise alike.
DEV float int8_float(int q) { return f_sub(as_f(BITS_MAGIC + (u32)q), as_f(BITS_MAGIC)); }

// Code r (0..31) of a lane's 32 codes packed in cw, sign-extended.
DEV int int8_code(const u32* cw, int r) { return ((int)(cw[r >> 2] << (24 - 8 * (r & 3)))) >> 24; }
#endif

// ======================================== taco decode of a whole tile, transposed (2)
// Kernel 2's path for whole tiles of 16-byte aligned payload and a 16-bit output (not
// accumulated) when a group spans LPG = 4 or 8 lanes (G = 128, 256: a group's store then
// fills whole 32-byte sectors). A lane decodes its 32 consecutive codes and runs the Hadamard stages h < 32 in
// registers, as taco_dequant_lane does; the warp then transposes the values through shared
// memory, so that a lane holds, for 32 / LPG offsets j of its group's 32-element blocks,
// the value at j of every block. The stages h = 32 .. G/2 then pair values within the
// lane: a + b and a - b, bitwise the shuffled fma(+-1, own, partner) of wht_group (each
// rounds the exact sum once), in the same order of stages, so that no shuffle is left.
// A lane's offsets are runs of four, j = 4 lig + 4 LPG r (r < TNR): it stores each run
// straight to global memory as one 8-byte piece, and the LPG lanes of a group write 4 LPG
// consecutive elements at once, whole 32-byte sectors. (Float32 outputs and the
// accumulating decode keep the staged path: their scattered 16-byte stores were slower
// at large counts.)
// Shared memory is padded by one 16-byte slot every eight (chunk c at slot c + c / 8):
// every access of the warp is free of bank conflicts and every address is a per-lane
// base plus a constant.
#if OP == 2 && ASH && STAGE && (LPG == 4 || LPG == 8) && EB == 2 && !ACC
#define TACO_T 1
#define TNR (8 / LPG)   // runs of four offsets a lane holds in each block
#define TSLOTS (9 * 32)  // a warp's buffer: 32 lanes x 8 chunks of 16 bytes, padded
// The warp's whole tiles tile, tile + stride, ... below nfull (payload and output 16-byte
// aligned); returns the first tile it did not decode.
DEV i64 taco_decode_tiles_t(const unsigned char* pay, char* ob, i64 ncodes, i64 K, i64 tile,
                            i64 nfull, i64 stride, int lane, uint4* sb) {
  const int gl = lane / LPG, lig = lane % LPG;  // the lane's group in the tile, index in it
#if PREFETCH
  // The next tile's codes and scales are loaded while this one is computed: twice the
  // payload bytes in flight of each warp (the loads are a third of the decode's bytes).
  uint4 n0, n1;
  float ns = as_f(BITS_ONE), na = as_f(BITS_ONE);
  auto fetch = [&](i64 t) {
    taco_load_scales(pay, ncodes, K, ((t << 10) >> LOG2_GS) + 32 * lane / GS, true, ns, na);
    const uint4* cp = (const uint4*)(pay + (t << 10));
    n0 = ldg4(cp + lane);
    n1 = ldg4(cp + 32 + lane);
  };
  if (tile < nfull) fetch(tile);
#endif
  for (; tile < nfull; tile += stride) {
    const i64 t0 = tile << 10;
    // the element of the lane's first run; run (b, r) starts 32 b + 4 LPG r after it
    const i64 e0 = t0 + (gl * GS + 4 * lig);
#if PREFETCH
    const float s = ns, alpha = na;
    const uint4 c0 = n0, c1 = n1;
    if (tile + stride < nfull) fetch(tile + stride);
#else
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    taco_load_scales(pay, ncodes, K, (t0 >> LOG2_GS) + 32 * lane / GS, true, s, alpha);
    const uint4* cp = (const uint4*)(pay + t0);
    const uint4 c0 = ldg4(cp + lane), c1 = ldg4(cp + 32 + lane);
#endif
    // the codes, read coalesced (chunk 32 j + lane), to the lanes that own them (2 lane + j)
    sb[lane + (lane >> 3)] = c0;
    sb[36 + lane + (lane >> 3)] = c1;
    __syncwarp();
    const uint4 d0 = sb[2 * lane + (lane >> 2)], d1 = sb[2 * lane + (lane >> 2) + 1];
    __syncwarp();
    const u32 cw[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
    float v[32];
#pragma unroll
    for (int i = 0; i < 8; ++i) unpack4_fp8(cw[i], v + 4 * i);
    wht_group<32, 1>(v, 0);  // stages h = 1 .. 16
    // transpose: the lane's chunk j (elements 4 j ..) to chunk 8 lane + j; then the lane
    // reads chunk (gl LPG + b) 8 + lig + LPG r, its run (b, r), into u[4 (b TNR + r) ..]
#pragma unroll
    for (int j = 0; j < 8; ++j)
      sb[9 * lane + j] = make_uint4(as_u(v[4 * j]), as_u(v[4 * j + 1]), as_u(v[4 * j + 2]),
                                    as_u(v[4 * j + 3]));
    __syncwarp();
    float u[32];
#pragma unroll
    for (int b = 0; b < LPG; ++b)
#pragma unroll
      for (int r = 0; r < TNR; ++r) {
        const uint4 q = sb[9 * (gl * LPG + b) + lig + LPG * r];
        float* x = u + 4 * (b * TNR + r);
        x[0] = as_f(q.x); x[1] = as_f(q.y); x[2] = as_f(q.z); x[3] = as_f(q.w);
      }
    __syncwarp();
    // stages h = 32 t: block b with block b + t (bit t of b clear)
#pragma unroll
    for (int t = 1; t < LPG; t <<= 1)
#pragma unroll
      for (int b = 0; b < LPG; ++b)
        if ((b & t) == 0) {
#pragma unroll
          for (int i = 0; i < 4 * TNR; ++i) {
            const float a = u[4 * TNR * b + i], c = u[4 * TNR * (b + t) + i];
            u[4 * TNR * b + i] = f_add(a, c);
            u[4 * TNR * (b + t) + i] = f_sub(a, c);
          }
        }
    taco_scale_lane<32>(s, alpha, u);
#pragma unroll
    for (int b = 0; b < LPG; ++b)
#pragma unroll
      for (int r = 0; r < TNR; ++r) {
        const i64 e = e0 + 32 * b + 4 * LPG * r;
        const float* x = u + 4 * (b * TNR + r);
        *(uint2*)(ob + 2 * e) = make_uint2(pack_out2(x[0], x[1]), pack_out2(x[2], x[3]));
      }
  }
  return tile;
}
#else
#define TACO_T 0
#endif

// ======================================================== fast decode kernel (2, 4)
#if OP == 2 || OP == 4
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
#if ACC
#define OCPL 8
#else
#define OCPL CPL
#endif
  const unsigned char* pay = (const unsigned char*)src;
  char* ob = (char*)dst;
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int lig = lane & (LPG - 1);
  (void)lig;
#if TACO_T
  __shared__ uint4 smem[WARPS * TSLOTS];
  uint4* sb = smem + wib * TSLOTS;
#else
  __shared__ uint4 smem[WARPS * 32 * OCPL];
  uint4* sb = smem + wib * 32 * OCPL;
#endif
  const bool vout = (((u64)ob) & 15) == 0;
  const bool vpay = (((u64)pay) & 15) == 0;
#if OP == 2
  const i64 ncodes = K << LOG2_GS;
  const bool a4 = (((u64)pay) & 3) == 0;
#else
  const i64 ncodes = count;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
#endif
  const i64 ntiles = (count + 1023) >> 10;
  const i64 stride = (i64)gridDim.x * WARPS;
  i64 tile = (i64)blockIdx.x * WARPS + wib;
#if TACO_T
  if (vout && vpay)
    tile = taco_decode_tiles_t(pay, ob, ncodes, K, tile, count >> 10, stride, lane, sb);
#endif
  // the rest: every tile where taco_decode_tiles_t is not compiled, else the partial last
  // tile and the tiles of unaligned buffers
#define PREFETCH2 (OP == 2 && PREFETCH && STAGE && !TACO_T)
#if PREFETCH2
  // The codes and scales of the warp's next staged tile are loaded while this one is
  // computed (as taco_decode_tiles_t does).
  uint4 n0 = make_uint4(0u, 0u, 0u, 0u), n1 = n0;
  float ns = as_f(BITS_ONE), na = as_f(BITS_ONE);
  const i64 nstaged = vout && vpay ? count >> 10 : 0;  // tiles below it are staged
  auto fetch = [&](i64 t) {
    const uint4* cp = (const uint4*)(pay + (t << 10));
    n0 = ldg4(cp + lane);
    n1 = ldg4(cp + 32 + lane);
    taco_load_scales(pay, ncodes, K, ((t << 10) + lane * 32) >> LOG2_GS, a4, ns, na);
  };
  if (tile < nstaged) fetch(tile);
#endif
  for (; tile < ntiles; tile += stride) {
    const i64 t0 = tile << 10;
    const i64 base = t0 + lane * 32;
    const i64 g = base >> LOG2_GS;
    const bool staged = !TACO_T && STAGE && vout && vpay && (t0 + 1024 <= count);
    // per-group scale(s)
#if OP == 2
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
#if PREFETCH2
    uint4 c0 = n0, c1 = n1;
    if (staged) {
      s = ns;
      alpha = na;
      if (tile + stride < nstaged) fetch(tile + stride);
    } else if (g < K) {
      taco_load_scales(pay, ncodes, K, g, a4, s, alpha);
    }
#else
    if (g < K) taco_load_scales(pay, ncodes, K, g, a4, s, alpha);
#endif
#else
    float scale = 0.0f;
    if (g < K) scale = as_f(ld32(pay + count + 4 * g, a4));
#endif
    u32 cw[8];
#if ACC
    uint4 acc[8];
#endif
    if (staged) {
#if !PREFETCH2
      const uint4* cp = (const uint4*)(pay + t0);
      const uint4 c0 = ldg4(cp + lane), c1 = ldg4(cp + 32 + lane);
#endif
#if ACC
      const uint4* ap = (const uint4*)(ob + t0 * 4);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = ap[j * 32 + lane];
#endif
      sb[swz(lane)] = c0;
      sb[swz(32 + lane)] = c1;
      __syncwarp();
      const uint4 d0 = sb[swz(2 * lane)], d1 = sb[swz(2 * lane + 1)];
      __syncwarp();
      cw[0] = d0.x; cw[1] = d0.y; cw[2] = d0.z; cw[3] = d0.w;
      cw[4] = d1.x; cw[5] = d1.y; cw[6] = d1.z; cw[7] = d1.w;
    } else if (base + 32 <= ncodes) {
      load_bytes32(pay + base, cw, vpay);
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) cw[r] = 0;
#pragma unroll
      for (int r = 0; r < 32; ++r)
        if (base + r < ncodes) cw[r >> 2] |= (u32)pay[base + r] << (8 * (r & 3));
    }
    float v[32];
#if OP == 2
    taco_dequant_lane(cw, s, alpha, lig, v);
#else
#pragma unroll
    for (int r = 0; r < 32; ++r) v[r] = f_mul(int8_float(int8_code(cw, r)), scale);
#endif
    // ---- output
    if (staged) {
#if ACC
      uint4* op = (uint4*)(ob + t0 * 4);
#pragma unroll
      for (int j = 0; j < 8; ++j) sb[swz(j * 32 + lane)] = acc[j];
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint4 q = sb[swz(lane * 8 + j)];
        q.x = as_u(f_add(as_f(q.x), v[4 * j]));
        q.y = as_u(f_add(as_f(q.y), v[4 * j + 1]));
        q.z = as_u(f_add(as_f(q.z), v[4 * j + 2]));
        q.w = as_u(f_add(as_f(q.w), v[4 * j + 3]));
        sb[swz(lane * 8 + j)] = q;
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) op[j * 32 + lane] = sb[swz(j * 32 + lane)];
      __syncwarp();
#else
      u32 ow[NW];
      pack_out32(v, ow);
      staged_store<CPL>((uint4*)(ob + t0 * EB), sb, lane, ow);
#endif
    } else if (base < count) {
#if ACC
      float* o = (float*)ob + base;
      if (vout && base + 32 <= count) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint4 q = ((uint4*)o)[j];
          q.x = as_u(f_add(as_f(q.x), v[4 * j]));
          q.y = as_u(f_add(as_f(q.y), v[4 * j + 1]));
          q.z = as_u(f_add(as_f(q.z), v[4 * j + 2]));
          q.w = as_u(f_add(as_f(q.w), v[4 * j + 3]));
          ((uint4*)o)[j] = q;
        }
      } else {
#pragma unroll
        for (int r = 0; r < 32; ++r)
          if (base + r < count) o[r] = f_add(o[r], v[r]);
      }
#else
      store_out32(ob, base, count, vout, v);
#endif
    }
  }
}
#endif

// ============================================ int8 with any group size (5: encode)
#if OP == 5
DEV u32 elem_absraw(u32 h) {
#if XT == 0
  return h & 0x7fffffffu;
#else
  return h & 0x7fffu;
#endif
}

DEV float elem_raw_f32(u32 h) {
#if XT == 0
  return as_f(h);
#elif XT == 2
  return as_f(h << 16);
#else
  return h2f(h);
#endif
}

// One warp per group, lanes striding over its elements.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
  for (i64 g = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); g < K; g += (i64)gridDim.x * WARPS) {
    const i64 start = g * GS;
    const i64 end = start + GS < count ? start + GS : count;
    u32 mb = 0;
    for (i64 e = start + lane; e < end; e += 32) mb = max(mb, elem_absraw(load_elem_raw(xb, e)));
#pragma unroll
    for (int t = 1; t < 32; t <<= 1) mb = max(mb, (u32)__shfl_xor_sync(FULL_MASK, mb, t));
    const bool bad = mb >= INF_BITS;
    bool tiny;
    const float scale = int8_scale(mb, bad, elem_raw_f32(mb), tiny);
    const float inv = mb != 0 ? f_div(as_f(BITS_ONE), scale) : 0.0f;
    for (i64 e = start + lane; e < end; e += 32) {
      const float x = elem_raw_f32(load_elem_raw(xb, e));
      const int q = int8_clamp(f2i_rn(tiny ? f_div(x, scale) : f_mul(x, inv)));
      pay[e] = bad ? (unsigned char)0 : (unsigned char)(q & 0xff);
    }
    if (lane == 0) st32(pay + count + 4 * g, bad ? BITS_NAN : as_u(scale), a4);
  }
}
#endif

// ============================================ int8 with any group size (6: decode)
#if OP == 6
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  const unsigned char* pay = (const unsigned char*)src;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
  for (i64 e = (i64)blockIdx.x * THREADS + threadIdx.x; e < count; e += (i64)gridDim.x * THREADS) {
    const float scale = as_f(ld32(pay + count + 4 * (e / GS), a4));
    const int q = (int)(signed char)pay[e];
    const float v = f_mul(int8_float(q), scale);
#if ACC
    ((float*)dst)[e] = f_add(((float*)dst)[e], v);
#elif XT == 0
    ((float*)dst)[e] = v;
#else
    ((unsigned short*)dst)[e] = (unsigned short)out_bits1(v);
#endif
  }
}
#endif

// ============================================ taco ring hop: decode, add own, encode (8)
// One hop of a ring ReduceScatter in one pass: pout = encode(float32(own) + decode(pin)),
// own holding `count` elements of type XT, pin and pout taco payloads of `count` elements.
// Bitwise what the three-kernel path gives (acc = own; decode-accumulate pin into acc;
// encode acc): the decode is kernel 2's arithmetic, the addition is its accumulate
// (acc + decoded, one rounding), positions past `count` are zero as an encode of acc reads
// them, and the encode is taco_encode_lane, which every encode kernel shares. With DEC
// the same pass writes dec = decode(pout) (kernel 2's arithmetic on the codes and scales
// in hand), so the last hop of an AllReduce needs no decode kernel after it. Layout of the
// fast kernels (32 elements per lane, tiles of 1024). With STAGE a whole tile whose
// buffers are 16-byte aligned is read and written through shared memory in coalesced
// 16-byte accesses (all of its loads issued before any is used); other tiles per lane.
#if OP == 8
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) coccl_codec(HOP_PARAMS) {
#if STAGE
  __shared__ uint4 smem[WARPS * 32 * CPL];
  uint4* sb = smem + (threadIdx.x >> 5) * 32 * CPL;
#endif
  const int lane = threadIdx.x & 31;
  const int lig = lane & (LPG - 1);
  const HopIo io = hop_io(own, src, dst, HOP_DEC_ARG);
  const char* xb = io.xb;
  const unsigned char* pin = io.pin;
  unsigned char* pout = io.pout;
  const bool vin = io.vin, vpi = io.vpi, vpo = io.vpo;
  const bool a4i = (((u64)pin) & 3) == 0;
  const bool a4o = (((u64)pout) & 3) == 0;
  const i64 ncodes = K << LOG2_GS;  // a multiple of 32: a lane's codes are all in or all out
  const i64 ntiles = (ncodes + 1023) >> 10;
  // Whole warps iterate together (a group's lanes shuffle); a lane past the last group
  // computes on zeros and stores nothing.
  for (i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); tile < ntiles;
       tile += (i64)gridDim.x * WARPS) {
    const i64 t0 = tile << 10;
    const i64 base = t0 + lane * 32;
    const i64 g = base >> LOG2_GS;
    const bool live = base < ncodes;
#if STAGE
    const bool staged = vin && vpi && vpo && io.vout && t0 + 1024 <= count;
#endif
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    u32 cw[8], w[NW];
    if (live) taco_load_scales(pin, ncodes, K, g, a4i, s, alpha);
#if STAGE
    if (staged) {
      uint4 tc[2], tx[CPL];
      const uint4* gc = (const uint4*)(pin + t0);
      const uint4* gx = (const uint4*)(xb + t0 * EB);
#pragma unroll
      for (int j = 0; j < 2; ++j) tc[j] = ldg4(gc + j * 32 + lane);
#pragma unroll
      for (int j = 0; j < CPL; ++j) tx[j] = ldg4(gx + j * 32 + lane);
      staged_transpose<2>(tc, sb, lane, cw);
      staged_transpose<CPL>(tx, sb, lane, w);
    } else
#endif
    {
      if (live) {
        load_bytes32(pin + base, cw, vpi);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) cw[i] = 0;
      }
      lane_load(xb, base, count, vin, w);  // zero past count
    }
    float v[32];
    taco_dequant_lane(cw, s, alpha, lig, v);
#pragma unroll
    for (int r = 0; r < 32; ++r) v[r] = base + r < count ? f_add(elem_f32(w, r), v[r]) : 0.0f;
    u32 codes[8], sbits, abits;
    taco_encode_lane<32, LPG>(v, lig, codes, sbits, abits);
#if STAGE
    if (staged)
      staged_store<2>((uint4*)(pout + t0), sb, lane, codes);
    else
#endif
    if (live)
      store_bytes32(pout + base, codes, vpo, 32);
    if (live && lig == 0) taco_store_scales(pout, ncodes, K, g, a4o, sbits, abits);
#if DEC
    taco_dequant_encoded(codes, sbits, abits, lig, v);
#if STAGE
    if (staged) {
      u32 ow[NW];
      pack_out32(v, ow);
      staged_store<CPL>((uint4*)(io.ob + t0 * EB), sb, lane, ow);
    } else
#endif
    if (live)
      store_out32(io.ob, base, count, io.vout, v);
#endif
  }
}
#endif

// ============================================ int8 ring hop: decode, add own, encode (9)
// Kernel 8's int8 twin: pout = int8_encode(float32(own) + int8_decode(pin)), own holding
// `count` elements of type XT, pin and pout int8 payloads of `count` elements (count
// codes, then K float32 scales at byte count). Bitwise the three-kernel path: kernel 4's
// decode and accumulate (acc + q * scale, one rounding each), then kernel 3's quantizer
// on the float32 sum (whose infinity is float32's); positions past `count` are zero, which
// leaves a partial group's absmax as an encode of the `count` elements finds it.
#if OP == 9
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) coccl_codec(HOP_PARAMS) {
  const int lane = threadIdx.x & 31;
  const int lig = lane & (LPG - 1);
  const HopIo io = hop_io(own, src, dst, HOP_DEC_ARG);
  const char* xb = io.xb;
  const unsigned char* pin = io.pin;
  unsigned char* pout = io.pout;
  const bool vin = io.vin, vpi = io.vpi, vpo = io.vpo;
  const bool a4i = (((u64)pin + (u64)count) & 3) == 0;
  const bool a4o = (((u64)pout + (u64)count) & 3) == 0;
  const i64 ntiles = (count + 1023) >> 10;
  // Whole warps iterate together (a group's lanes shuffle); a lane past `count` computes
  // on zeros and stores nothing.
  for (i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); tile < ntiles;
       tile += (i64)gridDim.x * WARPS) {
    const i64 base = (tile << 10) + lane * 32;
    const i64 g = base >> LOG2_GS;
    float scale = 0.0f;
    u32 cw[8];
    if (base < count) scale = as_f(ld32(pin + count + 4 * g, a4i));
    if (base + 32 <= count) {
      load_bytes32(pin + base, cw, vpi);
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) cw[r] = 0;
#pragma unroll
      for (int r = 0; r < 32; ++r)
        if (base + r < count) cw[r >> 2] |= (u32)pin[base + r] << (8 * (r & 3));
    }
    u32 w[NW];
    lane_load(xb, base, count, vin, w);  // zero past count
    float v[32];
    u32 m = 0;
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      const float fq = int8_float(int8_code(cw, r));
      v[r] = base + r < count ? f_add(elem_f32(w, r), f_mul(fq, scale)) : 0.0f;
      m = max(m, as_u(v[r]) & 0x7fffffffu);
    }
    const u32 mb = group_umax(m);
    u32 codes[8], sbits;
    int8_quantize_lane(v, mb, 0x7f800000u, as_f(mb), codes, sbits);
    if (base < count) {
      const i64 left = count - base;
      store_bytes32(pout + base, codes, vpo, left >= 32 ? 32 : (int)left);
      if (lig == 0) st32(pout + count + 4 * g, sbits, a4o);
#if DEC
      // dec = decode(pout): kernel 4's arithmetic on the codes and scale in hand
#pragma unroll
      for (int r = 0; r < 32; ++r) v[r] = f_mul(int8_float(int8_code(codes, r)), as_f(sbits));
      store_out32(io.ob, base, count, io.vout, v);
#endif
    }
  }
}
#endif
