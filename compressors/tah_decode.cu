// The tah codec's decode kernel (TAH_OP 3), compiled after tah_kernels.cu (its defines,
// layout and shared helpers) and tah_encode.cu, and before tah_score.cu.

// ========================================================================= decode (3)
#if TAH_OP == 3
#ifndef DEC_AHEAD
#define DEC_AHEAD 1
#endif
// DEC_PRE: the places from a table in shared memory of each token of the block's range (its
// place from the range's first token's and its width; fill_pre, once a block), not a walk
// over the bitmap in global memory and 64-bit arithmetic a step; the whole-group test from a
// group count computed once, one vote (no pivot, no overflow) on the common path, and the
// staging buffer's flush addresses from two bases. 0: the previous loop (for a device A/B;
// the same output).
#ifndef DEC_PRE
#define DEC_PRE 0
#endif
#ifndef NPRE
#define NPRE 2048  // tokens in a block's table (fill_pre; tah_gpu's grids fit a block's in it)
#endif
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
#if DEC_PRE
  // swz(32 j + lane) = 32 j + (swz(lane) ^ 4 (j & 1)) (lane >> 3 < 4, so the XOR's carry-free
  // sum): two slot bases and immediate offsets, not a swizzle computed a chunk.
  const int s0 = swz(lane), s1 = s0 ^ 4;
#endif
  __syncwarp();
#pragma unroll
  for (int j = 0; j < SCH; ++j) {
#if DEC_PRE
    uint4 q = sb[32 * j + ((j & 1) ? s1 : s0)];
#else
    uint4 q = sb[swz(j * 32 + lane)];
#endif
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

// A lane's code bytes [0, CH B) from q as words: 16- or 4-byte loads issued together where
// the lane is whole and q aligned to them; else the ceil(ml B / 8) bytes that it has, one
// by one, into words that are zero on entry or, with ZERO, zeroed here first.
template <int B, bool ZERO = false>
DEV void code_words(const unsigned char* q, int ml, u32* w) {
  constexpr int NB = CH * B;
  if (ml == EPL && NB % 16 == 0 && (((u64)q) & 15) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 16; ++i) put4(w + 4 * i, ldg4((const uint4*)q + i));
  } else if (ml == EPL && NB % 4 == 0 && (((u64)q) & 3) == 0) {
#pragma unroll
    for (int i = 0; i < NB / 4; ++i) w[i] = __ldg((const u32*)q + i);
  } else {
    if (ZERO) {
#pragma unroll
      for (int i = 0; i < NCW; ++i) w[i] = 0;
    }
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

// The decode's fixed arguments (the last three DEC_PRE's).
struct DecArgs {
  const unsigned char* pay;
  const unsigned char* bm;
  char* ob;
  i64 count, K, rowc, codes0, piv0;
  bool a4, vout;
  u32 t0;                      // the low word of the table's first token
  const unsigned char* cbase;  // that token's codes
  i64 gwhole;                  // the groups whose tiles are all whole: g < gwhole
};

// Tile k's centre, step and pivot byte into in: two word loads where the payload is 4-byte
// aligned, else its bytes out of line (no predicated byte loads on the common path).
DEV void tile_scalars(const DecArgs& a, i64 k, DecIn& in) {
  const unsigned char* pc = a.pay + 4 * k;
  if (a.a4) {
    in.c = as_f(__ldg((const u32*)pc));
    in.step = as_f(__ldg((const u32*)(pc + 4 * a.K)));
  } else {
    const u64 cs = ld32x2_bytes(pc, pc + 4 * a.K);
    in.c = as_f((u32)cs);
    in.step = as_f((u32)(cs >> 32));
  }
  in.p = a.pay[a.piv0 + k];
}

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
  tile_scalars(a, tl.k, in);
  if (low)
    code_words<BL>(a.pay + off, tl.ml, in.w);
  else
    code_words<BH>(a.pay + off, tl.ml, in.w);
}

#if DEC_PRE
// The block's table (fill_pre) and its first token's codes (the kernel's), at file scope so
// that a load from it is one LDS at a constant address.
__shared__ u32 dec_tab[NPRE + 1];
__shared__ const unsigned char* dec_cbase;

// The table of tokens [t0, t0 + min(nt, NPRE)): entry i is token t0 + i's place from t0's
// in units of row / 8 bytes, i BH - l (BH - BL) for l the low tokens among [t0, t0 + i),
// shifted left by 1, OR whether t0 + i is low. Block-wide (barriers); red: WARPS words of
// shared memory.
DEV void fill_pre(const unsigned char* bm, i64 t0, i64 ntok, u32* tab, long long* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nt = (int)(ntok < NPRE ? ntok : NPRE);
  u32 carry = 0;
  for (int i0 = 0; i0 < nt; i0 += THREADS) {  // block-uniform
    const int i = i0 + (int)threadIdx.x;
    const i64 t = t0 + i;
    const u32 low = i < nt ? ((u32)bm[t >> 3] >> (u32)(t & 7)) & 1u : 0u;
    const u32 mask = __ballot_sync(FULL_MASK, low != 0u);
    if (lane == 0) red[warp] = (long long)__popc(mask);
    __syncthreads();
    u32 before = carry, total = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const u32 c = (u32)red[w];
      before += w < warp ? c : 0u;
      total += c;
    }
    before += (u32)__popc(mask & ((1u << lane) - 1u));  // the low tokens among [t0, t)
    if (i < nt) tab[i] = (((u32)i * BH - before * (BH - BL)) << 1) | low;
    if (threadIdx.x == 0) tab[NPRE] = carry + total;  // the low tokens so far (far_entry's)
    __syncthreads();
    carry += total;
  }
}

