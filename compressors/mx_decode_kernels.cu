// coccl GPU kernels of the microscaled codecs, part 3 of 4: the mx decode's chunk
// helpers (OP 2: decode_chunk, the staged span stores, and the lean FAST path's code
// pairs, bf16x2 arithmetic and step loads). Compiled after mx_encode_kernels.cu and
// before mx_entry_kernels.cu, as one source: mx_gpu.MX_SOURCES.

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
