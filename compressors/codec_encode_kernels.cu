// coccl GPU codec kernels, part 3 of 5: taco's and int8's per-group encode and decode
// functions and the 32-elements-a-lane encode kernel (1, 3). Compiled after
// codec_kernels.cu (its defines, arithmetic and conversions, whose header documents every
// define) and codec_tile_helpers.cu (the memory helpers and the Hadamard), and before
// codec_epl_kernels.cu and codec_decode_kernels.cu, as one source:
// gpu_kernels.CODEC_SOURCES. Every section is under its OP's #if, so a build with OP=0
// (the int and tah kernels' helpers) gets none of it.

// =============================================================== taco decode
#if OP == 2 || OP == 8 || OP == 10
// N values v of one group after the inverse Hadamard, times the group's
// s * c / max(alpha, 1e-12) (FORMAT.md; an extended group by its own rule).
template <int N>
DEV void taco_scale_lane(float s, float alpha, float* v) {
#if ASH
  const float c = as_f(CINV_BITS);
#else
  const float c = as_f(BITS_ONE);
#endif
  const float kp = f_div(f_mul(s, c), f_max(alpha, as_f(BITS_1EM12)));
#if ASH
  if (extended_alpha(as_u(alpha))) {  // FORMAT.md: an extended group (rare)
    const float sc = f_mul(s, c), ia = f_div(as_f(BITS_ONE), alpha);
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = sat_inf(f_mul(f_mul(v[r], sc), ia));
    return;
  }
#endif
#pragma unroll
  for (int r = 0; r < N; ++r) v[r] = f_mul(v[r], kp);
}

// One lane's N codes cw of a group (spread over L lanes, lig: the lane's index in it)
// decoded in place of v: FP8 values, the inverse Hadamard when ASH, times the group's
// s * c / max(alpha, 1e-12) (FORMAT.md), s and alpha 1 where the payload has none. Shared
// by the decode kernel (2) and the ring hops (8, 10), so they decode bitwise alike.
template <int N = 32, int L = LPG>
DEV void taco_dequant_lane(const u32* cw, float s, float alpha, int lig, float* v) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) unpack4_fp8(cw[i], v + 4 * i);
#if ASH
  wht_group<N, L>(v, lig);
#else
  (void)lig;
#endif
  taco_scale_lane<N>(s, alpha, v);
}

// The decode of codes and scales an encode has just made (taco_encode_lane's codes, sbits,
// abits): taco_dequant_lane on the values the decode kernel would load from the payload.
template <int N = 32, int L = LPG>
DEV void taco_dequant_encoded(const u32* codes, u32 sbits, u32 abits, int lig, float* v) {
  taco_dequant_lane<N, L>(codes, DUAL ? as_f(sbits) : as_f(BITS_ONE),
                          ASH ? as_f(abits) : as_f(BITS_ONE), lig, v);
}
#endif

// =============================================================== taco encode
#if OP == 1 || OP == 7 || OP == 8 || OP == 10
// The largest |v| of a group's float32 values, as bits (exact: for non-negative floats
// the integer order is the value order; a NaN is above +Inf).
template <int N, int L>
DEV u32 group_absmax_bits(const float* v) {
  u32 m = 0;
#pragma unroll
  for (int r = 0; r < N; ++r) m = max(m, as_u(v[r]) & 0x7fffffffu);
  return group_umax<L>(m);
}

