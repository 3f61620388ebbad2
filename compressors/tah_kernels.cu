// coccl GPU kernels of the tah codec, bit-exact with FORMAT.md (section tah) and with the
// numba kernels of compressors/tah_cpu.py.
//
// Compiled by compressors/tah_gpu.py after codec_kernels.cu (with OP=0, which defines its
// float32 inline-PTX arithmetic, element loads and output conversions and no kernel),
// tah_tables.cu (the score's tables) and tah_select.cu (the low-token selection, TAH_OP 4),
// and before tah_score.cu (the token scores, TAH_OP 1, which use the helpers here), with
// -D defines; every variant defines one kernel, `tah_kernel`:
//
//   TAH_OP  1 token scores (tah_score.cu), 4 low-token selection (tah_select.cu), 2 encode,
//           3 decode
//   XT      element type of x (score, encode) or out (decode): 0 float32, 1 float16,
//           2 bfloat16 (codec_kernels.cu's define)
//   TILE    elements per tile: 32, 64 or 128
//   BH, BL  bits per code of high and low tokens (2..8)
//   PIVOT   encode: 1 lets tiles with one dominant value pivot (option pivot="auto")
//   RATIO_BITS  encode: the bits of the float32 pivot_ratio
//   ACC     decode: add into a float32 out (1) or overwrite (0)
//   ROW     encode, decode: the token length (the kernels' row argument is then unused), so
//           that a tile's token is a division by a constant (a shift for powers of two)
//   SC_CACHE  scores: chunks of 8 elements a thread keeps in registers (a token of up to
//           8 THREADS SC_CACHE elements is read once; longer ones twice)
//   EPL     encode, decode: elements a lane holds, 8, 16 or 32 (at most TILE)
//
// Layout of encode and decode: a tile lives in LT = TILE / EPL consecutive lanes, lane li
// of it holding elements [EPL li, EPL li + EPL) in registers (the decode as CH = EPL / 8
// chunks of 8, each chunk's codes whole bytes, b of them; the encode packs its EPL b bits
// into 32-bit words), so a warp holds TPW = 32 / LT tiles (a "tile group"). A tile's own
// work (its range, the divisions of its step, its place in the payload) is done by each
// of its LT lanes: the more elements a lane holds, the less of that work per element. Each block takes one contiguous range of tile groups,
// its warps the consecutive groups of each step, so that the low tokens before a tile's
// token (its place in the payload) are a running count: the block counts the bitmap
// bytes before its range once, then adds the bytes it passes. Shuffles are never in
// divergent code: a warp runs the pivot's transform only when one of its tiles pivots (a
// warp-wide vote), and then with all lanes. Reductions that decide anything (min, max,
// the top two magnitudes) are on integers, whose results no order changes.
//
// An encode is kernels 1, 4, 2 and a decode kernel 3, with no other memory than the
// payload's: a CUDA graph may capture them (the codec's graph_safe). Kernel 1 writes each
// token's score (uint32) into the payload's centre region (4 K bytes, K >= NT tiles, as
// 4 NT bytes of scores), kernel 4 turns the scores into the token bitmap, and kernel 2
// reads the bitmap and overwrites the region with the tiles' centres and steps.

#ifndef TAH_OP
#error "TAH_OP must be defined"
#endif
#ifndef TILE
#define TILE 64
#endif
#ifndef BH
#define BH 4
#endif
#ifndef BL
#define BL 3
#endif
#ifndef PIVOT
#define PIVOT 1
#endif
#ifndef RATIO_BITS
#define RATIO_BITS 0x40000000u  // 2.0f
#endif
#ifndef SC_CACHE
#define SC_CACHE 2
#endif

#ifdef ROW
#define TROW ((i64)ROW)
#else
#define TROW row
#endif

#ifndef EPL
#define EPL 16
#endif
#if (EPL != 8 && EPL != 16 && EPL != 32) || EPL > TILE
#error "EPL must be 8, 16 or 32, and at most TILE"
#endif
#define LT (TILE / EPL)  // lanes per tile
#define CH (EPL / 8)     // chunks of 8 elements a lane
#define TPW (32 / LT)  // tiles per warp
#define SCORE_LEVELS 256
#define SCORE_FRAC 20
#define PIVOT_MIN_BITS (63u << 23)   // 2^-64
#define PIVOT_MAX_BITS (191u << 23)  // 2^64
#define BITS_HALF 0x3f000000u
#define BITS_MIN_NORMAL 0x00800000u

// ------------------------------------------------------------------ shared helpers
// An int whose order is the order of the float32 with these bits (-0 < +0).
DEV int order_key(u32 b) { return (int)(b ^ ((u32)((int)b >> 31) >> 1)); }
DEV float from_key(int k) { return as_f((u32)k ^ ((u32)(k >> 31) >> 1)); }

// A lane's 8 elements from element e0 (ml of them exist, zero after): one 16-byte vector
// or two where they are aligned, else one by one.
DEV void load8(const char* xb, i64 e0, int ml, bool vec, float* v) {
  u32 w[8];
  if (vec && ml == 8) {
    const uint4* p = (const uint4*)(xb + e0 * EB);
    const uint4 a = ldg4(p);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
#if XT == 0
    const uint4 b = ldg4(p + 1);
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
#endif
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = elem_f32(w, r);
  } else {
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = r < ml ? raw_to_f32(load_elem_raw(xb, e0 + r)) : 0.0f;
  }
}

