// coccl GPU kernels of the microscaled codecs, part 2 of 4: the mx payload's offsets and
// the mx encode's chunk bodies (OP 1: bfloat16 pairs, the E4M3 scale's division-free
// quotients, the plain float32 path). Compiled after mx_kernels.cu (the defines, which its
// header documents, the element layout and the helpers) and before mx_decode_kernels.cu,
// as one source: mx_gpu.MX_SOURCES.

// ====================================================================== mx
#if OP == 1 || OP == 2 || OP == 3 || OP == 6
#define SCALE_OFF(K) ((K) * BPB)
#define TENSOR_OFF(K) ((K) * BPB + (K))
#endif

#if OP == 1 && PAIRS
// The codes of the two bfloat16 elements of word x, scaled by s2 (2^-e in both halves): each
// half of the result holds its element's code magnitude in its low CBITS - 1 bits, the
// sign at bit 15, exponent bits of no use at bits 7-14 and zeros elsewhere. The same codes
// as elem_code_abs of |x| * 2^-e in float32, by the same rounding done in bfloat16:
//   y = x 2^-e is exact wherever it is a normal bfloat16 (below that its code is 0 whatever
//     the rounding: |y| < 2^-126 is far under half the smallest element step);
//   the binade's exponent field Y = max(that of y, E0), E0 that of the smallest normal
//     element, gives the addend A: exponent field Y + 7 - MBITS, so that A's ulp is the
//     binade's element step, and mantissa field (Y - E0) << MBITS, the code's exponent part;
//   |y| + A, rounded to nearest even, is then A + round(|y| / step) ulps (the sum stays
//     below twice A's power of two: the mantissa field stays under 2^(MBITS+1) + 24 < 2^7;
//     and (Y - E0) << MBITS is even, so ties go to the same side): its mantissa field is
//     the code magnitude. Adding A with y's sign keeps the sign (rounding is symmetric);
//   |y| is not clamped to qmax first: past it (its binade is qmax's) the sum rounds to the
//     top code or one past it, and the min with the top code's bits saturates it.
#define E0 (128 - BIAS)
#define ADD_C ((u32)((7 - MBITS) << 7) - (u32)(E0 << MBITS))  // A = Y (2^7 + 2^MBITS) + ADD_C
#define TOP_BITS ((u32)((127 + EMAX + 7 - MBITS) << 7) | ((1u << (CBITS - 1)) - 1u))
DEV u32 pair_codes(u32 x, u32 s2) {
  const u32 y = bf2_mul(x, s2);
  const u32 z = bf2_max_abs(y, (u32)(E0 << 7) * 0x10001u);  // |y|, at least 2^(E0 - 127)
  const u32 yu = mulhi(z & 0x7f807f80u, 1u << 25);  // Y in each half: (z >> 7) by halves
  // Per half A is below 2^15 and the 32-bit sum's halves never carry into each other.
  const u32 a = yu * ((1u << 7) + (1u << MBITS)) + ADD_C * 0x10001u;
  const u32 t = bf2_add(y, a | (y & 0x80008000u));
  return bf2_min_abs(t, TOP_BITS * 0x10001u);
}

// The lane's WPL code words from the pair_codes t[0..EPL/2) of its elements (FORMAT.md:
// FP4 two to a byte, low nibble first; FP6 four to three bytes, little-endian).
DEV void pack_pairs(const u32* t, u32* w) {
#if CBITS == 4
  u32 p[4];
  for (int k = 0; k < 4; ++k) {
    // v: the two magnitudes (bits 0-2, 16-18) and signs (15, 31); byte 0 of
    // v + (v >> 12) + (v >> 24) is then the pair's byte: its terms there have disjoint
    // bits, and the high word of v * (2^20 + 2^8) is (v >> 12) + (v >> 24) exactly (the
    // low words' sum stays below 2^32: v's low 24 bits are below 2^20).
    const u32 v = t[k] & 0x80078007u;
    p[k] = v + mulhi(v, 0x00100100u);
  }
  w[0] = prmt(prmt(p[0], p[1], 0x0040u), prmt(p[2], p[3], 0x0040u), 0x5410u);
#else
  u32 g[4];
  for (int q = 0; q < 4; ++q) {
    // Each half's 6-bit code (magnitude, sign at bit 5) in c, pair 2q and 2q + 1 then
    // regrouped by halves: lo holds elements 4q and 4q + 2, hi 4q + 1 and 4q + 3.
    u32 c[2];
    for (int i = 0; i < 2; ++i) {
      const u32 v = t[2 * q + i];
      c[i] = (v & 0x001f001fu) | ((v >> 10) & 0x00200020u);
    }
    const u32 lo = prmt(c[0], c[1], 0x5410u), hi = prmt(c[0], c[1], 0x7632u);
    const u32 d = lo + (hi << 6);  // two 12-bit halves: elements 4q, 4q+1 | 4q+2, 4q+3
    g[q] = d - (d >> 16) * 0xf000u;  // the high half moved down to bit 12: 24 bits
  }
  w[0] = g[0] | (g[1] << 24);
  w[1] = (g[1] >> 8) | (g[2] << 16);
  w[2] = (g[2] >> 16) | (g[3] << 8);
#endif
}

