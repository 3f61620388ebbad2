// coccl GPU kernels of the microscaled codecs, part 2 of 2: the mx and taco_fp kernels
// and the entry points. Compiled after mx_kernels.cu (the defines, which its header
// documents, the element layout and the helpers), as one source: mx_gpu.MX_SOURCES.

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

#if OP == 2
// Chunk j's decoded values y[0..EPL).
DEV void decode_chunk(const u8* pay, i64 K, i64 j, float s, float* y) {
  (void)s;
  u32 w[WPL];
  load_words(pay + j * (4 * WPL), w, alignment(pay));
  const u32 sc = pay[SCALE_OFF(K) + j / LPB];
#if SC
  const float d = f_mul(e4m3_value(sc), s);
  for (int i = 0; i < EPL; ++i) y[i] = sat_inf(f_mul(elem_value(code_at(w, i)), d));
#else
  const float d = sc == E8M0_NAN ? as_f(BITS_NAN) : pow2((int)sc - 127);
  for (int i = 0; i < EPL; ++i) y[i] = f_mul(elem_value(code_at(w, i)), d);
#endif
}

// A decode's lane writes EPL elements, SCH 16-byte chunks of out (float32 for a
// decode-accumulate); where that is more than one, its own 16-byte stores stride by EPL
// elements (for float32 MXFP4 each store instruction writes half of every 32-byte sector it
// touches), so a warp whose 32 chunks are whole stores them through its shared-memory
// buffer instead: lanes write their chunks to it, then store consecutive 16-byte pieces of
// the warp's span. A decode-accumulate first loads the span into the buffer the same way
// (consecutive pieces, lane by lane) and each lane adds its y to its own chunks there.
#define OUT_BYTES (ACC || XT == 0 ? 4 : 2)  // bytes per element of out
#define SCH (EPL * OUT_BYTES / 16)
#define STAGED (SCH > 1)
DEV int swz(int c) { return c ^ ((c >> 3) & 7); }  // 16-byte chunk -> slot: no bank conflict

// The warp's span out[w0, w0 + 32 EPL) from its lanes' y (with ACC: out + y, the same
// f_add as store_chunk's), through sb (32 SCH slots).
DEV void store_span(void* out, i64 w0, uint4* sb, int lane, const float* y) {
  uint4* o = (uint4*)((char*)out + w0 * OUT_BYTES);
#if ACC
  for (int c = 0; c < SCH; ++c) sb[swz(c * 32 + lane)] = o[c * 32 + lane];
  __syncwarp();
#endif
  for (int c = 0; c < SCH; ++c) {
#if ACC
    const uint4 t = sb[swz(lane * SCH + c)];
    sb[swz(lane * SCH + c)] = make_uint4(
        as_u(f_add(as_f(t.x), y[4 * c])), as_u(f_add(as_f(t.y), y[4 * c + 1])),
        as_u(f_add(as_f(t.z), y[4 * c + 2])), as_u(f_add(as_f(t.w), y[4 * c + 3])));
#elif XT == 0
    sb[swz(lane * SCH + c)] =
        make_uint4(as_u(y[4 * c]), as_u(y[4 * c + 1]), as_u(y[4 * c + 2]), as_u(y[4 * c + 3]));
#else
    sb[swz(lane * SCH + c)] = make_uint4(
        out_pair(y[8 * c], y[8 * c + 1]), out_pair(y[8 * c + 2], y[8 * c + 3]),
        out_pair(y[8 * c + 4], y[8 * c + 5]), out_pair(y[8 * c + 6], y[8 * c + 7]));
#endif
  }
  __syncwarp();
  for (int c = 0; c < SCH; ++c) o[c * 32 + lane] = sb[swz(c * 32 + lane)];
  __syncwarp();
}
#endif

#if OP == 2
// The decodes that overwrite a float32 or bfloat16 out (FAST) take, for every whole warp
// span with out 16-byte and the payload 4-byte aligned, a lean path: the UNR chunks' code
// words and scale bytes of a grid step are loaded during the step before, then decoded
// and stored (16-byte pieces, through store_span_words where a lane has more than one).
// Everything else, and a float16 out or a decode-accumulate, goes through decode_chunk and
// store_chunk as before.
#define FAST (!ACC && XT != 1)
// With an E8M0 scale the decode computes two elements per instruction on bf16x2 (sm_90;
// older GPUs run the float32 arithmetic, the same values). DEC_PAIRS: that arithmetic.
#if defined(MX_HOST) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define DEC_PAIRS (FAST && SC == 0)
#else
#define DEC_PAIRS 0
#endif
#define OUT_WORDS (EPL * OUT_BYTES / 4)  // 32-bit words of out a lane writes

