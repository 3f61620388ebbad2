// The int codec's encode kernel (IOP 1): its scale, rounding and rotation of a lane's
// values, its tile loads (cp.async staging) and code stores, and coccl_int. Compiled after
// intq_kernels.cu (its defines, whose header documents them, and shared helpers) and before
// intq_decode.cu, as one source: intq_gpu._SOURCES.

// ======================================================================== encode
#if IOP == 1
// FORMAT.md steps 4-5: D (returned), the step t = D * m and whether the codes divide.
DEV float int_scale(float amax, float m, float& t, bool& tiny) {
  const float q = BITS_QMAX_F;
  float d = f_div(amax, f_mul(q, m));
  t = f_mul(d, m);
  tiny = as_u(amax) != 0u && as_u(t) <= BITS_2M128;
  if (tiny) {
    if (as_u(d) == 0u || as_u(f_div(amax, t)) > as_u(q)) {
      d = next_up(d);
      t = f_mul(d, m);
    }
  } else if (as_u(f_mul(t, q)) == BITS_INF) {
    d = next_down(d);
    t = f_mul(d, m);
  }
  return d;
}

// Step 6 to nearest (below): the bits of 1.5 * 2^23 + 2^(BITS-1), and the sum of a code
// word's ICPW copies of 1.5 * 2^23's bits at the fields' places (mod 2^32).
#define IMAGIC (0x4b400000u + IQB)
__host__ __device__ constexpr u32 imagic_sum(int f) {
  return f == 0 ? 0u : (imagic_sum(f - 1) << BITS) + 0x4b400000u;
}
#define IMAGIC_SUM imagic_sum(ICPW)

// Step 6: the code of a scaled value y (element e of the payload).
DEV int int_round(float y, u64 key, i64 e) {
#if STOCH
  const float f = floor_f(y);
  const float frac = f_sub(y, f);  // exact, >= +0
  const bool up = as_u(uniform24(key, e)) < as_u(frac);
  const int r = f2i_rn(up ? f_add(f, as_f(BITS_ONE)) : f);
#else
  (void)key;
  (void)e;
  const int r = f2i_rn(y);
#endif
  return min(max(r, -IQMAX), IQMAX);
}

// The rotation of a lane's NPL values v in place (step 2), and the absmax of the group's
// rotated values (as bits) returned.
DEV u32 int_rotate_absmax(float* v, int lane) {
  u32 ab = 0;
#if HAD <= NPL
  (void)lane;
  // Each block within the lane: its two halves' transforms (stages h = 1 .. HAD/4), then
  // the last stage, whose pair (a, b) becomes a + b and a - b. The larger magnitude of
  // the two is RN(|a| + |b|) (rounding is monotone and odd), so the absmax takes one add
  // per pair instead of a compare per value.
#pragma unroll
  for (int b = 0; b < NPL; b += HAD) {
    wht_group<HAD / 2, 1>(v + b, 0);
    wht_group<HAD / 2, 1>(v + b + HAD / 2, 0);
#pragma unroll
    for (int i = b; i < b + HAD / 2; ++i) {
      const float a = v[i], c = v[i + HAD / 2];
      v[i] = f_add(a, c);
      v[i + HAD / 2] = f_sub(a, c);
      ab = max(ab, as_u(f_add(f_abs(a), f_abs(c))));
    }
  }
#else
  int_rotate(v, lane);
#pragma unroll
  for (int i = 0; i < NPL; ++i) ab = max(ab, as_u(v[i]) & 0x7fffffffu);
#endif
  return group_umax<ILPG>(ab);
}

// One lane's NPL raw elements -> float32 values v, the group's multiplier m (FORMAT.md's
// M) and absmax bits ab (after the rotation, if any), and whether the group holds NaN or
// ±Inf (bad). From the raw absmax: step 2's prescale where the transform could overflow.
DEV void int_prepare(const u32* w, int lane, float* v, float& m, u32& ab, bool& bad) {
  u32 mb = 0;
#pragma unroll
  for (int hv = 0; hv < IHV; ++hv) mb = max(mb, raw_absmax(w + hv * NW));
  mb = group_umax<ILPG>(mb);
#pragma unroll
  for (int hv = 0; hv < IHV; ++hv)
#pragma unroll
    for (int r = 0; r < 32; ++r) v[32 * hv + r] = elem_f32(w + hv * NW, r);
  // A group with NaN or ±Inf runs the same steps (every lane of the warp must reach the
  // shuffles) and is overwritten at the end (step 7).
  bad = mb >= INF_BITS;
  m = as_f(BITS_ONE);
  ab = as_u(raw_to_f32(mb));
#if HAD
  m = (float)HAD;
  if ((int)(ab >> 23) + ilog2(HAD) > 253) {  // the transform could overflow
    const float p = as_f((u32)(127 - ilog2(HAD)) << 23);
#pragma unroll
    for (int i = 0; i < NPL; ++i) v[i] = f_mul(v[i], p);
    m = as_f(BITS_ONE);
  }
  ab = int_rotate_absmax(v, lane);
#else
  (void)lane;
#endif
}