// Entry i >= NPRE of the table (token t = t0 + i, past it: a block of more tokens than the
// table, which the launcher's grids do not make): the table's count, then the bitmap's bits
// one by one.
COLD u32 far_entry(const unsigned char* bm, const u32* tab, u64 t, u32 i) {
  u32 c = tab[NPRE];
  for (u64 x = t - i + NPRE; x < t; ++x) c += ((u32)bm[x >> 3] >> (u32)(x & 7)) & 1u;
  return ((i * BH - c * (BH - BL)) << 1) | (((u32)bm[t >> 3] >> (u32)(t & 7)) & 1u);
}

// Where the codes of lane li of tile k lie (tile_place's, FORMAT.md), from the table: its
// token's entry, one shared-memory word, and the lane's first element's place in the token
// at its width.
DEV const unsigned char* pre_place(const DecArgs& a, i64 k, int li, bool& low) {
  const u64 tpr = (u64)(a.rowc / TILE), t = (u64)k / tpr;  // tiles a row; k's token
  const u32 i = (u32)t - a.t0;
  const u32 e = i < NPRE ? dec_tab[i] : far_entry(a.bm, dec_tab, t, i);
  low = (e & 1u) != 0u;
  const u32 j = ((u32)k - (u32)t * (u32)tpr) * TILE + EPL * li;  // the lane's element in t
  return a.cbase + (u64)(e >> 1) * (u64)(a.rowc / 8) + (low ? j * BL / 8 : j * BH / 8);
}

// dec_load's loads with the table: the tile and lane from the group alone where the group
// is whole (a warp-uniform test), the place from pre_place.
DEV void dec_load_pre(const DecArgs& a, i64 g, bool go, int lane, int li, DecIn& in) {
  in.c = 0.0f;
  in.step = 0.0f;
  in.p = 0;
  in.b = BH;
  const i64 k = g * TPW + lane / LT;
  int ml = EPL;
  bool act = go;
  if (go && g >= a.gwhole) {  // warp-uniform: the last group, short or past the last tile
    const TileLane tl = tile_lane(g, lane, li, a.count, a.K);
    act = tl.active;
    ml = tl.ml;
  }
  if (!act) {
#pragma unroll
    for (int i = 0; i < NCW; ++i) in.w[i] = 0;
    return;
  }
  bool low;
  const unsigned char* q = pre_place(a, k, li, low);
  in.b = low ? BL : BH;
  tile_scalars(a, k, in);
  if (low) {
#pragma unroll
    for (int i = (CH * BL + 3) / 4; i < NCW; ++i) in.w[i] = 0;
    code_words<BL, true>(q, ml, in.w);
  } else {
    code_words<BH, true>(q, ml, in.w);
  }
}
#endif

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