#if FAST
// Codes 2k and 2k + 1 of the lane's words w, in the low bits of each half (the rest zero).
DEV u32 code_pair(const u32* w, int k) {
#if CBITS == 4
  // FP4: byte k of w holds both; the even codes' nibbles (lo) and the odd ones' (hi) are
  // picked into bytes 0 and 2, bytes 1 and 3 made zero (prmt's sign mode on a byte of lo,
  // whose top bit is 0).
  const u32 lo = w[0] & 0x0f0f0f0fu, hi = (w[0] >> 4) & 0x0f0f0f0fu;
  return prmt_sx(lo, hi, (u32)k | 0x80u | ((u32)(4 + k) << 8) | 0x8000u);
#elif CBITS == 6
  // FP6: the pair is 12 bits t of the 24-bit group k / 2 (bits 24 (k / 2) .. of w's 96);
  // the upper code moves from bit 6 to bit 16 by adding its part of t, (t & 0xfc0), times
  // 2^10 - 1.
  const int q = k >> 1;
  const u32 g = q == 0   ? w[0]
                : q == 1 ? (w[0] >> 24) | (w[1] << 8)
                : q == 2 ? (w[1] >> 16) | (w[2] << 16)
                         : w[2] >> 8;
  const u32 t = (k & 1 ? g >> 12 : g) & 0xfffu;
  return t + (t & 0xfc0u) * 1023u;
#else
  return code_at(w, 2 * k) | (code_at(w, 2 * k + 1) << 16);
#endif
}

// Codes 2k and 2k + 1 as raw bfloat16s, the first in the low half: each code's magnitude
// bits at the bottom of the exponent field (exponent bits from 7 up, mantissa bits just
// below), its sign at bit 15; the code's value times 2^(BIAS - 127) (a subnormal for a
// subnormal code). Shifted 16 bits up, a half is the same as a float32.
#define MAG2 ((((1u << (CBITS - 1)) - 1u) << (7 - MBITS)) * 0x10001u)
DEV u32 raw_pair(const u32* w, int k) {
  const u32 p = code_pair(w, k);
  // The magnitude moved up by 7 - MBITS, the sign by 16 - CBITS: as p's halves hold CBITS
  // bits each, neither shift puts a bit where the other's mask keeps one: one mask does.
  // Where the two shifted copies do not overlap (e2m1, e2m3) their sum is their or: one
  // multiply.
#if 7 - MBITS + CBITS <= 16 - CBITS
  const u32 both = p * ((1u << (7 - MBITS)) + (1u << (16 - CBITS)));
#else
  const u32 both = (p << (7 - MBITS)) | (p << (16 - CBITS));
#endif
  return both & (MAG2 | 0x80008000u);
}
#endif

#if DEC_PAIRS
// The value of code c times 2^(sc - 127), for E8M0 byte sc, in bfloat16: exact, as the
// float32 path's f_mul(elem_value(c), 2^(sc - 127)) rounded to bfloat16 is (that product
// has at most 4 significant bits, so it is a bfloat16 unless it overflows to Inf, which
// both do; its smallest nonzero magnitude, the smallest element times 2^-127, is at least
// 2^-131, above bfloat16's smallest subnormal 2^-133). Computed per pair of elements:
//   raw_pair, times 2^(127 - BIAS): the codes' values, exact;
//   times 2^(sc - 127) (sc 0: 2^-127, a subnormal bfloat16; sc 255: NaN): the result,
//     rounded once by the instruction, and exact by the above.
DEV u32 scale_pair(u32 sc) {  // 2^(sc - 127) in both halves; NaN for 255
  const u32 b = (sc << 7) | (sc == 0 || sc == E8M0_NAN ? 0x40u : 0u);
  return b * 0x10001u;
}