// The block's count of the set bits in the first nb bytes of bm (every thread gets it);
// red: WARPS words of shared memory. Has barriers: the whole block calls it.
DEV i64 block_popc(const unsigned char* bm, i64 nb, long long* red) {
  long long c = 0;
  for (i64 j = threadIdx.x; j < nb; j += THREADS) c += __popc((u32)bm[j]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(FULL_MASK, c, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = c;
  __syncthreads();
  long long s = 0;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) s += red[w];
  __syncthreads();
  return s;
}

// A block's contiguous range of tile groups [g0, g1) (empty past the last group).
DEV void block_range(i64 ngroups, i64& g0, i64& g1) {
  const i64 per = (ngroups + gridDim.x - 1) / gridDim.x;
  g0 = (i64)blockIdx.x * per;
  g1 = g0 + per < ngroups ? g0 + per : ngroups;
}

// The running count of low tokens: `pre` low tokens in the bitmap bytes before `byte0`.
struct LowRun {
  i64 byte0, pre;
};

// Advance the count to the byte of token t (t at or past the current byte).
DEV void low_advance(const unsigned char* bm, i64 t, LowRun& run) {
  for (; run.byte0 < (t >> 3); ++run.byte0) run.pre += __popc((u32)bm[run.byte0]);
}

// The low tokens before token t (at or past run's byte) and whether t is low.
DEV void low_before(const unsigned char* bm, i64 t, const LowRun& run, i64& l0, bool& low) {
  i64 c = run.pre;
  for (i64 j = run.byte0; j < (t >> 3); ++j) c += __popc((u32)bm[j]);
  const u32 last = bm[t >> 3], r = (u32)(t & 7);
  l0 = c + __popc(last & ((1u << r) - 1u));
  low = ((last >> r) & 1u) != 0u;
}

// Swap the tile's element 0 with element j (j the same in all LT lanes of the tile).
DEV void swap_first(float* v, int li, int lane, int j) {
  const int hl = j / EPL, hs = j % EPL;
  float sel = v[0];
#pragma unroll
  for (int r = 1; r < EPL; ++r) sel = r == hs ? v[r] : sel;
  const int tb = lane & ~(LT - 1);
  const float e0 = __shfl_sync(FULL_MASK, v[0], tb);
  const float ej = __shfl_sync(FULL_MASK, sel, tb + hl);
#pragma unroll
  for (int r = 0; r < EPL; ++r) v[r] = (li == hl && r == hs) ? e0 : v[r];
  if (li == 0) v[0] = ej;
}

// The tile a lane works on in tile group g (TPW tiles a warp), whether it exists, its
// element count m and the lane's share ml of it.
struct TileLane {
  i64 k, base;
  bool active;
  int m, ml;
};

DEV TileLane tile_lane(i64 g, int lane, int li, i64 count, i64 K) {
  TileLane t;
  t.k = g * TPW + (lane / LT);
  t.active = t.k < K;
  t.base = t.k * TILE;
  const i64 left = t.active ? count - t.base : 0;
  t.m = left < TILE ? (int)left : TILE;
  t.ml = min(max(t.m - EPL * li, 0), EPL);
  return t;
}

// Where the codes of lane li of tile k lie (FORMAT.md): token t's at 8 K + ((t - lb) BH +
// lb BL) R / 8, lb its low tokens before it (the bitmap from run's byte), then the lane's
// first element's place in t at b bits; low: whether t is low (b = BL). In unsigned
// arithmetic, shifts where the row is a power of 2 (TILE divides it).
DEV i64 tile_place(const unsigned char* bm, const LowRun& run, i64 k, int li, i64 row,
                   i64 codes0, bool& low) {
  const u64 tpr = (u64)(row / TILE), t = (u64)k / tpr;  // tiles a row; k's token
  i64 l0;
  low_before(bm, (i64)t, run, l0, low);
  const u32 j = (u32)((u64)k - t * tpr) * TILE + EPL * li;  // the lane's element in t
  return codes0 + (i64)t * (BH * row / 8) - l0 * ((BH - BL) * row / 8) +
         (low ? j * BL / 8 : j * BH / 8);
}

// ========================================================================= encode (2)
#if TAH_OP == 2
// Packed 16-bit integer min/max, both halves of a word at once (VIMNMX3.S16x2 and .U16x2
// on sm_90, three operands an instruction).
#if defined(__CUDA_ARCH__)
DEV u32 max_s16x2(u32 a, u32 b) { u32 d; asm("max.s16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 min_u16x2(u32 a, u32 b) { u32 d; asm("min.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
DEV u32 max_u16x2(u32 a, u32 b) { u32 d; asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
#else
DEV u32 max_s16x2(u32 a, u32 b) {
  const u32 l = (u32)max((int)(short)a, (int)(short)b) & 0xffffu;
  const u32 h = (u32)max((int)(short)(a >> 16), (int)(short)(b >> 16)) & 0xffffu;
  return l | (h << 16);
}
DEV u32 min_u16x2(u32 a, u32 b) {
  return min(a & 0xffffu, b & 0xffffu) | (min(a >> 16, b >> 16) << 16);
}
DEV u32 max_u16x2(u32 a, u32 b) {
  return max(a & 0xffffu, b & 0xffffu) | (max(a >> 16, b >> 16) << 16);
}
#endif

// float32 -> float64 (exact, subnormals kept: a C cast obeys -ftz=true) and the
// float64 product.
#if defined(__CUDA_ARCH__)
DEV double f2d(float a) { double d; asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(a)); return d; }
DEV double d_mul(double a, double b) { double d; asm("mul.rn.f64 %0, %1, %2;" : "=d"(d) : "d"(a), "d"(b)); return d; }
#else
DEV double f2d(float a) { return (double)a; }
DEV double d_mul(double a, double b) { return a * b; }
#endif

#define NRAW (EPL * EB / 4)  // 32-bit words of a lane's raw elements
#if XT == 0
#define RAW_SIGN 0x80000000u
#else
#define RAW_SIGN 0x8000u
#endif

// A lane's EPL raw elements from element e0 into w (element r in word r / 2's half r % 2
// for the 16-bit types): 16-byte loads, all issued before any is used, where the whole
// lane exists and x is aligned (whole); else element by element, the ml real ones and
// then copies of pad (the raw bits of one of the tile's own elements, so that a range
// over all EPL is the range of the real ones).
DEV void load_raw(const char* xb, i64 e0, int ml, bool whole, u32 pad, u32* w) {
  if (whole) {
    const uint4* p = (const uint4*)(xb + e0 * EB);
#pragma unroll
    for (int i = 0; i < NRAW / 4; ++i) {
      const uint4 a = ldg4(p + i);
      w[4 * i] = a.x;
      w[4 * i + 1] = a.y;
      w[4 * i + 2] = a.z;
      w[4 * i + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int r = 0; r < EPL; ++r) {
      const u32 e = r < ml ? load_elem_raw(xb, e0 + r) : pad;
#if XT == 0
      w[r] = e;
#else
      if (r & 1)
        w[r >> 1] |= e << 16;
      else
        w[r >> 1] = e;
#endif
    }
  }
}

// The tile's smallest and largest value (as float32) from its raw elements, over its LT
// lanes, by three integer reductions instead of an order key a value: the largest bits as
// signed (smax), the smallest and largest as unsigned (umin, umax). A positive float's
// bits order as its value, a negative one's in reverse, and a negative's bits (sign set)
// lie above every positive's as unsigned and below as signed. So the largest value is
// smax where that is not negative (a positive value or +0 exists), else (all negative)
// the one of the least magnitude, umin; the smallest is umax where that is negative, else
// (none negative) umin. This is the order of FORMAT.md's integer keys (-0 < +0), NaNs
// included (a positive NaN above +Inf, a negative one below -Inf), so a tile with a NaN
// or an Inf has one at an end. The 16-bit types reduce both halves of a word at once.
DEV void tile_ends(const u32* w, float& flo, float& fhi) {
#if XT == 0
  int smax = (int)w[0];
  u32 umin = w[0], umax = w[0];
#pragma unroll
  for (int r = 1; r < EPL; ++r) {
    smax = max(smax, (int)w[r]);
    umin = min(umin, w[r]);
    umax = max(umax, w[r]);
  }
#else
  u32 s2 = w[0], n2 = w[0], x2 = w[0];
#pragma unroll
  for (int i = 1; i < NRAW; ++i) {
    s2 = max_s16x2(s2, w[i]);
    n2 = min_u16x2(n2, w[i]);
    x2 = max_u16x2(x2, w[i]);
  }
  int smax = max((int)(short)s2, (int)(short)(s2 >> 16));
  u32 umin = min(n2 & 0xffffu, n2 >> 16), umax = max(x2 & 0xffffu, x2 >> 16);
#endif
#pragma unroll
  for (int t = 1; t < LT; t <<= 1) {
    smax = max(smax, __shfl_xor_sync(FULL_MASK, smax, t));
    umin = min(umin, __shfl_xor_sync(FULL_MASK, umin, t));
    umax = max(umax, __shfl_xor_sync(FULL_MASK, umax, t));
  }
  fhi = raw_to_f32(smax >= 0 ? (u32)smax : umin);
  flo = raw_to_f32((umax & RAW_SIGN) != 0u ? umax : umin);
}

// The tile's smallest and largest value as order keys (over its LT lanes) of EPL float
// values (the pivot's transformed ones).
DEV void tile_range(const float* v, int& lo, int& hi) {
  lo = 0x7fffffff;
  hi = (int)0x80000000;
#pragma unroll
  for (int r = 0; r < EPL; ++r) {
    const int k = order_key(as_u(v[r]));
    lo = min(lo, k);
    hi = max(hi, k);
  }
#pragma unroll
  for (int t = 1; t < LT; t <<= 1) {
    lo = min(lo, __shfl_xor_sync(FULL_MASK, lo, t));
    hi = max(hi, __shfl_xor_sync(FULL_MASK, hi, t));
  }
}

// A lane's EPL codes at B bits, packed LSB first into cw (code r at bit r B: words of 32
// bits, a code straddling two where 32 is not a multiple of B), from its values v, the
// centre c and s: 1 / step (DIV false) or step (DIV true, where 1 / step overflows).
// q_r = rint(u_r + qh), u_r = (v_r - c) * s or (v_r - c) / s. FORMAT.md clamps q_r to
// [0, Q]; no code reaches the clamp, so it is left out: |v_r - c| <= r (round to nearest
// is monotonic, r = max(hi - c, c - lo) rounded), and the step's fix-up makes
// RN(r / step) <= qh, so r / step <= qh (1 + 2^-24); 1 / step rounds with a relative error
// of at most 2^-22 (2^-24 where normal; subnormal only for step > 2^126, where 1 / step >
// 2^-128), so |u_r| <= qh (1 + 2^-20) and u_r + qh lies in (-0.5, Q + 0.5) for Q <= 255.
// The rounding without a conversion: + 1.5 2^23, whose sum holds rint (half to even) in its
// low mantissa bits: the float's bits are M + q_r, M = BITS_MAGIC. Those are summed times
// 2^(r B mod 32) into their word (mod 2^32: the bits past 32 of a straddling code are
// dropped there and its q_r, shifted down, added to the next word) and the sum of the M
// terms, a constant, is taken off once a word.
template <int B, bool DIV>
DEV void pack_words(const float* v, float c, float s, u32* cw) {
  constexpr int NWB = (EPL * B + 31) / 32;
  constexpr float qh = (float)((1 << B) - 1) * 0.5f;
  u32 m[NWB];
#pragma unroll
  for (int j = 0; j < NWB; ++j) cw[j] = m[j] = 0u;
#pragma unroll
  for (int r = 0; r < EPL; ++r) {
    const float d = f_sub(v[r], c);
    const float u = DIV ? f_div(d, s) : f_mul(d, s);
    const u32 q = as_u(f_add(f_add(u, qh), as_f(BITS_MAGIC)));  // M + q_r
    const int j = (r * B) >> 5, o = (r * B) & 31;
    cw[j] += q << o;
    m[j] += BITS_MAGIC << o;
    if (o + B > 32) cw[j + 1] += (q - BITS_MAGIC) >> (32 - o);
  }
#pragma unroll
  for (int j = 0; j < NWB; ++j) cw[j] -= m[j];
}

// A lane's code bytes (EPL B / 8 of them, pack_words's words) at p: the widest aligned
// stores where the lane is whole (ml = EPL), else the bytes of its ml codes byte by byte,
// the bits past them cleared (the unused high bits of a last byte are 0).
template <int B>
DEV void store_codes(unsigned char* p, const u32* cw, int ml) {
  constexpr int NB = EPL * B / 8;
  const u64 a = (u64)p;
  if (ml == EPL && NB % 16 == 0 && (a & 15) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 16; ++i)
      ((uint4*)p)[i] = make_uint4(cw[4 * i], cw[4 * i + 1], cw[4 * i + 2], cw[4 * i + 3]);
  } else if (ml == EPL && NB % 8 == 0 && (a & 7) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 8; ++i) ((uint2*)p)[i] = make_uint2(cw[2 * i], cw[2 * i + 1]);
  } else if (ml == EPL && NB % 4 == 0 && (a & 3) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 4; ++i) ((u32*)p)[i] = cw[i];
  } else {
    const int nbits = ml * B;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const int keep = nbits - 8 * j;  // bits of byte j that hold real codes
      const u32 byte = (cw[j >> 2] >> (8 * (j & 3))) & (keep >= 8 ? 0xffu : (1u << keep) - 1u);
      if (keep > 0) p[j] = (unsigned char)byte;
    }
  }
}