// Chunk j of the payload (lanes of block j / LPB) from its elements' pairs xw (load_pairs).
// Every lane runs it (the shuffles); a dead one (past the payload) stores nothing.
DEV void chunk_body(u8* pay, i64 K, i64 j, const u32* xw, float s, bool live) {
  (void)s;
  u32 m = 0, t[EPL / 2], w[WPL];
  for (int k = 0; k < EPL / 2; ++k) m = bf2_amax(m, xw[k]);
  m = bf2_amax(m, prmt(m, 0, 0x1032u));  // and with its halves swapped: both hold the max
  const u32 amax = group_max(m & 0x7fff0000u);  // as float32 bits
  if (!live) return;
  // FORMAT.md: e = floor(log2(amax)) - EMAX, at least -127 (also for a subnormal amax);
  // at most 125 for a finite amax: the scale byte e + 127 and 2^-e are then direct.
  u32 sc = umax(amax >> 23, EMAX) - EMAX;
  const u32 s2 = ((254u - sc) << 7) * 0x10001u;  // 2^-e in both halves (a normal bfloat16)
  for (int k = 0; k < EPL / 2; ++k) t[k] = pair_codes(xw[k], s2);
  pack_pairs(t, w);
  if (amax >= BITS_INF) {  // FORMAT.md: a NaN scale, zero codes
    for (int q = 0; q < WPL; ++q) w[q] = 0;
    sc = E8M0_NAN;
  }
  store_words(pay + j * (4 * WPL), w, alignment(pay));
  const unsigned long long ju = (unsigned long long)j;  // j >= 0: no signed division
  if (ju % LPB == 0) pay[SCALE_OFF(K) + ju / LPB] = (u8)sc;
}
#elif OP == 1 && SC
// FORMAT.md's E4M3 encode divides twice per block and once per element; here every
// quotient is the same float32 (round to nearest even), without a division instruction:
//   * q = a / b for a whole block's b (the elements' x / d): Markstein's correction
//     q' = RN(q + (a - b q) y), with y = RN(1 / b) and q within an ulp of a / b, is the
//     rounded quotient (the remainder a - b q is exact: one fma); it is applied twice from
//     q = RN(a y), whose error may exceed an ulp by a little, so that the second starts
//     within one. That holds where nothing underflows: b in [2^-96, 2^100] and a / b at
//     least 2^-7 (b q's bits then lie on multiples of 2^-149, so a - b q is a float; the
//     elements a / b below 2^-7 get code 0 whatever their last bits: every format's first
//     code boundary is 2^-5 or more, and the quotient, though inexact, stays far below
//     it), which S in [2^-87, 2^87] ensures (b = value(sb) S, value(sb) in [2^-9, 448]).
//   * everything else (amax / S, that / qmax; an S outside that range: x / d): in double,
//     from a reciprocal within 2^-52 of 1 / b (recip) and one mul.rn.f64, then rounded to
//     float32. A quotient of float32 numbers lies at least 2^-49 of its size away from any
//     float32 rounding boundary (a midpoint: b * mid has at most 49 significant bits and
//     a - b * mid is not 0), so a double within 2^-51 of it rounds to the same float32
//     (with subnormal results too: the boundaries are then coarser).
struct E4m3Payload {
  float s;    // S
  double ys;  // 1 / S within 2^-52 (recip)
  float p;    // 1, or for S outside [2^-87, 2^87] the power of two that puts S p in [1, 2)
  bool fast;  // S within it: x / d by Markstein's correction in float32
};

// 1 / b as a double within 2^-52 of it, for b and 1 / b normal floats: the hardware's
// approximation (within an ulp: 2^-23; the emulation's is 1 / b rounded), then two Newton
// steps y (2 - b y) in double, each squaring the error (2^-46, then below 2^-52).
DEV double recip(float b) {
  const double bd = d_of(b);
  double y = d_of(rcp_approx(b));
  for (int k = 0; k < 2; ++k) y = d_fma(y, d_fma(-bd, y, 1.0), y);
  return y;
}

DEV E4m3Payload e4m3_payload(float s) {  // s: S, a normal float (the S launch's)
  const u32 es = as_u(s) >> 23;             // S's biased exponent, 1..244
  const bool fast = es >= 127 - 87 && es <= 127 + 87;
  return {s, recip(s), fast ? 1.0f : as_f((254u - es) << 23), fast};
}