// One lane's part of a group: N consecutive elements, as exact float32 values v (which
// the encode overwrites), of a group spread over L lanes (lig: the lane's index in it).
// Codes: N/4 words; sbits/abits: the group's scales, the same in all its lanes.
template <int N, int L>
DEV void taco_encode_lane(float* v, int lig, u32* codes, u32& sbits, u32& abits) {
  const float qmax = as_f(QMAX_BITS);
  float alpha = as_f(BITS_ONE), c = as_f(BITS_ONE), amax = 0.0f;
#if ASH
  // FORMAT.md's energy: runs of 32 squares summed in order (0 + x*x is x*x, so a run
  // starts from its first square), then the runs added as a pairwise tree: first the
  // lane's own N/32 runs, then across the group's lanes (the xor butterfly).
  float er[N / 32];
#pragma unroll
  for (int q = 0; q < N / 32; ++q) {
    er[q] = f_mul(v[32 * q], v[32 * q]);
#pragma unroll
    for (int r = 1; r < 32; ++r) er[q] = f_add(er[q], f_mul(v[32 * q + r], v[32 * q + r]));
  }
#pragma unroll
  for (int d = 1; d < N / 32; d <<= 1) {
#pragma unroll
    for (int q = 0; q < N / 32; q += 2 * d) er[q] = f_add(er[q], er[q + d]);
  }
  float e = er[0];
#pragma unroll
  for (int t = 1; t < L; t <<= 1) e = f_add(e, __shfl_xor_sync(FULL_MASK, e, t));
  // A NaN or +-Inf element makes the energy NaN or +Inf, so a finite energy proves the
  // group finite and the per-element check runs only when the energy is not finite
  // (a non-finite element, or finite squares whose sum overflowed). The branch is taken
  // by whole warps, because the check shuffles across the group's lanes.
  bool bad = false;
  if (RAW_CHECK || __any_sync(FULL_MASK, (as_u(e) & 0x7fffffffu) >= 0x7f800000u))
    bad = group_absmax_bits<N, L>(v) >= 0x7f800000u;
  // m = e / G: G is a power of two, so e * 2^-log2(G) is the same correctly rounded value
  const float m = f_mul(e, as_f((u32)(127 - LOG2_GS) << 23));
  alpha = f_div(qmax, f_sqrt(f_add(m, as_f(BITS_LAMBDA))));
  alpha = f_min(f_max(alpha, as_f(BITS_1EM3)), as_f(BITS_1E3));
#pragma unroll
  for (int r = 0; r < N; ++r) v[r] = f_mul(v[r], alpha);
  wht_group<N, L>(v, lig);
  amax = 0.0f;
#pragma unroll
  for (int r = 0; r < N; ++r) amax = f_max(amax, f_abs(v[r]));
#pragma unroll
  for (int t = 1; t < L; t <<= 1) amax = f_max(amax, __shfl_xor_sync(FULL_MASK, amax, t));
  c = as_f(CINV_BITS);
#else
  const u32 mb = group_absmax_bits<N, L>(v);
  const bool bad = mb >= 0x7f800000u;
  amax = as_f(mb);
#endif
  (void)amax;
#if DUAL
  float s = f_div(f_max(f_mul(amax, c), as_f(BITS_1EM12)), qmax);
  bool divide = false;  // step 4b without ash: the codes are v / s
#if EXT
  // FORMAT.md step 4b, the extended range: s would leave its clamps (group-uniform, as
  // amax is the group's, so no lane of a group shuffles alone).
  if (!bad && as_u(amax) != 0u && (as_u(s) < BITS_1EM12 || as_u(s) > BITS_1E6)) {
#if ASH
    const int e = (int)(as_u(amax) >> 23);
    const int p = min(max(127 - e, -EXT_SHIFT), EXT_SHIFT);
    const float pw = as_f((u32)(127 + p) << 23);
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = f_mul(v[r], pw);
    alpha = f_mul(alpha, pw);
    s = f_div(f_mul(f_mul(amax, pw), c), qmax);
#else
    s = fit_scale(amax, qmax);
    divide = true;
#endif
  } else
#endif
  {
    s = f_min(f_max(s, as_f(BITS_1EM12)), as_f(BITS_1E6));
  }
  const float k = f_div(c, s);
#else
  const float s = as_f(BITS_ONE);
  const float k = c;
  const bool divide = false;
#endif
  if (divide) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      codes[i] = pack4_fp8(f_div(v[4 * i], s), f_div(v[4 * i + 1], s), f_div(v[4 * i + 2], s),
                           f_div(v[4 * i + 3], s));
  } else {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      codes[i] = pack4_fp8(f_mul(v[4 * i], k), f_mul(v[4 * i + 1], k), f_mul(v[4 * i + 2], k),
                           f_mul(v[4 * i + 3], k));
  }
  sbits = as_u(s);
  abits = as_u(alpha);
  if (bad) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) codes[i] = 0x7f7f7f7fu;
    sbits = BITS_NAN;
    abits = BITS_NAN;
  }
}
#endif

// =============================================================== int8 encode
#if OP == 3 || OP == 5 || OP == 9
// FORMAT.md int8 steps 3-5: the scale of a group whose largest |x| has the bits mb (in
// the values' own type) and the value amax; tiny: step 4 (codes x / scale) applies.
DEV float int8_scale(u32 mb, bool bad, float amax, bool& tiny) {
  float scale = f_div(amax, as_f(BITS_127));
  tiny = !bad && mb != 0u && as_u(scale) <= BITS_2M128;
  if (tiny)
    scale = fit_scale(amax, as_f(BITS_127));
  else if (!bad && as_u(f_mul(scale, as_f(BITS_127))) == BITS_INF)
    scale = next_down(scale);
  return scale;
}

