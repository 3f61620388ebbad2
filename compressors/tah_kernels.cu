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
// of it holding elements [EPL li, EPL li + EPL) in registers as CH = EPL / 8 chunks of 8
// (each chunk's codes are whole bytes, b of them), so a warp holds TPW = 32 / LT tiles
// (a "tile group"). A tile's own work (its range, the divisions of its step, its place
// in the payload) is done by each of its LT lanes: the more elements a lane holds, the
// less of that work per element. Each block takes one contiguous range of tile groups,
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

// A lane's EPL elements from element e0 (ml of them exist, zero after). All of them and
// x aligned: every 16-byte load issued before the first is used (load8 chunk by chunk
// would wait for each chunk's load before issuing the next); else chunk by chunk.
DEV void load_lane(const char* xb, i64 e0, int ml, bool vec, float* v) {
  if (vec && ml == EPL) {
    constexpr int NQ = EPL * EB / 16;  // 16-byte vectors of the lane's elements
    u32 w[4 * NQ];
    const uint4* p = (const uint4*)(xb + e0 * EB);
#pragma unroll
    for (int i = 0; i < NQ; ++i) {
      const uint4 a = ldg4(p + i);
      w[4 * i] = a.x;
      w[4 * i + 1] = a.y;
      w[4 * i + 2] = a.z;
      w[4 * i + 3] = a.w;
    }
#pragma unroll
    for (int r = 0; r < EPL; ++r) v[r] = elem_f32(w, r);
  } else {
#pragma unroll
    for (int j = 0; j < CH; ++j)
      load8(xb, e0 + 8 * j, min(max(ml - 8 * j, 0), 8), vec, v + 8 * j);
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

// Where tile k's codes lie: its bit width b and the byte offset of its first code, from
// l0, the low tokens before its token, and whether that token is low.
DEV void tile_place(i64 l0, bool low, i64 k, i64 row, i64 codes0, int& b, i64& off) {
  const i64 base = k * TILE;
  const i64 t = base / row;
  b = low ? BL : BH;
  const i64 seg = ((t - l0) * BH + l0 * BL) * row / 8;
  off = codes0 + seg + (base - t * row) * b / 8;
}

// A chunk's nb code bytes (the low bytes of codes) at p: one word where they are 4 or 8
// whole aligned bytes, else byte by byte.
DEV void put_codes(unsigned char* p, u64 codes, int nb) {
  if (nb == 4 && (((u64)p) & 3) == 0) {
    *(u32*)p = (u32)codes;
  } else if (nb == 8 && (((u64)p) & 7) == 0) {
    *(u64*)p = codes;
  } else {
    for (int j = 0; j < nb; ++j) p[j] = (unsigned char)(codes >> (8 * j));
  }
}

DEV u64 get_codes(const unsigned char* p, int nb) {
  if (nb == 4 && (((u64)p) & 3) == 0) return (u64)__ldg((const u32*)p);
  if (nb == 8 && (((u64)p) & 7) == 0) return __ldg((const u64*)p);
  u64 c = 0;
  for (int j = 0; j < nb; ++j) c |= (u64)p[j] << (8 * j);
  return c;
}

// ========================================================================= encode (2)
#if TAH_OP == 2
// A lane's codes q_r = clamp(rint(u_r + qh), 0, 2^B - 1) of its ml values, packed LSB
// first, chunk j's 8 codes in codes[j]; the bits of codes past ml are cleared once a
// chunk (the last code byte holds them), not tested a value. The rounding without a
// conversion: u_r + qh clamped to [0, Q] in float (max/min drop a NaN: 0, as cvt.rni's
// NaN -> 0 then the clamp), then + 1.5 2^23, whose sum holds rint (half to even, the
// result's ulp being 1) in its low mantissa bits: the float's bits are M + q_r, M =
// BITS_MAGIC. Those are summed times 2^(r B) and the sum of the M 2^(r B) taken off once
// (mod 2^32, in 32 bits where a chunk's 8 B bits fit, else in 64).
template <int B>
DEV void pack_codes(const float* u, int ml, float qh, u64* codes) {
  constexpr float qmax = (float)((1 << B) - 1);
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    u64 acc;
    if (8 * B <= 32) {
      u32 a = 0, m = 0;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const float y = f_min(f_max(f_add(u[8 * j + r], qh), 0.0f), qmax);
        a += as_u(f_add(y, as_f(BITS_MAGIC))) << (r * B);
        m += BITS_MAGIC << (r * B);
      }
      acc = (u64)(a - m);
    } else {
      acc = 0;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const float y = f_min(f_max(f_add(u[8 * j + r], qh), 0.0f), qmax);
        acc |= (u64)(as_u(f_add(y, as_f(BITS_MAGIC))) - BITS_MAGIC) << (r * B);
      }
    }
    const int mj = ml - 8 * j;
    codes[j] = mj >= 8 ? acc : mj <= 0 ? 0ull : acc & ((1ull << (mj * B)) - 1ull);
  }
}