#if HAD
// Below these absmax bits after the rotation (2^(126 - log2 HAD)) the group is finite and
// its raw absmax a below 2^(127 - log2 HAD), where int_prepare neither prescales nor marks
// it bad: the exact transform's largest magnitude is at least a (its 2-norm is
// sqrt(HAD) times the block's), and the float32 one's is within a relative 2^-13 of it
// (log2 HAD stages of rounding, sqrt(HAD) from the 2-norm to the largest), so a group
// that int_prepare would prescale reaches this bound; NaN and ±Inf propagate to it.
#define IAB_FAST ((u32)(253 - ilog2(HAD)) << 23)
#endif

// One lane's NPL raw elements w (type XT; element base is its first) -> its ICW code
// words and the group's scale bits (the same in all the group's lanes). With a rotation,
// the raw absmax is skipped: the values are rotated first, and only where some group of
// the warp reaches IAB_FAST (huge values, NaN, ±Inf: rare) does the warp take
// int_prepare's steps again, on its elements read again by reload(w).
template <class Reload>
DEV void int_encode_lane(const u32* w, int lane, i64 base, u64 key, u32* cw, u32& dbits,
                         Reload reload) {
  float v[NPL];
  float m;
  u32 ab;
  bool bad;
#if HAD
#pragma unroll
  for (int hv = 0; hv < IHV; ++hv)
#pragma unroll
    for (int r = 0; r < 32; ++r) v[32 * hv + r] = elem_f32(w + hv * NW, r);
  m = (float)HAD;
  bad = false;
  ab = int_rotate_absmax(v, lane);
  if (__any_sync(FULL_MASK, ab >= IAB_FAST)) {  // warp-uniform: int_prepare shuffles
    u32 w2[IHV * NW];
    reload(w2);
    int_prepare(w2, lane, v, m, ab, bad);
  }
#else
  (void)reload;
  int_prepare(w, lane, v, m, ab, bad);
#endif
#pragma unroll
  for (int j = 0; j < ICW; ++j) cw[j] = 0u;
  const float amax = as_f(ab);
  float t;
  bool tiny;
  const float d = int_scale(amax, m, t, tiny);
  // y_i = v_i * (1 / t), or v_i / t for a tiny step (rare): two loops behind one branch,
  // so that the common path holds no division (a select of both would run one per value).
  if (tiny) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) v[i] = f_div(v[i], t);
  } else {
    const float inv = ab != 0u ? f_div(as_f(BITS_ONE), t) : 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) v[i] = f_mul(v[i], inv);
  }
#if STOCH
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const u32 f = (u32)int_round(v[i], key, base + i) & ((1u << BITS) - 1u);
    const int bit = i * BITS;  // constants after unrolling
    cw[bit >> 5] |= f << (bit & 31);
    if ((bit & 31) + BITS > 32) cw[(bit >> 5) + 1] |= f >> (32 - (bit & 31));
  }
#else
  (void)key;
  (void)base;
  // Step 6, rounding to nearest: y + (1.5 * 2^23 + 2^(BITS-1)) rounds y to an integer r,
  // half to even as rint does (|y| < 2^22; the constant is even), and leaves the sum's
  // low bits u = r + 2^(BITS-1). The clamp is never active: in a finite group |y| < Q + 1/2,
  // since |v_i| <= a and a / T <= Q * (1 + 2^-11) (T = D * M exactly, and D's rounding is
  // at most 2^-11 of T: a subnormal D's half ulp 2^-150 times M <= 2^11, T > 2^-128; the
  // tiny path divides, and its D makes a / T round to at most Q), so 1 <= u <= 2^BITS - 1.
  // A group with NaN or Inf is overwritten below.
  u32 qb[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) qb[i] = as_u(f_add(v[i], as_f(IMAGIC)));
