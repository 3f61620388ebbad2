// The int codec's decode kernel (IOP 2): the rotation on integer codes (packed two a
// word where exact), a lane's stores or float32 accumulation, the tile loads one tile
// ahead, and coccl_int. Compiled last, after intq_kernels.cu (its defines and shared
// helpers) and intq_encode.cu, as one source: intq_gpu._SOURCES.

// ======================================================================== decode
#if IOP == 2
// The decode's transform acts on integers: codes of magnitude at most 2^(BITS-1), sums of
// at most HAD of them, all exact in float32 (below 2^24), so the result does not depend on
// the order of the adds and may be computed in integer arithmetic, two values a register.
// IPACK: a lane's codes are unpacked straight into pairs of 16-bit fields, one pair a
// 32-bit word P = lo + 2^16 * hi (mod 2^32, each field signed); adding and subtracting
// such words adds and subtracts both fields at once (the map is linear), and a field's
// final value fits 16 bits: |lo|, |hi| <= 2^(BITS-1) * HAD / 2 < 2^15 (the words' stages
// add up HAD / 2 codes a field). A word's fields are codes r and r + IFH of one code word
// (r < IFH, the codes of a 16-bit half), extracted together by one shift and one mask; the
// stage that pairs elements i and i + IFH, the two fields of one word, is done while
// unpacking them.
#define IPACK (HAD > 0 && 16 % BITS == 0 && (1 << (BITS - 2)) * HAD < 32768)
#if IPACK
#define IFH (16 / BITS)  // codes in a 16-bit half of a code word
#define INP (NPL / 2)     // packed words of a lane
#define IBLK (HAD < NPL ? HAD : NPL)  // elements of a Hadamard block in one lane
// Whether the stage h = IFH lies within a block (else the two fields of a word belong to
// different blocks and are never combined).
#define ICOMB (IFH < IBLK)
// Packed stages in the lane: the block's index bits but the one of IFH.
#define INST (ilog2(IBLK) - (ICOMB ? 1 : 0))