// One tile's quantization at B bits (FORMAT.md) of a lane's values v from the tile's
// range [flo, fhi]: sets c and step, and stores the lane's codes at p where store (the
// tile exists); codes 0 where the range is 0 or the tile is bad (c and step then NaN,
// set by the caller).
template <int B>
DEV void quantize_store(const float* v, float flo, float fhi, bool bad, int ml, bool store,
                        unsigned char* p, float& c, float& step) {
  constexpr int NWB = (EPL * B + 31) / 32;
  constexpr float qh = (float)((1 << B) - 1) * 0.5f;
  c = f_add(f_mul(fhi, as_f(BITS_HALF)), f_mul(flo, as_f(BITS_HALF)));
  const float r1 = f_sub(fhi, c), r2 = f_sub(c, flo);
  const float rr = as_u(r1) > as_u(r2) ? r1 : r2;  // both >= 0
  step = 0.0f;
  u32 cw[NWB];
  if (bad || as_u(rr) == 0u) {
#pragma unroll
    for (int j = 0; j < NWB; ++j) cw[j] = 0u;
  } else {
    step = f_div(rr, qh);
    // FORMAT.md's RN(r / step) > qh, without the division: qh (in [2^(B-2), 2^(B-1)))
    // has its last mantissa bit 0, so a quotient halfway to the next float rounds to qh,
    // and RN(r / step) > qh exactly when r > step (qh + ulp(qh) / 2), a product of 24 and
    // 25 significant bits that double holds exactly (step = 0 passes it: r > 0).
    constexpr double qhm = (double)qh + 1.0 / (1 << (26 - B));  // qh + ulp(qh) / 2
    if (f2d(rr) > d_mul(f2d(step), qhm)) step = next_up(step);
    // u_i = d_i / step where 1 / step would overflow (rare), else d_i * (1 / step): two
    // copies behind one branch, so that the common path holds no division a value.
    if (as_u(step) < BITS_MIN_NORMAL)
      pack_words<B, true>(v, c, step, cw);
    else
      pack_words<B, false>(v, c, f_div(as_f(BITS_ONE), step), cw);
  }
  if (store) store_codes<B>(p, cw, ml);
}