DEV int int8_clamp(int q) { return min(max(q, -127), 127); }
#endif

#if OP == 3 || OP == 9
// One lane's 32 values v of a group (spread over LPG lanes) whose largest |x| has the
// bits mb in the values' own type (inf: that type's infinity) and the value amax: the
// codes and the group's scale, FORMAT.md's int8 arithmetic. Shared by the encode kernel
// (3) and the ring hop (9), so the two quantize bitwise alike.
DEV void int8_quantize_lane(const float* v, u32 mb, u32 inf, float amax, u32* codes,
                            u32& sbits) {
  const bool bad = mb >= inf;
  bool tiny;
  const float scale = int8_scale(mb, bad, amax, tiny);
  const float inv = mb != 0 ? f_div(as_f(BITS_ONE), scale) : 0.0f;
  if (tiny) {  // rare: step 4 divides
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u32 word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        word |= ((u32)int8_clamp(f2i_rn(f_div(v[4 * i + j], scale))) & 0xffu) << (8 * j);
      codes[i] = word;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u32 word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        word |= ((u32)int8_clamp(f2i_rn(f_mul(v[4 * i + j], inv))) & 0xffu) << (8 * j);
      codes[i] = bad ? 0u : word;
    }
  }
  sbits = bad ? BITS_NAN : as_u(scale);
}
#endif

#if OP == 3
DEV void int8_encode_lane(const u32* w, u32* codes, u32& sbits) {
  const u32 mb = group_umax(raw_absmax(w));
  float v[32];
#pragma unroll
  for (int r = 0; r < 32; ++r) v[r] = elem_f32(w, r);
  int8_quantize_lane(v, mb, INF_BITS, raw_to_f32(mb), codes, sbits);
}
#endif

// ======================================================== fast encode kernel (1, 3)
#if OP == 1 || OP == 3
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  __shared__ uint4 smem[WARPS * 32 * CPL];
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int lig = lane & (LPG - 1);
  uint4* sb = smem + wib * 32 * CPL;
  const bool vin = (((u64)xb) & 15) == 0;
  const bool vpay = (((u64)pay) & 15) == 0;
#if OP == 1
  const i64 ncodes = K << LOG2_GS;  // the last group is stored whole
  const bool a4 = (((u64)pay) & 3) == 0;
#else
  const i64 ncodes = count;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
#endif
  const i64 ntiles = (ncodes + 1023) >> 10;
  const i64 stride = (i64)gridDim.x * WARPS;
#if PREFETCH
  // Software pipelining: the next tile's loads are in flight while this tile computes,
  // so one warp overlaps its own memory latency with its arithmetic.
  u32 wn[NW];
  {
    const i64 first = (i64)blockIdx.x * WARPS + wib;
    if (first < ntiles) lane_load(xb, (first << 10) + lane * 32, count, vin, wn);
  }
#endif
  for (i64 tile = (i64)blockIdx.x * WARPS + wib; tile < ntiles; tile += stride) {
    const i64 t0 = tile << 10;
    const i64 base = t0 + lane * 32;
    const i64 g = base >> LOG2_GS;
    u32 w[NW];
#if PREFETCH
    const bool staged = false;
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = wn[i];
    if (tile + stride < ntiles) lane_load(xb, ((tile + stride) << 10) + lane * 32, count, vin, wn);
#else
    const bool staged = STAGE && vin && vpay && (t0 + 1024 <= count);
    if (staged)
      staged_load<CPL>((const uint4*)(xb + t0 * EB), sb, lane, w);
    else
      lane_load(xb, base, count, vin, w);
#endif
    u32 codes[8];
#if OP == 1
    u32 sbits, abits;
    float v[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) v[r] = elem_f32(w, r);
    taco_encode_lane<32, LPG>(v, lig, codes, sbits, abits);
#else
    u32 sbits;
    int8_encode_lane(w, codes, sbits);
#endif
    if (staged) {
      staged_store<2>((uint4*)(pay + t0), sb, lane, codes);
    } else if (base < ncodes) {
      const i64 left = ncodes - base;
      store_bytes32(pay + base, codes, vpay, left >= 32 ? 32 : (int)left);
    }
    if (lig == 0 && g < K) {
#if OP == 1
      taco_store_scales(pay, ncodes, K, g, a4, sbits, abits);
#else
      st32(pay + count + 4 * g, sbits, a4);
#endif
    }
  }
}
#endif