// The lane's EPL values from its code words w, two to a word, the first in the low half.
DEV void chunk_pairs(const u32* w, u32 s2, u32* r) {
  const u32 norm = ((254u - BIAS) << 7) * 0x10001u;  // 2^(127 - BIAS) in both halves
  for (int k = 0; k < EPL / 2; ++k) r[k] = bf2_mul(bf2_mul(raw_pair(w, k), norm), s2);
}
#endif

#if FAST
// Chunk j's decoded values, as the OUT_WORDS words of out they fill; sc its scale byte.
DEV void chunk_out(const u32* w, u32 sc, float s, u32* o) {
#if DEC_PAIRS
  (void)s;
  u32 r[EPL / 2];
  chunk_pairs(w, scale_pair(sc), r);
#if XT == 2
  for (int k = 0; k < EPL / 2; ++k) o[k] = r[k];
#else
  for (int k = 0; k < EPL / 2; ++k) o[2 * k] = r[k] << 16, o[2 * k + 1] = r[k] & 0xffff0000u;
#endif
#else
  float y[EPL];
#if SC
  // d = e4m3_value(sc) S: the scale's magnitude bits read as a float32 times 2^120 (exact),
  // NaN for the NaN codes.
  const u32 m = sc & 0x7fu;
  const float v = as_f(as_u(f_mul(as_f(m << 20), as_f(0x7b800000u))) | ((sc >> 7) << 31));
  const float d = m == E4M3_NAN ? as_f(BITS_NAN) : f_mul(v, s);
  // y = sat_inf(elem_value(c) d). elem_value is raw(c) 2^(127 - BIAS), exact, with raw(c)
  // the code's bits placed in a float32 (raw_pair's halves: its value times
  // 2^(BIAS - 127)); so where dn = d 2^(127 - BIAS) is not infinite (it is exact then, and
  // NaN for a NaN d) one multiply raw(c) dn gives the same product, rounded once.
  const float dn = f_mul(d, as_f((254u - BIAS) << 23));
  if ((as_u(dn) & 0x7fffffffu) != BITS_INF) {
    for (int k = 0; k < EPL / 2; ++k) {
      const u32 r = raw_pair(w, k);
      y[2 * k] = f_mul(as_f(r << 16), dn);
      y[2 * k + 1] = f_mul(as_f(r & 0xffff0000u), dn);
    }
  } else {
    for (int i = 0; i < EPL; ++i) y[i] = f_mul(elem_value(code_at(w, i)), d);
  }
  // ±Inf to ±FLT_MAX (sat_inf; NaN stays NaN). A bfloat16 out needs none: FLT_MAX rounds
  // to Inf there as Inf does.
#if XT == 0
  const float top = as_f(BITS_FLT_MAX);
  for (int i = 0; i < EPL; ++i) y[i] = f_min_nan(f_max_nan(y[i], -top), top);
#endif
#else
  (void)s;
  const float d = sc == E8M0_NAN ? as_f(BITS_NAN) : pow2((int)sc - 127);
  for (int i = 0; i < EPL; ++i) y[i] = f_mul(elem_value(code_at(w, i)), d);
#endif
#if XT == 2
  for (int k = 0; k < EPL / 2; ++k) o[k] = out_pair(y[2 * k], y[2 * k + 1]);
#else
  for (int i = 0; i < EPL; ++i) o[i] = as_u(y[i]);
#endif
#endif
}

// A step's code words and scale bytes of the lane's UNR chunks, from its first chunk's at
// cw and sp (zeros where !ok: the step lies past the whole spans).
DEV void load_step(const u32* cw, const u8* sp, bool ok, u32 (*w)[WPL], u32* sc) {
  for (int u = 0; u < UNR; ++u) {
    for (int q = 0; q < WPL; ++q) w[u][q] = ok ? __ldg(cw + 32 * WPL * u + q) : 0u;
    sc[u] = ok ? __ldg(sp + 32 / LPB * u) : 0u;
  }
}

// The warp's span of out at p (32 EPL elements) from its lanes' words o (OUT_WORDS each),
// through sb as store_span.
DEV void store_span_words(uint4* p, uint4* sb, int lane, const u32* o) {
  for (int c = 0; c < SCH; ++c)
    sb[swz(lane * SCH + c)] = make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
  __syncwarp();
  for (int c = 0; c < SCH; ++c) p[c * 32 + lane] = sb[swz(c * 32 + lane)];
  __syncwarp();
}
#endif
#endif