// The tile's largest |v| bits (first), the lowest index holding it (idx) and the largest
// of the others (second; equal to first on a tie), over the LT lanes: the merge of two
// lanes' triples is symmetric, so both lanes of a pair agree, whatever the order. Only
// full tiles pivot, so all EPL values are real where the result is used.
DEV void tile_top2(const float* v, int li, u32& first, u32& second, int& idx) {
  first = 0;
  second = 0;
  idx = EPL * li;
#pragma unroll
  for (int r = 0; r < EPL; ++r) {
    const u32 a = as_u(v[r]) & 0x7fffffffu;
    if (a > first) {
      second = first;
      first = a;
      idx = EPL * li + r;
    } else if (a > second) {
      second = a;
    }
  }
#pragma unroll
  for (int t = 1; t < LT; t <<= 1) {
    const u32 f2 = __shfl_xor_sync(FULL_MASK, first, t);
    const u32 s2 = __shfl_xor_sync(FULL_MASK, second, t);
    const int i2 = __shfl_xor_sync(FULL_MASK, idx, t);
    if (f2 > first || (f2 == first && i2 < idx)) {
      second = max(s2, first);
      first = f2;
      idx = i2;
    } else {
      second = max(second, f2);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
tah_kernel(const void* __restrict__ src, unsigned char* __restrict__ pay, i64 count, i64 row,
           i64 K, i64 piv0, i64 bm0) {
  __shared__ long long red[WARPS];
  const char* xb = (const char*)src;
  const unsigned char* bm = pay + bm0;  // written by kernel 4, read only here
  const int lane = threadIdx.x & 31, li = lane & (LT - 1);
  const bool vec = (((u64)xb) & 15) == 0, a4 = (((u64)pay) & 3) == 0;
  const i64 codes0 = 8 * K;
  const i64 rowc = TROW;  // a constant where ROW is defined
  (void)row;
  i64 g0, g1;
  block_range((K + TPW - 1) / TPW, g0, g1);
  if (g0 >= g1) return;  // the whole block, before any barrier
  LowRun run;
  run.byte0 = (g0 * TPW * TILE / rowc) >> 3;
  run.pre = block_popc(bm, run.byte0, red);
  for (i64 gs = g0; gs < g1; gs += WARPS) {
    low_advance(bm, gs * TPW * TILE / rowc, run);  // the same in every thread of the block
    const i64 g = gs + (threadIdx.x >> 5);
    if (g >= g1) break;  // the whole warp
    const i64 k = g * TPW + (lane / LT), base = k * TILE;
    const bool active = k < K;
    // The common case, warp-uniform: every tile of the group whole and x aligned.
    const bool whole = vec && (g + 1) * (32 * EPL) <= count;
    int m = TILE, ml = EPL;
    u32 pad = 0;
    if (!whole) {
      const i64 left = active ? count - base : 0;
      m = left < TILE ? (int)left : TILE;
      ml = min(max(m - EPL * li, 0), EPL);
      if (ml < EPL && active) pad = load_elem_raw(xb, base);
    }
    u32 w[NRAW];
    load_raw(xb, base + EPL * li, ml, whole, pad, w);
    float flo, fhi;
    tile_ends(w, flo, fhi);
    float v[EPL];
#pragma unroll
    for (int r = 0; r < EPL; ++r) v[r] = elem_f32(w, r);
    // The largest |v| is at the smallest or the largest value, and the second largest is
    // at least the smaller of those two magnitudes (another element, or all are equal):
    // a tile with first < ratio * that cannot pivot, and warps of such tiles only skip
    // the exact top two (FORMAT.md's test, on the same first).
    const u32 alo = as_u(flo) & 0x7fffffffu, ahi = as_u(fhi) & 0x7fffffffu;
    const u32 first = max(alo, ahi);
    const bool bad = first >= 0x7f800000u;
    const bool maybe = PIVOT && !bad && m == TILE && first >= PIVOT_MIN_BITS &&
                       first < PIVOT_MAX_BITS &&
                       first >= as_u(f_mul(as_f(RATIO_BITS), as_f(min(alo, ahi))));
    bool piv = false;
    int idx = 0;
    if (__any_sync(FULL_MASK, maybe)) {  // the whole warp: shuffles
      u32 top, second;
      tile_top2(v, li, top, second, idx);
      piv = maybe && first >= as_u(f_mul(as_f(RATIO_BITS), as_f(second)));
      if (__any_sync(FULL_MASK, piv)) {  // the whole warp transforms, in place
        swap_first(v, li, lane, idx);
        wht_group<EPL, LT>(v, li);  // codec_kernels.cu's: h < EPL in the lane, then across
        int klo, khi;
        tile_range(v, klo, khi);
        if (piv) {
          flo = from_key(klo);
          fhi = from_key(khi);
        } else {  // tiles that do not pivot load their values again (no copy kept)
          load_raw(xb, base + EPL * li, ml, whole, pad, w);
#pragma unroll
          for (int r = 0; r < EPL; ++r) v[r] = elem_f32(w, r);
        }
      }
    }
    bool low = false;
    const i64 off = active ? tile_place(bm, run, k, li, rowc, codes0, low) : 0;
    float c, step;
    if (low)  // the tile's width, a constant in each branch (no shuffle in them)
      quantize_store<BL>(v, flo, fhi, bad, ml, active, pay + off, c, step);
    else
      quantize_store<BH>(v, flo, fhi, bad, ml, active, pay + off, c, step);
    if (active && li == 0) {
      st32(pay + 4 * k, bad ? BITS_NAN : as_u(c), a4);
      st32(pay + 4 * K + 4 * k, bad ? BITS_NAN : as_u(step), a4);
      pay[piv0 + k] = piv ? (unsigned char)(0x80 | idx) : (unsigned char)0;
    }
  }
}
#endif

// ========================================================================= decode (3)
#if TAH_OP == 3
// A lane's 8 decoded values v at elements [e0, e0 + ml) of out: written, or added to a
// float32 out (ACC); 16-byte vectors where out is aligned and all 8 exist.
DEV void store8(char* ob, i64 e0, int ml, bool vout, const float* v) {
#if ACC
  float* o = (float*)ob + e0;
  if (vout && ml == 8) {
    uint4* o4 = (uint4*)o;
    uint4 a = o4[0], bq = o4[1];
    a.x = as_u(f_add(as_f(a.x), v[0])); a.y = as_u(f_add(as_f(a.y), v[1]));
    a.z = as_u(f_add(as_f(a.z), v[2])); a.w = as_u(f_add(as_f(a.w), v[3]));
    bq.x = as_u(f_add(as_f(bq.x), v[4])); bq.y = as_u(f_add(as_f(bq.y), v[5]));
    bq.z = as_u(f_add(as_f(bq.z), v[6])); bq.w = as_u(f_add(as_f(bq.w), v[7]));
    o4[0] = a;
    o4[1] = bq;
  } else {
    for (int r = 0; r < ml; ++r) o[r] = f_add(o[r], v[r]);
  }
#else
  if (vout && ml == 8) {
#if XT == 0
    uint4* o4 = (uint4*)(ob + e0 * 4);
    o4[0] = make_uint4(as_u(v[0]), as_u(v[1]), as_u(v[2]), as_u(v[3]));
    o4[1] = make_uint4(as_u(v[4]), as_u(v[5]), as_u(v[6]), as_u(v[7]));
#else
    *(uint4*)(ob + e0 * 2) = make_uint4(pack_out2(v[0], v[1]), pack_out2(v[2], v[3]),
                                        pack_out2(v[4], v[5]), pack_out2(v[6], v[7]));
#endif
  } else {
    for (int r = 0; r < ml; ++r) {
#if XT == 0
      ((float*)ob)[e0 + r] = v[r];
#else
      ((unsigned short*)ob)[e0 + r] = (unsigned short)out_bits1(v[r]);
#endif
    }
  }
#endif
}

// A warp's whole tile group (32 EPL consecutive elements from w0, lane l's EPL at
// w0 + EPL l) written, or added to a float32 out (ACC), through the warp's shared-memory
// buffer sb: coalesced 16-byte accesses, where each lane's own 16-byte accesses would
// stride by EPL elements (for float32 half a sector apart, and four of them a lane). Each
// lane stages its chunks of 8 values (stage8), then the warp writes the group out
// (flush_group), so that a lane need not hold all EPL values at once.
#if ACC
#define SCH (EPL / 4)  // 16-byte chunks of a lane's float32 out
#else
#define SCH (EPL * EB / 16)  // 16-byte chunks of a lane's out elements
#endif
DEV void stage8(uint4* sb, int lane, int j, const float* v) {
#if ACC || XT == 0
  sb[swz(lane * SCH + 2 * j)] = make_uint4(as_u(v[0]), as_u(v[1]), as_u(v[2]), as_u(v[3]));
  sb[swz(lane * SCH + 2 * j + 1)] = make_uint4(as_u(v[4]), as_u(v[5]), as_u(v[6]), as_u(v[7]));
#else
  sb[swz(lane * SCH + j)] = make_uint4(pack_out2(v[0], v[1]), pack_out2(v[2], v[3]),
                                       pack_out2(v[4], v[5]), pack_out2(v[6], v[7]));
#endif
}

DEV void flush_group(char* ob, i64 w0, uint4* sb, int lane) {
#if ACC || XT == 0
  uint4* o = (uint4*)((float*)ob + w0);
#else
  uint4* o = (uint4*)(ob + w0 * 2);
#endif
  __syncwarp();
#pragma unroll
  for (int j = 0; j < SCH; ++j) {
    uint4 q = sb[swz(j * 32 + lane)];
#if ACC
    const uint4 a = o[j * 32 + lane];
    q = make_uint4(as_u(f_add(as_f(a.x), as_f(q.x))), as_u(f_add(as_f(a.y), as_f(q.y))),
                   as_u(f_add(as_f(a.z), as_f(q.z))), as_u(f_add(as_f(a.w), as_f(q.w))));
#endif
    o[j * 32 + lane] = q;
  }
  __syncwarp();
}

DEV void store_group(char* ob, i64 w0, uint4* sb, int lane, const float* v) {
#pragma unroll
  for (int j = 0; j < CH; ++j) stage8(sb, lane, j, v + 8 * j);
  flush_group(ob, w0, sb, lane);
}

// Where a chunk's code r (B bits at bit r B of the chunk's word) is read from: the word
// shifted right by r B - p (left by 4 for r = 0), the code then at bit p = code_pos(r),
// with p >= 1 and p + B <= 23 (inside a float32 mantissa, with a bit below it); codes
// share their shifts (p steps through 16 bits, 8 at B = 8).
template <int B>
DEV constexpr int code_pos(int r) {
  return r == 0 ? 4 : (B <= 7 ? (r * B - 1) % 16 + 1 : (r * B - 1) % 8 + 1);
}

// A chunk's 8 values from its codes (code r at bit r B):
// sat(c + ((float) q_r - qh) * step), B bits a code. (float) q_r - qh is exact either way,
// so it is taken without a conversion: the code OR'd into the mantissa of 2^(23 - p), p its
// bit, is the float 2^(23 - p) + q_r, and minus 2^(23 - p) + qh (exact for p >= 1: qh has
// one fractional bit) leaves q_r - qh. SAT 0 where the caller knows that no value can
// overflow (sat is then the identity). z: zero, which the compiler cannot know where the
// caller passes a value only known at run time: the exponents are then loop-invariant
// registers and the code's mask and exponent one three-input LOP3, not two.
template <int B, bool SAT>
DEV void unpack8(u64 code, float c, float step, float* v, u32 z = 0u) {
  constexpr float qh = (float)((1 << B) - 1) * 0.5f;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int p = code_pos<B>(r), s = r * B - p;  // s = -4 only for r = 0
    const u32 w = s >= 0 ? (u32)(code >> (s & 63)) : (u32)(code << ((-s) & 63));
    const u32 e = ((u32)(150 - p) << 23) + z;  // the exponent of 2^(23 - p)
    const float k8 =
        f_sub(as_f((w & ((u32)((1 << B) - 1) << p)) | e), (float)(1 << (23 - p)) + qh);
    const float y = f_add(c, f_mul(k8, step));
    v[r] = SAT ? sat_inf(y) : y;
  }
}

// A lane's EPL values from its codes (chunk j's in codes[j]).
template <int B, bool SAT>
DEV void unpack_codes(const u64* codes, float c, float step, float* v) {
#pragma unroll
  for (int j = 0; j < CH; ++j) unpack8<B, SAT>(codes[j], c, step, v + 8 * j);
}

// Whether no value c + k step, |k| <= 127.5, can overflow: |c| < 2^126 and 0 <= step <
// 2^118 (so |k step| < 2^125). NaN or negative bits fail the test.
DEV bool no_overflow(float c, float step) {
  return (as_u(c) & 0x7fffffffu) < (253u << 23) && as_u(step) < (245u << 23);
}

// A lane's EPL values at width b (BH or BL: a constant in each branch), saturated only
// where a tile of the warp might overflow (a warp-wide vote, so that the common path has
// no test a value).
DEV void unpack_lane(const u64* codes, int b, float c, float step, float* v) {
  if (!__any_sync(FULL_MASK, !no_overflow(c, step))) {
    if (b == BH)
      unpack_codes<BH, false>(codes, c, step, v);
    else
      unpack_codes<BL, false>(codes, c, step, v);
  } else {
    if (b == BH)
      unpack_codes<BH, true>(codes, c, step, v);
    else
      unpack_codes<BL, true>(codes, c, step, v);
  }
}

#ifndef DEC_AHEAD
#define DEC_AHEAD 1
#endif
#define NCW ((CH * BH + 3) / 4)  // words of a lane's code bytes at the high width (BL <= BH)

// Chunk j of a lane's codes (its B bytes from byte j B) from the words w of the lane's code
// bytes (byte 4 i + r at bits 8 r of w[i]).
template <int B>
DEV u64 chunk_code(const u32* w, int j) {
  constexpr int NWB = (CH * B + 3) / 4;
  const int lo = (j * B) / 4, sh = ((j * B) % 4) * 8;  // chunk j's first word and bit
  const u64 w0 = w[lo], w1 = lo + 1 < NWB ? w[lo + 1] : 0u;
  const u64 w2 = lo + 2 < NWB ? w[lo + 2] : 0u;
  u64 x = (w0 | (w1 << 32)) >> sh;
  if (sh > 0) x |= w2 << (64 - sh);
  return B == 8 ? x : x & ((1ull << (8 * B)) - 1ull);
}

// A lane's code bytes [0, CH B) from q as words (w zero on entry): 16- or 4-byte loads
// issued together where the lane is whole and q aligned to them; else the ceil(ml B / 8)
// bytes that it has, one by one.
template <int B>
DEV void code_words(const unsigned char* q, int ml, u32* w) {
  constexpr int NB = CH * B;
  if (ml == EPL && NB % 16 == 0 && (((u64)q) & 15) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 16; ++i) {
      const uint4 a = ldg4((const uint4*)q + i);
      w[4 * i] = a.x;
      w[4 * i + 1] = a.y;
      w[4 * i + 2] = a.z;
      w[4 * i + 3] = a.w;
    }
  } else if (ml == EPL && NB % 4 == 0 && (((u64)q) & 3) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 4; ++i) w[i] = __ldg((const u32*)q + i);
  } else {
    const int nb = (ml * B + 7) >> 3;
#pragma unroll
    for (int j = 0; j < NB; ++j)
      if (j < nb) w[j >> 2] |= (u32)q[j] << (8 * (j & 3));
  }
}