// RN(a / b) for a >= 0 from y = RN(1 / b) and nb = -b (see above for where it holds).
DEV float div_markstein(float a, float nb, float y) {
  const float q0 = f_mul(a, y);
  const float q1 = f_fma(f_fma(nb, q0, a), y, q0);
  return f_fma(f_fma(nb, q1, a), y, q1);
}

#if E4M3_WORDS
// xb: the lane's EPL / 2 words of two 16-bit elements, the first in the low half. Both
// formats order their magnitudes as integers, NaN and Inf above every finite one.
DEV u32 chunk_amax(const u32* xb) {  // as float32 bits; NaN and Inf at or above BITS_INF
  u32 m = 0;
  for (int k = 0; k < EPL / 2; ++k) m = __vmaxu2(m, xb[k] & 0x7fff7fffu);
  return half_bits(umax(m & 0xffffu, m >> 16));
}
DEV u32 elem_bits(const u32* xb, int i) {  // element i as float32 bits
  return half_bits(i & 1 ? xb[i >> 1] >> 16 : xb[i >> 1] & 0xffffu);
}
#else
// xb: the lane's EPL elements as float32 bits.
DEV u32 chunk_amax(const u32* xb) { return lane_amax(xb); }
DEV u32 elem_bits(const u32* xb, int i) { return xb[i]; }
#endif

// Chunk j of the payload (lanes of block j / LPB) from its elements xb; g: from S.
// Every lane runs it (the shuffles); a dead one (past the payload) stores nothing.
DEV void chunk_body(u8* pay, i64 K, i64 j, const u32* xb, const E4m3Payload& g, bool live) {
  u32 c[EPL], w[WPL];
  const u32 amax = group_max(chunk_amax(xb));
  if (!live) return;
  // FORMAT.md: sb = e4m3((amax / S) / qmax), d = value(sb) * S (garbage for a bad block)
  const float t = f_of(d_mul(d_of(as_f(amax)), g.ys));
  u32 sc = e4m3_code(f_of(d_mul(d_of(t), 1.0 / QMAX_VAL)));
  const float den = f_mul(f_mul(as_f(sc << 20), as_f(0x7b800000u)), g.s);  // value * 2^120
  const float dp = f_mul(den, g.p);  // exact: a normal float
  const double yd = recip(dp);
  if (g.fast) {
    const float y = f_of(yd), nb = -dp;
    for (int i = 0; i < EPL; ++i) {
      const u32 b = elem_bits(xb, i);
      c[i] = elem_code_abs(as_u(div_markstein(as_f(b & 0x7fffffffu), nb, y)), b);
    }
  } else {
    const double y = d_mul(yd, d_of(g.p));  // 1 / d: exact scaling
    for (int i = 0; i < EPL; ++i) {
      const u32 b = elem_bits(xb, i);
      c[i] = elem_code_abs(as_u(f_of(d_mul(d_of(as_f(b & 0x7fffffffu)), y))), b);
    }
  }
  pack_words(c, w);
  if (amax >= BITS_INF || sc == 0) {  // FORMAT.md: zero codes; a NaN scale for a bad block
    for (int q = 0; q < WPL; ++q) w[q] = 0;
    if (amax >= BITS_INF) sc = E4M3_NAN;
  }
  store_words(pay + j * (4 * WPL), w, alignment(pay));
  const unsigned long long ju = (unsigned long long)j;  // j >= 0: no signed division
  if (ju % LPB == 0) pay[SCALE_OFF(K) + ju / LPB] = (u8)sc;
}
#elif OP == 1
// Chunk j of the payload (lanes of block j / LPB) from its elements xb.
// Every lane runs it (the shuffles); a dead one (past the payload) stores nothing.
DEV void chunk_body(u8* pay, i64 K, i64 j, const u32* xb, float s, bool live) {
  (void)s;
  u32 c[EPL], w[WPL];
  const u32 amax = group_max(lane_amax(xb));
  if (!live) return;
  u32 sc;
  if (amax >= BITS_INF) {  // FORMAT.md: a NaN scale, zero codes
    for (int i = 0; i < EPL; ++i) c[i] = 0;
    sc = E8M0_NAN;
  } else {
    int e = amax == 0 ? -127 : floor_log2_bits(amax) - EMAX;
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    const float inv = pow2(-e);
    for (int i = 0; i < EPL; ++i)  // |x| * 2^-e is |x * 2^-e|: the abs taken once
      c[i] = elem_code_abs(as_u(f_mul(as_f(xb[i] & 0x7fffffffu), inv)), xb[i]);
    sc = (u32)(e + 127);
  }
  pack_words(c, w);
  store_words(pay + j * (4 * WPL), w, alignment(pay));
  if (j % LPB == 0) pay[SCALE_OFF(K) + j / LPB] = (u8)sc;
}
#endif