#if OP == 6
DEV float tensor_scale(u32 amax_bits) {  // S = max(amax / (448 * qmax), 2^-126)
  const float s = f_div(as_f(amax_bits), f_mul(as_f(BITS_448), as_f(QMAX_BITS)));
  return as_u(s) < BITS_MIN_NORMAL ? as_f(BITS_MIN_NORMAL) : s;
}
#endif

// ================================================================= taco_fp
#if OP == 4 || OP == 5
#define SCALE_OFF(K) ((K) * BPB)
#define ALPHA_OFF(K) ((K) * BPB + 4 * (K))

// The unnormalised Walsh-Hadamard transform of the group (FORMAT.md, taco step 2), stages
// h = 1 .. G/2 in order: within the lane's run for h < 32, then between the lanes of runs
// r and r ^ (h / 32) (the lower one keeps a + b, the upper a - b).
DEV void wht(float* v, int r) {
  for (int h = 1; h < EPL; h <<= 1)
    for (int i = 0; i < EPL; ++i)
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = f_add(a, b);
        v[i + h] = f_sub(a, b);
      }
  for (int m = 1; m < LPB; m <<= 1) {
    const bool lower = (r & m) == 0;
    for (int i = 0; i < EPL; ++i) {
      const float o = __shfl_xor_sync(FULL, v[i], m);
      v[i] = lower ? f_add(v[i], o) : f_sub(o, v[i]);
    }
  }
}
#endif

#if OP == 4
// The group's energy: the lane's run of 32 summed in order, then the pairwise tree over the
// runs (an xor butterfly: a + b is b + a, so every lane of the group ends with the root).
DEV float energy(const float* v) {
  float e = 0.0f;
  for (int j = 0; j < EPL; ++j) e = f_add(e, f_mul(v[j], v[j]));
  for (int m = 1; m < LPB; m <<= 1) e = f_add(e, __shfl_xor_sync(FULL, e, m));
  return e;
}

DEV void chunk_body(u8* pay, i64 K, i64 j, const u32* xb, bool live) {
  float v[EPL];
  u32 c[EPL], w[WPL];
  const int r = (int)(j % LPB);
  // Every lane runs every step (the shuffles); a bad or dead group's results are dropped.
  const bool bad = group_max(lane_amax(xb)) >= BITS_INF;
  const float qmax = as_f(QMAX_BITS), cinv = as_f(CINV_BITS);
  for (int i = 0; i < EPL; ++i) v[i] = as_f(xb[i]);
  const float m = f_div(energy(v), (float)BS);
  const u32 ab = as_u(f_div(qmax, f_sqrt(f_add(m, as_f(BITS_LAMBDA)))));  // >= 0
  float alpha = as_f(ab < BITS_1EM3 ? BITS_1EM3 : (ab > BITS_1E3 ? BITS_1E3 : ab));
  for (int i = 0; i < EPL; ++i) v[i] = f_mul(v[i], alpha);
  wht(v, r);
  u32 amax = 0;
  for (int i = 0; i < EPL; ++i) amax = umax(amax, as_u(v[i]) & 0x7fffffffu);
  amax = group_max(amax);
  int p = 127 - (int)(amax >> 23);  // step 4: a power of two toward [1, 2)
  p = p < -116 ? -116 : (p > 116 ? 116 : p);
  const float two = as_f((u32)(127 + p) << 23);
  alpha = f_mul(alpha, two);
  const float s = f_div(f_mul(f_mul(as_f(amax), two), cinv), qmax);
  const float kq = amax != 0 ? f_div(cinv, s) : 0.0f;
  for (int i = 0; i < EPL; ++i) c[i] = bad ? 0u : elem_code(as_u(f_mul(f_mul(v[i], two), kq)));
  if (!live) return;
  pack_words(c, w);
  const unsigned al = alignment(pay);
  store_words(pay + j * (4 * WPL), w, al);
  if (r == 0) {  // FORMAT.md step 6: NaN scales for a bad group
    const i64 k = j / LPB;
    const u32 sbits = bad ? BITS_NAN : as_u(s), abits = bad ? BITS_NAN : as_u(alpha);
    u8* ps = pay + SCALE_OFF(K) + 4 * k;
    u8* pa = pay + ALPHA_OFF(K) + 4 * k;
    if (al >= 4) {
      *(u32*)ps = sbits, *(u32*)pa = abits;
    } else {
      st32(ps, sbits), st32(pa, abits);
    }
  }
}
#endif