// What a lane loads for one step: its code bytes as words, its tile's centre, step, pivot
// byte and width (b = BH, c = step = 0, codes 0 where the tile does not exist).
struct DecIn {
  u32 w[NCW];
  float c, step;
  u32 p;
  int b;
};

// The decode's fixed arguments.
struct DecArgs {
  const unsigned char* pay;
  const unsigned char* bm;
  char* ob;
  i64 count, K, rowc, codes0, piv0;
  bool a4, vout;
};

// Lane `lane`'s loads of tile group g (none where !go): the warp's running count advanced
// to g's first token (the whole warp), the tile's place from it (a bitmap byte), then the
// centre, step, pivot byte and codes, which nothing here waits for.
DEV void dec_load(const DecArgs& a, LowRun& run, i64 g, bool go, int lane, int li,
                  DecIn& in) {
#pragma unroll
  for (int i = 0; i < NCW; ++i) in.w[i] = 0;
  in.c = 0.0f;
  in.step = 0.0f;
  in.p = 0;
  in.b = BH;
  if (!go) return;
  low_advance(a.bm, g * TPW * TILE / a.rowc, run);
  const TileLane tl = tile_lane(g, lane, li, a.count, a.K);
  if (!tl.active) return;
  bool low;
  const i64 off = tile_place(a.bm, run, tl.k, li, a.rowc, a.codes0, low);
  in.b = low ? BL : BH;
  const unsigned char* pc = a.pay + 4 * tl.k;
  if (a.a4) {
    in.c = as_f(__ldg((const u32*)pc));
    in.step = as_f(__ldg((const u32*)(pc + 4 * a.K)));
  } else {  // out of line: no predicated byte loads on the common path
    const u64 cs = ld32x2_bytes(pc, pc + 4 * a.K);
    in.c = as_f((u32)cs);
    in.step = as_f((u32)(cs >> 32));
  }
  in.p = a.pay[a.piv0 + tl.k];
  if (low)
    code_words<BL>(a.pay + off, tl.ml, in.w);
  else
    code_words<BH>(a.pay + off, tl.ml, in.w);
}