#if 32 % BITS == 0
  // A code word's sums y + constant added at their fields' places: the parts 1.5 * 2^23
  // add up to IMAGIC_SUM, the u (below 2^BITS) never carry into the next field; flipping
  // the fields' top bits turns the u into the codes q.
#pragma unroll
  for (int k = 0; k < ICW; ++k) {
    u32 acc = 0u;
#pragma unroll
    for (int f = ICPW - 1; f >= 0; --f) acc = (acc << BITS) + qb[k * ICPW + f];
    cw[k] = (acc - IMAGIC_SUM) ^ ISIGNS;
  }
#else
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const u32 f = (qb[i] ^ IQB) & ((1u << BITS) - 1u);  // q in BITS-bit two's complement
    const int bit = i * BITS;  // constants after unrolling
    cw[bit >> 5] |= f << (bit & 31);
    if ((bit & 31) + BITS > 32) cw[(bit >> 5) + 1] |= f >> (32 - (bit & 31));
  }
#endif
#endif
  if (bad) {
#pragma unroll
    for (int j = 0; j < ICW; ++j) cw[j] = 0u;
  }
  dbits = bad ? BITS_NAN : as_u(d);
}

// A lane's NPL elements from element base (zero past count), lane by lane: 16-byte vectors
// where x is aligned and they all exist.
DEV void lane_load_npl(const char* xb, i64 base, i64 count, bool vin, u32* w) {
#pragma unroll
  for (int hv = 0; hv < IHV; ++hv) lane_load(xb, base + 32 * hv, count, vin, w + hv * NW);
}

// A whole warp tile's elements (32 lanes x ICH chunks, in order) started copying into
// buffer sb: chunk u of the tile at slot swz(u), so that lane l's chunks are
// swz(l * ICH + c) (staged_transpose's layout). With cp.async no register holds them;
// sa is sb's shared-memory address (smem_addr), taken once.
DEV void int_fetch_tile(const char* tile_bytes, uint4* sb, u32 sa, const IntSlots& sl,
                        int lane) {
  const uint4* g = (const uint4*)tile_bytes;
#pragma unroll
  for (int j = 0; j < ICH; ++j) {
#if ASYNC7
    (void)sb;
    cp_async16_to(sa + 16u * (u32)col_slot(sl, j), g + j * 32 + lane);
#else
    (void)sa;
    sb[col_slot(sl, j)] = ldg4(g + j * 32 + lane);
#endif
  }
}