// The rotated values w (integers) of a lane's NPL codes cw, as packed words p: word
// j = k * IFH + r holds elements k * ICPW + r (low field) and k * ICPW + r + IFH (high).
DEV void int_rotate_packed(const u32* cw, int lane, int* p) {
  // Fields as unsigned u = q + 2^(BITS-1) (the sign bit flipped): no borrow between them.
  constexpr u32 FIELDS = ((1u << BITS) - 1u) * 0x00010001u;
#pragma unroll
  for (int k = 0; k < ICW; ++k) {
    const u32 f = cw[k] ^ ISIGNS;
#pragma unroll
    for (int r = 0; r < IFH; ++r) p[k * IFH + r] = (int)((f >> (BITS * r)) & FIELDS);
  }
  // The packed stages, two at a time where there are two (a 4-point transform with
  // three-input adds), in any order: the sums are exact.
#pragma unroll
  for (int s = 0; s < INST; s += 2) {
    const int t1 = 1 << s;
    if (s + 1 < INST) {
      const int t2 = 2 << s;
#pragma unroll
      for (int j = 0; j < INP; ++j) {
        if ((j & t1) == 0 && (j & t2) == 0) {
          const int a = p[j], b = p[j + t1], c = p[j + t2], e = p[j + t1 + t2];
          const int sum = a + b, dif = a - b;
          p[j] = sum + c + e;
          p[j + t1] = dif + c - e;
          p[j + t2] = sum - c - e;
          p[j + t1 + t2] = dif - c + e;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < INP; ++j) {
        if ((j & t1) == 0) {
          const int a = p[j], b = p[j + t1];
          p[j] = a + b;
          p[j + t1] = a - b;
        }
      }
    }
  }
  // The offsets 2^(BITS-1) of the inputs, transformed: 2^INST times each in the first
  // word of every block of 2^INST words, nothing elsewhere.
  constexpr u32 OFFSETS = (IQB << INST) * 0x00010001u;
#pragma unroll
  for (int j = 0; j < INP; j += 1 << INST) p[j] -= (int)OFFSETS;
#if HAD > NPL
  // The stages across the block's lanes: the lane whose bit is clear computes own +
  // partner, the other partner - own.
  const int lig = lane & (HLANES - 1);
#pragma unroll
  for (int t = 1; t < HLANES; t <<= 1) {
    const int sgn = (lig & t) ? -1 : 1;
#pragma unroll
    for (int j = 0; j < INP; ++j)
      p[j] = (int)__shfl_xor_sync(FULL_MASK, (u32)p[j], t) + sgn * p[j];
  }
#else
  (void)lane;
#endif
}
#endif
// A lane's NPL decoded values v at elements [base, base + NPL) of out (those below count),
// written, or added to a float32 out (ACC); whole: the warp's tile [t0, t0 + ITILE) lies
// within count and out is 16-byte aligned, so it moves coalesced through sb.
DEV void int_store_lane(char* ob, i64 t0, i64 base, i64 count, bool whole, bool vout,
                        uint4* sb, const IntSlots& sl, int lane, const float* v) {
#if ACC
  if (whole) {
    // Plain loads (not __ldg): this kernel writes these addresses.
    const uint4* ap = (const uint4*)(ob + t0 * 4);
    uint4 t[IOCH];
#pragma unroll
    for (int j = 0; j < IOCH; ++j) t[j] = ap[j * 32 + lane];
    u32 acc[NPL];
    staged_transpose<IOCH>(t, sb, lane, acc);
#pragma unroll
    for (int i = 0; i < NPL; ++i) acc[i] = as_u(f_add(as_f(acc[i]), v[i]));
    staged_store<IOCH>((uint4*)(ob + t0 * 4), sb, lane, acc);
  } else {
    float* o = (float*)ob;
#pragma unroll
    for (int i = 0; i < NPL; ++i)
      if (base + i < count) o[base + i] = f_add(o[base + i], v[i]);
  }
#else
  if (whole) {
    u32 ow[IHV * NW];
#pragma unroll
    for (int hv = 0; hv < IHV; ++hv) pack_out32(v + 32 * hv, ow + hv * NW);
#if ICH <= 8
    // staged_store at this lane's slots
    uint4* g = (uint4*)(ob + t0 * EB);
#pragma unroll
    for (int j = 0; j < ICH; ++j)
      sb[sl.row ^ j] = make_uint4(ow[4 * j], ow[4 * j + 1], ow[4 * j + 2], ow[4 * j + 3]);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < ICH; ++j) g[j * 32 + lane] = sb[col_slot(sl, j)];
    __syncwarp();
#else
    (void)sl;
    staged_store<ICH>((uint4*)(ob + t0 * EB), sb, lane, ow);
#endif
  } else if (base < count) {
#pragma unroll
    for (int hv = 0; hv < IHV; ++hv) store_out32(ob, base + 32 * hv, count, vout, v + 32 * hv);
  }
#endif
}

