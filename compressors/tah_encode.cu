// The tah codec's encode tiles kernel (TAH_OP 2), compiled after tah_kernels.cu (its
// defines, layout and shared helpers) and before tah_decode.cu and tah_score.cu.

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
    for (int i = 0; i < NRAW / 4; ++i) put4(w + 4 * i, ldg4(p + i));
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
        wht_group<EPL, LT>(v, li);  // codec_tile_helpers.cu's: h < EPL in the lane, then across
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