// The tile's smallest and largest value as order keys (over its LT lanes; ml of the
// lane's EPL values v are real).
DEV void tile_range(const float* v, int ml, int& lo, int& hi) {
  lo = 0x7fffffff;
  hi = (int)0x80000000;
  if (ml == EPL) {  // the common case, without a test a value
#pragma unroll
    for (int r = 0; r < EPL; ++r) {
      const int k = order_key(as_u(v[r]));
      lo = min(lo, k);
      hi = max(hi, k);
    }
  } else {
#pragma unroll
    for (int r = 0; r < EPL; ++r) {
      if (r < ml) {
        const int k = order_key(as_u(v[r]));
        lo = min(lo, k);
        hi = max(hi, k);
      }
    }
  }
#pragma unroll
  for (int t = 1; t < LT; t <<= 1) {
    lo = min(lo, __shfl_xor_sync(FULL_MASK, lo, t));
    hi = max(hi, __shfl_xor_sync(FULL_MASK, hi, t));
  }
}

// One tile's asymmetric quantization (FORMAT.md) from its range (tile_range's lo, hi):
// v holds the lane's EPL values (ml real), b the tile's width; sets the codes (packed LSB
// first, pack_codes's chunks; zero where the tile's range is 0), c and step.
DEV void quantize_lane(const float* v, int ml, int lo, int hi, int b, float& c, float& step,
                       u64* codes) {
  const float flo = from_key(lo), fhi = from_key(hi);
  c = f_add(f_mul(fhi, as_f(BITS_HALF)), f_mul(flo, as_f(BITS_HALF)));
  const float r1 = f_sub(fhi, c), r2 = f_sub(c, flo);
  const float rr = as_u(r1) > as_u(r2) ? r1 : r2;  // both >= 0
  const int qmax = (1 << b) - 1;
  const float qh = f_mul((float)qmax, as_f(BITS_HALF));
  step = 0.0f;
#pragma unroll
  for (int j = 0; j < CH; ++j) codes[j] = 0;
  if (as_u(rr) == 0u) return;
  step = f_div(rr, qh);
  if (as_u(step) == 0u || as_u(f_div(rr, step)) > as_u(qh)) step = next_up(step);
  // u_i = d_i / step where 1 / step would overflow (rare), else d_i * (1 / step): two
  // loops behind one branch, so that the common path holds no division per value.
  float u[EPL];
  if (as_u(step) < BITS_MIN_NORMAL) {
#pragma unroll
    for (int r = 0; r < EPL; ++r) u[r] = f_div(f_sub(v[r], c), step);
  } else {
    const float inv = f_div(as_f(BITS_ONE), step);
#pragma unroll
    for (int r = 0; r < EPL; ++r) u[r] = f_mul(f_sub(v[r], c), inv);
  }
  // The codes at the tile's width, a constant in each branch (no shuffle in them).
  if (b == BH)
    pack_codes<BH>(u, ml, qh, codes);
  else
    pack_codes<BL>(u, ml, qh, codes);
}

// A lane's codes (quantize_lane's chunks, ml values at b bits) at p, chunk by chunk.
DEV void put_lane_codes(unsigned char* p, const u64* codes, int ml, int b) {
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int mj = min(max(ml - 8 * j, 0), 8);
    if (mj > 0) put_codes(p + j * b, codes[j], (mj * b + 7) >> 3);
  }
}

