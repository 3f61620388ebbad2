// coccl GPU kernels of the tah codec, bit-exact with FORMAT.md (section tah) and with the
// numba kernels of compressors/tah_cpu.py.
//
// This file holds the defines and the helpers the kernels share; the kernels are in
// tah_encode.cu (TAH_OP 2), tah_decode.cu (TAH_OP 3) and tah_score.cu (TAH_OP 1 and 6),
// compiled after it as one text. Compiled by compressors/tah_gpu.py after codec_kernels.cu
// and codec_tile_helpers.cu (with OP=0, which define their float32 inline-PTX arithmetic,
// element loads, output conversions and Hadamard and no kernel), tah_tables.cu (the score's tables) and tah_select.cu (the
// low-token selection, TAH_OP 4 and 5), with -D defines; every variant defines one kernel,
// `tah_kernel`:
//
//   TAH_OP  1 token scores (tah_score.cu), 4 low-token selection (tah_select.cu), 2 encode,
//           3 decode, 7 selection within windows (tah_select.cu)
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
    put4(w, ldg4(p));
#if XT == 0
    put4(w + 4, ldg4(p + 1));
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