// stage_lane at the lane's token's width.
template <bool SAT>
DEV void stage_at_width(const DecIn& in, uint4* sb, int lane, u32 z) {
  if (in.b == BH)
    stage_lane<BH, SAT>(in, sb, lane, z);
  else
    stage_lane<BL, SAT>(in, sb, lane, z);
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
    wht_group<EPL, LT>(v, li);  // codec_tile_helpers.cu's: h < EPL in the lane, then across
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

// This warp's groups g, g + WARPS, ... below gend. With DEC_AHEAD it issues the next
// group's loads (its place, then centres, steps, pivot bytes and codes) before this group's
// arithmetic and stores, so that their latency passes under them. A group where no tile
// pivots (a warp-wide vote) and that is whole is decoded chunk by chunk straight into the
// staging buffer; any other takes decode_group. run: the running count of low tokens
// (without DEC_PRE; with it a's table).
template <bool PRE>
DEV void decode_groups(const DecArgs& a, LowRun& run, i64 g, i64 gend, int lane, int li,
                       uint4* sb, u32 z) {
#if DEC_PRE
#define DEC_LOAD(gg, go, in)                        \
  do {                                              \
    if constexpr (PRE)                              \
      dec_load_pre(a, gg, go, lane, li, in);        \
    else                                            \
      dec_load(a, run, gg, go, lane, li, in);       \
  } while (0)
#else
#define DEC_LOAD(gg, go, in) dec_load(a, run, gg, go, lane, li, in)
#endif
  DecIn cur;
#if DEC_AHEAD
  DEC_LOAD(g, g < gend, cur);
#endif
  for (; g < gend; g += WARPS) {  // warp-uniform
#if DEC_AHEAD
    DecIn nxt;
    DEC_LOAD(g + WARPS, g + WARPS < gend, nxt);
#else
    DEC_LOAD(g, true, cur);
#endif
    bool whole;
    if constexpr (PRE)
      whole = a.vout && g < a.gwhole;
    else
      whole = a.vout && g * TPW * TILE + 32 * EPL <= a.count;
    if constexpr (PRE) {  // one vote on the common path: whole, no pivot, no overflow
      const bool piv = (cur.p & 0x80u) != 0u;
      if (whole && !__any_sync(FULL_MASK, piv || !no_overflow(cur.c, cur.step))) {
        stage_at_width<false>(cur, sb, lane, z);
        flush_group(a.ob, g * TPW * TILE, sb, lane);
      } else if (whole && !__any_sync(FULL_MASK, piv)) {  // a tile might overflow
        stage_at_width<true>(cur, sb, lane, z);
        flush_group(a.ob, g * TPW * TILE, sb, lane);
      } else {
        decode_group(a, cur, g, lane, li, sb);
      }
    } else if (whole && !__any_sync(FULL_MASK, (cur.p & 0x80u) != 0u)) {
      if (!__any_sync(FULL_MASK, !no_overflow(cur.c, cur.step))) {
        stage_at_width<false>(cur, sb, lane, z);
      } else {
        stage_at_width<true>(cur, sb, lane, z);
      }
      flush_group(a.ob, g * TPW * TILE, sb, lane);
    } else {
      decode_group(a, cur, g, lane, li, sb);
    }
#if DEC_AHEAD
    cur = nxt;
#endif
  }
#undef DEC_LOAD
}

// Each block decodes its range of tile groups, each warp the groups g0 + warp + i WARPS.
// With DEC_PRE, from the block's table where its tokens fit it (the launcher's grids make
// them fit), else (and without DEC_PRE) from each warp's running count over the bitmap.
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
  const u32 z = (u32)(count >> 63);  // 0 (count >= 0), unknown to the compiler: see unpack8
  LowRun run;
#if DEC_PRE
  const i64 tpr = a.rowc / TILE;                         // tiles a row
  const i64 t0 = g0 * TPW / tpr;                         // the range's first token
  const i64 klast = (g1 * TPW < K ? g1 * TPW : K) - 1;  // its last tile
  i64 l0 = block_popc(a.bm, t0 >> 3, red);              // the low tokens before t0
  l0 += __popc((u32)a.bm[t0 >> 3] & ((1u << (u32)(t0 & 7)) - 1u));
  // t0's codes, through shared memory (fill_pre's barriers): the compiler then holds one
  // pointer, not the payload's and an offset, and computes a place once, not per branch.
  if (threadIdx.x == 0)
    dec_cbase = pay + (a.codes0 + t0 * (BH * a.rowc / 8) - l0 * ((BH - BL) * a.rowc / 8));
  fill_pre(a.bm, t0, klast / tpr - t0 + 1, dec_tab, red);
  a.t0 = (u32)t0;
  a.cbase = dec_cbase;
  a.gwhole = (i64)((u64)count / (TPW * TILE));  // count >= 0: a shift
  decode_groups<true>(a, run, g0 + warp, g1, lane, li, sb, z);
#else
  run.byte0 = (g0 * TPW * TILE / a.rowc) >> 3;  // this warp's running count, from the
  run.pre = block_popc(a.bm, run.byte0, red);   // range's first byte
  decode_groups<false>(a, run, g0 + warp, g1, lane, li, sb, z);
#endif
}
#endif