// Grid-stride over warp tiles. ISTAGE 1: a whole tile is copied into this warp's shared
// buffer with coalesced 16-byte copies (cp.async), the next tile's copy in flight while
// this one computes (two buffers a warp); a partial tile, or an unaligned x, is read lane by
// lane. ISTAGE 0: every tile is read lane by lane, the next tile's loads held in
// registers while this one computes. A whole tile's codes are stored as each lane's own
// 16-byte vectors where a lane's code words are a multiple of 4 and the payload is
// aligned (lane l's codes follow lane l - 1's: the warp's stores are coalesced), else
// through the warp's buffer (codes_store).
DEV void int_store_tile(unsigned char* pay, const IntPay& lay, u32* cb, const IntSlots& sl,
                        int lane, bool p16, i64 t0, i64 base, i64 K, const u32* cw,
                        u32 dbits) {
  const i64 coded = lay.coded;
  if (p16 && t0 + ITILE <= coded) {
    uint4* o = (uint4*)(pay + base * BITS / 8);
#pragma unroll
    for (int j = 0; j < ICW / 4; ++j)
      o[j] = make_uint4(cw[4 * j], cw[4 * j + 1], cw[4 * j + 2], cw[4 * j + 3]);
  } else if (lay.p4 && t0 + ITILE <= coded) {
    codes_store((u32*)(pay + t0 * BITS / 8), cb, sl, lane, cw);  // the tile's codes
  } else if (base < coded) {
    const i64 end = ((coded < base + NPL ? coded : base + NPL) * BITS + 7) >> 3;
    unsigned char* lp = pay + base * BITS / 8;
#pragma unroll
    for (int b = 0; b < 4 * ICW; ++b)
      if (base * BITS / 8 + b < end) lp[b] = (unsigned char)(cw[b >> 2] >> (8 * (b & 3)));
  }
  const i64 g = base / GS;
  if ((lane & (ILPG - 1)) == 0 && g < K && base < coded)
    st32(pay + lay.cbytes + 4 * g, dbits, lay.a4);
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_int(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K, u64 key) {
  __shared__ u32 cbuf[WARPS * 32 * ICS];
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  u32* cb = cbuf + wib * 32 * ICS;
  const IntPay lay = int_pay(pay, count);
  const bool vin = (((u64)xb) & 15) == 0;
  const bool p16 = ICW % 4 == 0 && (((u64)pay) & 15) == 0;
  const i64 stride = (i64)gridDim.x * WARPS;
  const i64 first = (i64)blockIdx.x * WARPS + wib;
  const IntSlots sl = int_slots(lane);
#if ISTAGE
  static_assert(ICH <= 8, "a lane's chunks read at row ^ c");
  __shared__ uint4 xbuf[WARPS * 64 * ICH];
  uint4* const wbuf = xbuf + wib * 64 * ICH;  // this warp's two buffers
  auto whole = [&](i64 t) { return vin && t < lay.ntiles && (t + 1) * ITILE <= count; };
#if ASYNC7
  const u32 wsa = smem_addr(wbuf);
#else
  const u32 wsa = 0;
#endif
  if (whole(first)) int_fetch_tile(xb + first * ITILE * EB, wbuf, wsa, sl, lane);
#if ASYNC7
  cp_async_commit();
#endif
  int cur = 0;
  for (i64 tile = first; tile < lay.ntiles; tile += stride, cur ^= 1) {
    const i64 t0 = tile * ITILE;
    const i64 base = t0 + (i64)lane * NPL;
    uint4* const sb = wbuf + cur * 32 * ICH;
    if (whole(tile + stride)) {
      const int nxt = (cur ^ 1) * 32 * ICH;  // the other buffer
      int_fetch_tile(xb + (tile + stride) * ITILE * EB, wbuf + nxt, wsa + 16u * (u32)nxt, sl,
                     lane);
    }
#if ASYNC7
    cp_async_commit();  // possibly empty: one group per iteration keeps the count simple
    cp_async_wait1();   // all but the newest group: this tile is in
#endif
    __syncwarp();
    // A lane's words of this tile: its chunks from the warp's buffer (a whole tile), else
    // from memory element by element.
    auto read_lane = [&](u32* dst) {
      if (whole(tile)) {
#pragma unroll
        for (int c = 0; c < ICH; ++c) {
          put4(dst + 4 * c, sb[sl.row ^ c]);
        }
      } else {
        lane_load_npl(xb, base, count, vin, dst);
      }
    };
    u32 w[IHV * NW];
    read_lane(w);
    __syncwarp();  // the buffer is refilled next iteration
    u32 cw[ICW], dbits;
    // The rare second read (int_encode_lane): this tile's buffer is refilled only in the
    // next iteration, after the warp's __syncwarp that ends the read.
    int_encode_lane(w, lane, base, key, cw, dbits, [&](u32* w2) {
      read_lane(w2);
      if (whole(tile)) __syncwarp();
    });
    int_store_tile(pay, lay, cb, sl, lane, p16, t0, base, K, cw, dbits);
  }
#else
  u32 wn[IHV * NW];
  if (first < lay.ntiles) lane_load_npl(xb, first * ITILE + (i64)lane * NPL, count, vin, wn);
  for (i64 tile = first; tile < lay.ntiles; tile += stride) {
    const i64 t0 = tile * ITILE;
    const i64 base = t0 + (i64)lane * NPL;
    u32 w[IHV * NW];
#pragma unroll
    for (int i = 0; i < IHV * NW; ++i) w[i] = wn[i];
    if (tile + stride < lay.ntiles)
      lane_load_npl(xb, (tile + stride) * ITILE + (i64)lane * NPL, count, vin, wn);
    u32 cw[ICW], dbits;
    int_encode_lane(w, lane, base, key, cw, dbits,
                    [&](u32* w2) { lane_load_npl(xb, base, count, vin, w2); });
    int_store_tile(pay, lay, cb, sl, lane, p16, t0, base, K, cw, dbits);
  }
#endif
}
#endif