// A lane's EPL values of a whole group that does not pivot, decoded and staged chunk by
// chunk (8 values live at a time).
template <int B, bool SAT>
DEV void stage_lane(const DecIn& in, uint4* sb, int lane, u32 z) {
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    float v[8];
    unpack8<B, SAT>(chunk_code<B>(in.w, j), in.c, in.step, v, z);
    stage8(sb, lane, j, v);
  }
}

// Tile group g with all of a lane's EPL values in registers: a group where a tile pivots,
// the last group (short) or an unaligned out.
DEV void decode_group(const DecArgs& a, const DecIn& in, i64 g, int lane, int li, uint4* sb) {
  const TileLane tl = tile_lane(g, lane, li, a.count, a.K);
  u64 codes[CH];
#pragma unroll
  for (int j = 0; j < CH; ++j)
    codes[j] = in.b == BH ? chunk_code<BH>(in.w, j) : chunk_code<BL>(in.w, j);
  float v[EPL];
  unpack_lane(codes, in.b, in.c, in.step, v);
  const bool piv = (in.p & 0x80u) != 0u;
  if (__any_sync(FULL_MASK, piv)) {  // the whole warp transforms (shuffles), in place
    wht_group<EPL, LT>(v, li);  // codec_kernels.cu's: h < EPL in the lane, then across
#pragma unroll
    for (int r = 0; r < EPL; ++r) v[r] = f_mul(v[r], 1.0f / TILE);  // exact: a power of two
    swap_first(v, li, lane, (int)(in.p & 0x7fu));
    // Tiles that do not pivot decode their codes again (no shuffle, no vote: the
    // saturating form, the identity where nothing overflows), rather than keep a copy.
    if (!piv) {
      if (in.b == BH)
        unpack_codes<BH, true>(codes, in.c, in.step, v);
      else
        unpack_codes<BL, true>(codes, in.c, in.step, v);
    }
  }
  const i64 w0 = g * TPW * TILE;  // the warp's first element
  if (a.vout && w0 + 32 * EPL <= a.count) {  // warp-uniform: every tile of the group whole
    store_group(a.ob, w0, sb, lane, v);
  } else if (tl.active) {
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int mj = min(max(tl.ml - 8 * j, 0), 8);
      if (mj > 0) store8(a.ob, tl.base + EPL * li + 8 * j, mj, a.vout, v + 8 * j);
    }
  }
}