#if OP == 5
DEV void chunk_body(const u8* pay, void* out, i64 count, i64 K, i64 j, bool live, bool vec) {
  u32 w[WPL] = {0};
  float v[EPL];
  const unsigned al = alignment(pay);
  const i64 k = live ? j / LPB : 0;
  if (live) load_words(pay + j * (4 * WPL), w, al);
  for (int i = 0; i < EPL; ++i) v[i] = elem_value(code_at(w, i));
  wht(v, (int)(j % LPB));
  if (!live) return;
  const u8* ps = pay + SCALE_OFF(K) + 4 * k;
  const u8* pa = pay + ALPHA_OFF(K) + 4 * k;
  const u32 sbits = al >= 4 ? __ldg((const u32*)ps) : ld32(ps);
  const u32 abits = al >= 4 ? __ldg((const u32*)pa) : ld32(pa);
  const float sc = f_mul(as_f(sbits), as_f(CINV_BITS));
  const float ia = f_div(as_f(BITS_ONE), as_f(abits));
  for (int i = 0; i < EPL; ++i) v[i] = sat_inf(f_mul(f_mul(v[i], sc), ia));
  store_chunk(out, j * EPL, count, vec, v);
}
#endif

// ================================================================== entry
// Grid-stride over the chunks j < K * LPB: warp w of the grid takes chunks
// [32 UNR w, 32 UNR (w + 1)) + 32 UNR (number of warps) * step, lane l chunks l + 32 u.
#ifdef MX_HOST
#define RESTRICT
#else
#define RESTRICT __restrict__
#endif