// The tile's largest |v| bits (first), the lowest index holding it (idx) and the largest
// of the others (second; equal to first on a tie), over the LT lanes: the merge of two
// lanes' triples is symmetric, so both lanes of a pair agree, whatever the order. The
// lane's values past its real ones are load_lane's zeros.
DEV void tile_top2(const float* v, int li, u32& first, u32& second, int& idx) {
  first = 0;
  second = 0;
  idx = EPL * li;
#pragma unroll
  for (int r = 0; r < EPL; ++r) {
    const u32 a = as_u(v[r]) & 0x7fffffffu;  // a value past ml is 0: it changes nothing
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
    const TileLane tl = tile_lane(g, lane, li, count, K);
    const i64 k = tl.k, base = tl.base;
    const bool active = tl.active;
    const int m = tl.m, ml = tl.ml;
    float v[EPL];
    load_lane(xb, base + EPL * li, ml, vec, v);
    int lo, hi;
    tile_range(v, ml, lo, hi);
    // The largest |v| is at the smallest or the largest value, and the second largest is
    // at least the smaller of those two magnitudes (another element, or all are equal):
    // a tile with first < ratio * that cannot pivot, and warps of such tiles only skip
    // the exact top two (FORMAT.md's test, on the same first).
    const u32 alo = as_u(from_key(lo)) & 0x7fffffffu, ahi = as_u(from_key(hi)) & 0x7fffffffu;
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
      if (__any_sync(FULL_MASK, piv)) {  // the whole warp transforms; pivoting tiles keep it
        float w[EPL];
#pragma unroll
        for (int r = 0; r < EPL; ++r) w[r] = v[r];
        swap_first(w, li, lane, idx);
        wht_group<EPL, LT>(w, li);  // codec_kernels.cu's: h < EPL in the lane, then across
        int wlo, whi;
        tile_range(w, ml, wlo, whi);
#pragma unroll
        for (int r = 0; r < EPL; ++r) v[r] = piv ? w[r] : v[r];
        lo = piv ? wlo : lo;
        hi = piv ? whi : hi;
      }
    }
    int b = BH;
    i64 off = 0;
    if (active) {
      i64 l0;
      bool low;
      low_before(bm, base / rowc, run, l0, low);
      tile_place(l0, low, k, rowc, codes0, b, off);
    }
    float c, step;
    u64 codes[CH];
    quantize_lane(v, ml, lo, hi, b, c, step, codes);
#pragma unroll
    for (int j = 0; j < CH; ++j) codes[j] = bad ? 0ull : codes[j];
    if (active) {
      put_lane_codes(pay + off + li * CH * b, codes, ml, b);
      if (li == 0) {
        st32(pay + 4 * k, bad ? BITS_NAN : as_u(c), a4);
        st32(pay + 4 * K + 4 * k, bad ? BITS_NAN : as_u(step), a4);
        pay[piv0 + k] = piv ? (unsigned char)(0x80 | idx) : (unsigned char)0;
      }
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
// stride by EPL elements (for float32 half a sector apart, and four of them a lane).
#if ACC
#define SCH (EPL / 4)  // 16-byte chunks of a lane's float32 out
#else
#define SCH (EPL * EB / 16)  // 16-byte chunks of a lane's out elements
#endif
DEV void store_group(char* ob, i64 w0, uint4* sb, int lane, const float* v) {
#if ACC || XT == 0
  uint4* o = (uint4*)((float*)ob + w0);
#pragma unroll
  for (int j = 0; j < SCH; ++j)
    sb[swz(lane * SCH + j)] =
        make_uint4(as_u(v[4 * j]), as_u(v[4 * j + 1]), as_u(v[4 * j + 2]), as_u(v[4 * j + 3]));
#else
  uint4* o = (uint4*)(ob + w0 * 2);
#pragma unroll
  for (int j = 0; j < SCH; ++j)
    sb[swz(lane * SCH + j)] = make_uint4(pack_out2(v[8 * j], v[8 * j + 1]),
                                         pack_out2(v[8 * j + 2], v[8 * j + 3]),
                                         pack_out2(v[8 * j + 4], v[8 * j + 5]),
                                         pack_out2(v[8 * j + 6], v[8 * j + 7]));
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

// Where a chunk's code r (B bits at bit r B of the chunk's word) is read from: the word
// shifted right by r B - p (left by 4 for r = 0), the code then at bit p = code_pos(r),
// with p >= 1 and p + B <= 23 (inside a float32 mantissa, with a bit below it); codes
// share their shifts (p steps through 16 bits, 8 at B = 8).
template <int B>
DEV constexpr int code_pos(int r) {
  return r == 0 ? 4 : (B <= 7 ? (r * B - 1) % 16 + 1 : (r * B - 1) % 8 + 1);
}

// A whole lane's codes (CH chunks of B bytes from q, 4-byte aligned, CH B a multiple of 4)
// as CH B / 4 word loads issued together, chunk j's B bytes then cut from them (the
// byte-wise get_codes takes B loads a chunk where B is odd).
template <int B>
DEV void lane_codes(const unsigned char* q, u64* codes) {
  constexpr int LCW = (CH * B) / 4 > 0 ? (CH * B) / 4 : 1;
  u32 w[LCW];
#pragma unroll
  for (int i = 0; i < LCW; ++i) w[i] = __ldg((const u32*)q + i);
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int lo = (j * B) / 4, sh = ((j * B) % 4) * 8;  // chunk j's first word and bit
    const u64 w0 = w[lo], w1 = lo + 1 < LCW ? w[lo + 1] : 0u;
    const u64 w2 = lo + 2 < LCW ? w[lo + 2] : 0u;
    u64 x = (w0 | (w1 << 32)) >> sh;
    if (sh > 0) x |= w2 << (64 - sh);
    codes[j] = B == 8 ? x : x & ((1ull << (8 * B)) - 1ull);
  }
}

// A lane's EPL values from its codes (chunk j's in codes[j]):
// sat(c + ((float) q_r - qh) * step), B bits a code. (float) q_r - qh is exact either way,
// so it is taken without a conversion: the code OR'd into the mantissa of 2^(23 - p), p its
// bit, is the float 2^(23 - p) + q_r, and minus 2^(23 - p) + qh (exact for p >= 1: qh has
// one fractional bit) leaves q_r - qh. SAT 0 where the caller knows that no value can
// overflow (sat is then the identity).
template <int B, bool SAT>
DEV void unpack_codes(const u64* codes, float c, float step, float* v) {
  constexpr float qh = (float)((1 << B) - 1) * 0.5f;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int p = code_pos<B>(r), s = r * B - p;  // s = -4 only for r = 0
      const u32 w = s >= 0 ? (u32)(codes[j] >> (s & 63)) : (u32)(codes[j] << ((-s) & 63));
      const u32 e = (u32)(150 - p) << 23;  // the exponent of 2^(23 - p)
      const float k8 =
          f_sub(as_f((w & ((u32)((1 << B) - 1) << p)) | e), (float)(1 << (23 - p)) + qh);
      const float y = f_add(c, f_mul(k8, step));
      v[8 * j + r] = SAT ? sat_inf(y) : y;
    }
  }
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

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
tah_kernel(const unsigned char* __restrict__ pay, void* __restrict__ dst, i64 count, i64 row,
           i64 K, i64 piv0, i64 bm0) {
  __shared__ long long red[WARPS];
  __shared__ uint4 smem[WARPS * 32 * SCH];
  char* ob = (char*)dst;
  const unsigned char* bm = pay + bm0;
  const int lane = threadIdx.x & 31, li = lane & (LT - 1);
  const bool vout = (((u64)ob) & 15) == 0, a4 = (((u64)pay) & 3) == 0;
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
    const TileLane tl = tile_lane(g, lane, li, count, K);
    const i64 k = tl.k, base = tl.base;
    const int ml = tl.ml;
    int b = BH;
    float c = 0.0f, step = 0.0f;
    u32 p = 0;
    u64 codes[CH];
#pragma unroll
    for (int j = 0; j < CH; ++j) codes[j] = 0;
    if (tl.active) {
      i64 l0, off;
      bool low;
      low_before(bm, base / rowc, run, l0, low);
      tile_place(l0, low, k, rowc, codes0, b, off);
      c = as_f(ld32(pay + 4 * k, a4));
      step = as_f(ld32(pay + 4 * K + 4 * k, a4));
      p = pay[piv0 + k];
      const unsigned char* q = pay + off + li * CH * b;
      const bool words = ml == EPL && (((u64)q) & 3) == 0;  // whole lane, aligned
      if (words && b == BH && (CH * BH) % 4 == 0) {
        lane_codes<BH>(q, codes);
      } else if (words && b == BL && (CH * BL) % 4 == 0) {
        lane_codes<BL>(q, codes);
      } else {
#pragma unroll
        for (int j = 0; j < CH; ++j) {
          const int mj = min(max(ml - 8 * j, 0), 8);
          if (mj > 0) codes[j] = get_codes(q + j * b, (mj * b + 7) >> 3);
        }
      }
    }
    float v[EPL];
    unpack_lane(codes, b, c, step, v);
    const bool piv = (p & 0x80u) != 0u;
    if (__any_sync(FULL_MASK, piv)) {  // the whole warp transforms (shuffles), in place
      wht_group<EPL, LT>(v, li);  // codec_kernels.cu's: h < EPL in the lane, then across
#pragma unroll
      for (int r = 0; r < EPL; ++r) v[r] = f_mul(v[r], 1.0f / TILE);  // exact: a power of two
      swap_first(v, li, lane, (int)(p & 0x7fu));
      // Tiles that do not pivot decode their codes again (no shuffle, no vote: the
      // saturating form, the identity where nothing overflows), rather than keep a copy.
      if (!piv) {
        if (b == BH)
          unpack_codes<BH, true>(codes, c, step, v);
        else
          unpack_codes<BL, true>(codes, c, step, v);
      }
    }
    const i64 w0 = g * TPW * TILE;  // the warp's first element
    if (vout && w0 + 32 * EPL <= count) {  // warp-uniform: every tile of the group whole
      store_group(ob, w0, smem + (threadIdx.x >> 5) * 32 * SCH, lane, v);
    } else if (tl.active) {
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const int mj = min(max(ml - 8 * j, 0), 8);
        if (mj > 0) store8(ob, base + EPL * li + 8 * j, mj, vout, v + 8 * j);
      }
    }
  }
}
#endif