// Each warp takes the block's groups g0 + warp, g0 + warp + WARPS, ...; with DEC_AHEAD it
// issues the next group's loads (the place's bitmap byte, then centres, steps, pivot bytes
// and codes) before this group's arithmetic and stores, so that their latency passes under
// them. A group where no tile pivots (a warp-wide vote) and that is whole is decoded chunk
// by chunk straight into the staging buffer; any other takes decode_group.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
tah_kernel(const unsigned char* __restrict__ pay, void* __restrict__ dst, i64 count, i64 row,
           i64 K, i64 piv0, i64 bm0) {
  __shared__ long long red[WARPS];
  __shared__ uint4 smem[WARPS * 32 * SCH];
  DecArgs a;
  a.pay = pay;
  a.bm = pay + bm0;
  a.ob = (char*)dst;
  a.count = count;
  a.K = K;
  a.rowc = TROW;  // a constant where ROW is defined
  a.codes0 = 8 * K;
  a.piv0 = piv0;
  a.a4 = (((u64)pay) & 3) == 0;
  a.vout = (((u64)dst) & 15) == 0;
  (void)row;
  const int lane = threadIdx.x & 31, li = lane & (LT - 1), warp = threadIdx.x >> 5;
  uint4* sb = smem + warp * 32 * SCH;
  i64 g0, g1;
  block_range((K + TPW - 1) / TPW, g0, g1);
  if (g0 >= g1) return;  // the whole block, before any barrier
  LowRun run;  // this warp's running count, from the block's first byte
  run.byte0 = (g0 * TPW * TILE / a.rowc) >> 3;
  run.pre = block_popc(a.bm, run.byte0, red);
  i64 g = g0 + warp;
  const u32 z = (u32)(count >> 63);  // 0 (count >= 0), unknown to the compiler: see unpack8
  DecIn cur;
#if DEC_AHEAD
  dec_load(a, run, g, g < g1, lane, li, cur);
#endif
  for (; g < g1; g += WARPS) {  // warp-uniform
#if DEC_AHEAD
    DecIn nxt;
    dec_load(a, run, g + WARPS, g + WARPS < g1, lane, li, nxt);
#else
    dec_load(a, run, g, true, lane, li, cur);
#endif
    const bool whole = a.vout && g * TPW * TILE + 32 * EPL <= count;
    if (whole && !__any_sync(FULL_MASK, (cur.p & 0x80u) != 0u)) {
      if (!__any_sync(FULL_MASK, !no_overflow(cur.c, cur.step))) {
        if (cur.b == BH)
          stage_lane<BH, false>(cur, sb, lane, z);
        else
          stage_lane<BL, false>(cur, sb, lane, z);
      } else {
        if (cur.b == BH)
          stage_lane<BH, true>(cur, sb, lane, z);
        else
          stage_lane<BL, true>(cur, sb, lane, z);
      }
      flush_group(a.ob, g * TPW * TILE, sb, lane);
    } else {
      decode_group(a, cur, g, lane, li, sb);
    }
#if DEC_AHEAD
    cur = nxt;
#endif
  }
}
#endif