#if OP == 6
extern "C" __global__ void __launch_bounds__(THREADS)
coccl_mx(const void* src, void* dst, i64 count, i64 K) {
  __shared__ u32 red[THREADS / 32];
  (void)src;
  u8* pay = (u8*)dst;  // reads partials, writes S: disjoint bytes of the payload
  u32 m = 0;
  for (i64 j = threadIdx.x; j < count; j += THREADS) m = umax(m, ld32(pay + 4 * j));
  m = block_max(m, red);
  if (threadIdx.x == 0) st32(pay + TENSOR_OFF(K), as_u(tensor_scale(m)));
}
#elif OP == 3
extern "C" __global__ void __launch_bounds__(THREADS)
coccl_mx(const void* RESTRICT src, void* RESTRICT dst, i64 count, i64 K) {
  __shared__ u32 red[THREADS / 32];
  const i64 n = K * LPB, step = (i64)gridDim.x * THREADS * UNR;
  const int lane = (int)(threadIdx.x & 31);
  const bool vec = aligned(src, 16);
  u32 m = 0;
  for (i64 j0 = ((i64)blockIdx.x * THREADS + threadIdx.x - lane) * UNR; j0 < n; j0 += step) {
    u32 xb[UNR][EPL];
    for (int u = 0; u < UNR; ++u) load_chunk(src, (j0 + 32 * u + lane) * EPL, count, vec, xb[u]);
    for (int u = 0; u < UNR; ++u) {
      const u32 a = group_max(lane_amax(xb[u]));  // the finite blocks only
      if (a < BITS_INF) m = umax(m, a);
    }
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) st32((u8*)dst + 4 * blockIdx.x, m);  // partial b, in the code area
}
#elif OP == 1 || OP == 4
extern "C" __global__ void ENC_BOUNDS
coccl_mx(const void* RESTRICT src, void* RESTRICT dst, i64 count, i64 K) {
  u8* pay = (u8*)dst;
  const i64 n = K * LPB, step = (i64)gridDim.x * THREADS * UNR;
  const int lane = (int)(threadIdx.x & 31);
  const bool vec = aligned(src, 16);
#if OP == 1 && SC
  const E4m3Payload s = e4m3_payload(as_f(ld32(pay + TENSOR_OFF(K))));  // S: OP 6 wrote it
#else
  const float s = 0.0f;
#endif
  for (i64 j0 = ((i64)blockIdx.x * THREADS + threadIdx.x - lane) * UNR; j0 < n; j0 += step) {
#if PAIRS || E4M3_WORDS
    u32 xb[UNR][EPL / 2];
    for (int u = 0; u < UNR; ++u) load_pairs(src, (j0 + 32 * u + lane) * EPL, count, vec, xb[u]);
#else
    u32 xb[UNR][EPL];
    for (int u = 0; u < UNR; ++u) load_chunk(src, (j0 + 32 * u + lane) * EPL, count, vec, xb[u]);
#endif
#pragma unroll  // xb[u] in registers, not local memory (the E4M3 body is long)
    for (int u = 0; u < UNR; ++u) {
      const i64 j = j0 + 32 * u + lane;
#if OP == 1
      chunk_body(pay, K, j, xb[u], s, j < n);  // whole blocks live or dead alike
#else
      (void)s;
      chunk_body(pay, K, j, xb[u], j < n);
#endif
    }
  }
}
#else
extern "C" __global__ void DEC_BOUNDS
coccl_mx(const void* RESTRICT src, void* RESTRICT dst, i64 count, i64 K) {
  const u8* pay = (const u8*)src;
  const i64 n = K * LPB, step = (i64)gridDim.x * THREADS * UNR;
  const int lane = (int)(threadIdx.x & 31);
  const bool vec = aligned(dst, 16);
#if OP == 2
  const float s = SC ? as_f(ld32(pay + TENSOR_OFF(K))) : 0.0f;
#if STAGED
  __shared__ uint4 smem[THREADS * SCH];
  uint4* sb = smem + (threadIdx.x - lane) * SCH;  // the warp's buffer
#endif
#endif
  i64 j0 = ((i64)blockIdx.x * THREADS + threadIdx.x - lane) * UNR;  // the warp's first chunk
#if OP == 2 && FAST
  if (vec && aligned(pay, 4)) {
    // The steps whose UNR spans are whole come first (j0 only grows); the lane's code
    // words, scale bytes and the warp's span of out move on by the grid's step, and each
    // step's words and scales are loaded during the step before (while it decodes).
    const i64 whole = count / EPL;  // chunks wholly inside out
    const u32* cw = (const u32*)pay + (j0 + lane) * WPL;
    const u8* sp = pay + SCALE_OFF(K) + (j0 + lane) / LPB;  // LPB divides 32 and j0
    uint4* op = (uint4*)dst + j0 * SCH;  // the span: 32 SCH pieces of 16 bytes per u
    u32 w[UNR][WPL], sc[UNR];
    load_step(cw, sp, j0 + 32 * UNR <= whole, w, sc);
    for (; j0 + 32 * UNR <= whole; j0 += step) {
      u32 wn[UNR][WPL], scn[UNR];
      cw += step * WPL, sp += step / LPB;
      load_step(cw, sp, j0 + step + 32 * UNR <= whole, wn, scn);
      for (int u = 0; u < UNR; ++u) {
        u32 o[OUT_WORDS];
        chunk_out(w[u], sc[u], s, o);
#if STAGED
        store_span_words(op + 32 * SCH * u, sb, lane, o);
#else
        op[32 * u + lane] = make_uint4(o[0], o[1], o[2], o[3]);
#endif
      }
      op += step * SCH;
      for (int u = 0; u < UNR; ++u) {
        for (int q = 0; q < WPL; ++q) w[u][q] = wn[u][q];
        sc[u] = scn[u];
      }
    }
  }
#endif
  for (; j0 < n; j0 += step) {
    for (int u = 0; u < UNR; ++u) {
      const i64 j = j0 + 32 * u + lane;
#if OP == 2
      float y[EPL];
      if (j < n) decode_chunk(pay, K, j, s, y);
#if STAGED
      const i64 w0 = (j0 + 32 * u) * EPL;  // the warp's span: the same in every lane
      if (vec && w0 + 32 * EPL <= count) {
        store_span(dst, w0, sb, lane, y);
        continue;
      }
#endif
      if (j < n) store_chunk(dst, j * EPL, count, vec, y);
#else
      chunk_body(pay, dst, count, K, j, j < n, vec);
#endif
    }
  }
}
#endif