// What the decode loads of a tile before its work: the scale d of lane's group and,
// where the tile's codes are whole words (whole: the payload aligned and the tile within
// the coded elements), the tile's code words j * 32 + lane in raw. Issued one tile ahead,
// so that a warp's next loads are in flight while it transforms and stores this tile.
DEV bool int_fetch(const unsigned char* pay, const IntPay& lay, i64 K, i64 tile, int lane,
                   u32* raw, float& d) {
  const i64 t0 = tile * ITILE;
  const i64 g = (t0 + (i64)lane * NPL) / GS;
  d = g < K ? as_f(ld32(pay + lay.cbytes + 4 * g, lay.a4)) : 0.0f;
  const bool whole = lay.p4 && t0 + ITILE <= lay.coded;
  if (whole) {
    const u32* gp = (const u32*)(pay + t0 * BITS / 8);
#pragma unroll
    for (int j = 0; j < ICW; ++j) raw[j] = __ldg(gp + j * 32 + lane);
  }
  return whole;
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_int(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K, u64 key) {
  (void)key;
#if ACC
  __shared__ uint4 smem[WARPS * 32 * IOCH];
#else
  __shared__ uint4 smem[WARPS * 32 * ICH];
#endif
  __shared__ u32 cbuf[WARPS * 32 * ICS];
  const unsigned char* pay = (const unsigned char*)src;
  char* ob = (char*)dst;
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
#if ACC
  uint4* sb = smem + wib * 32 * IOCH;
#else
  uint4* sb = smem + wib * 32 * ICH;
#endif
  u32* cb = cbuf + wib * 32 * ICS;
  const IntPay lay = int_pay(pay, count);
  const bool vout = (((u64)ob) & 15) == 0;
  const IntSlots sl = int_slots(lane);
  const i64 stride = (i64)gridDim.x * WARPS;
  const i64 first = (i64)blockIdx.x * WARPS + wib;
  u32 nraw[ICW] = {};  // the next tile's loads (int_fetch)
  float nd = 0.0f;
  bool nwhole = first < lay.ntiles && int_fetch(pay, lay, K, first, lane, nraw, nd);
  for (i64 tile = first; tile < lay.ntiles; tile += stride) {
    const i64 t0 = tile * ITILE;
    const i64 base = t0 + (i64)lane * NPL;
    const float d = nd;
    const bool cwhole = nwhole;
    u32 raw[ICW];
#pragma unroll
    for (int j = 0; j < ICW; ++j) raw[j] = nraw[j];
    if (tile + stride < lay.ntiles) nwhole = int_fetch(pay, lay, K, tile + stride, lane, nraw, nd);
    // ---- codes
    u32 cw[ICW];
    if (cwhole) {
      codes_load(raw, cb, sl, lane, cw);
    } else {
      const i64 b0 = base * BITS / 8;
#pragma unroll
      for (int j = 0; j < ICW; ++j) cw[j] = 0u;
#pragma unroll
      for (int b = 0; b < 4 * ICW; ++b)
        if (b0 + b < lay.cbytes) cw[b >> 2] |= (u32)pay[b0 + b] << (8 * (b & 3));
    }
    // ---- values: w_i = q_i, the transform (exact), then * D
    float v[NPL];
#if IPACK
    {
      int p[INP];
      int_rotate_packed(cw, lane, p);
#pragma unroll
      for (int j = 0; j < INP; ++j) {
        const int i = (j / IFH) * ICPW + j % IFH;  // the low field's element
        const int lo = (int)(short)p[j];          // sign-extended
        const int hi = (p[j] - lo) >> 16;         // exact: p - lo = 2^16 * hi
        v[i] = (float)(ICOMB ? lo + hi : lo);     // exact: below 2^24
        v[i + IFH] = (float)(ICOMB ? lo - hi : hi);
      }
    }
#else
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int bit = i * BITS;
      u32 f = cw[bit >> 5] >> (bit & 31);
      if ((bit & 31) + BITS > 32) f |= cw[(bit >> 5) + 1] << (32 - (bit & 31));
      v[i] = (float)(((int)(f << (32 - BITS))) >> (32 - BITS));  // sign-extended, exact
    }
#endif
#if HAD
#if !IPACK
    int_rotate(v, lane);
#endif
#if XT != 0 && !ACC
    // sat is the identity here: the 16-bit output's rounding takes FLT_MAX to Inf too.
#pragma unroll
    for (int i = 0; i < NPL; ++i) v[i] = f_mul(v[i], d);
#else
    // |w_i| <= 2^(BITS-1) * HAD = 2^IWB, so below the threshold no product overflows and
    // sat is the identity; above it (huge groups, NaN) the lane takes sat.
    constexpr int IWB = BITS - 1 + ilog2(HAD);
    if ((as_u(d) & 0x7fffffffu) < ((u32)(254 - IWB) << 23)) {
#pragma unroll
      for (int i = 0; i < NPL; ++i) v[i] = f_mul(v[i], d);
    } else {
#pragma unroll
      for (int i = 0; i < NPL; ++i) v[i] = sat_inf(f_mul(v[i], d));
    }
#endif
#else
#pragma unroll
    for (int i = 0; i < NPL; ++i) v[i] = f_mul(v[i], d);
#endif
    // ---- output
    int_store_lane(ob, t0, base, count, vout && t0 + ITILE <= count, vout, sb, sl, lane, v);
  }
}
#endif
