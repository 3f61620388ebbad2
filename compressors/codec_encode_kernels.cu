// coccl GPU codec kernels, part 2 of 3: taco's and int8's per-group encode and decode
// functions, the 32-elements-a-lane encode kernel (1, 3), taco's EPL encode (7) and its
// EPL ring hop (10). Compiled after codec_kernels.cu (its defines, arithmetic,
// conversions and memory helpers, whose header documents every define) and before
// codec_decode_kernels.cu, as one source: gpu_kernels.CODEC_SOURCES. Every section is
// under its OP's #if, so a build with OP=0 (the int and tah kernels' helpers) gets none
// of it.

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

// =================================== taco encode, EPL elements per lane (7)
// The same encode with each lane holding EPL = min(G, 128) consecutive elements, so that a
// G <= 128 group lives in one lane: no shuffles, and the group's scalar arithmetic (the
// divisions and the square root) is paid once per group instead of once per 32 elements.
// A warp's tile (32 * EPL elements) is read and its codes written with coalesced 16-byte
// accesses through per-warp shared-memory buffers (lane-strided accesses straight from
// global memory saturated the memory pipeline at half the copy bandwidth). Two buffers per
// warp: the next tile is copied in (cp.async, sm_80+) while this one is computed, since
// with ~12 warps per SM a warp cannot wait for its own loads.
#if OP == 7 || OP == 10
#ifndef EPL
#define EPL 128
#endif
#define L7 (GS / EPL)        // lanes per group
#define CH7 (EPL * EB / 16)  // 16-byte chunks of a lane's elements
#define CC7 (EPL / 16)       // 16-byte chunks of a lane's codes

// Shared-memory slot of chunk c of lane l, for CH chunks per lane: the xor keeps the
// 8 lanes of a quarter-warp on distinct 16-byte bank groups both when each lane walks
// its own chunks and when the warp walks the tile in order (no bank conflicts).
template <int CH>
DEV int slot7(int l, int c) {
  const int f = CH >= 8 ? (l & 7) : (((l * CH) >> 3) & (CH - 1));
  return l * CH + (c ^ f);
}

// The slot of a warp's tile chunk j * 32 + lane when the warp walks the tile in order: it
// is chunk lane % CH of lane j * (32 / CH) + lane / CH (CH divides 32), written so that
// the compiler folds the unrolled j.
template <int CH>
DEV int tile_slot7(int j, int lane) {
  return slot7<CH>(j * (32 / CH) + lane / CH, lane & (CH - 1));
}

// tile_slot7's period in j: tile_slot7(j + P, lane) = tile_slot7(j, lane) + 32 P (the
// swizzle f repeats every 8 lanes, 8 lanes are P * 32 / CH chunks apart). So a tile walk
// needs P addresses a tile; its other chunks are those plus constant offsets.
template <int CH>
__host__ __device__ constexpr int period7() {
  return CH >= 8 ? CH / 4 : 1;
}

// The EPL kernels' buffers are addressed by 32-bit shared-memory addresses on the GPU
// (what ld/st.shared and cp.async take; a generic pointer costs a conversion per access)
// and by plain addresses in the host emulation. A buffer of CH chunks a lane starts on a
// multiple of 16 * CH bytes (EPL_SMEM_ALIGN), so lane l's chunk c lies at the xor
// (buf + 16 * slot7(l, 0)) ^ (16 * c): one logic operation a chunk.
#define EPL_SMEM_ALIGN 512  // 16 bytes x the most chunks a lane holds (32: 128 float32)
#if ASYNC7
typedef u32 saddr;
DEV saddr saddr_of(const uint4* p) { return smem_addr(p); }
DEV uint4 lds16(saddr a) {
  uint4 q;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "r"(a) : "memory");
  return q;
}
DEV void sts16(saddr a, const uint4& q) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
               ::"r"(a), "r"(q.x), "r"(q.y), "r"(q.z), "r"(q.w) : "memory");
}
#else
typedef u64 saddr;
DEV saddr saddr_of(const uint4* p) { return (u64)p; }
DEV uint4 lds16(saddr a) { return *(const uint4*)a; }
DEV void sts16(saddr a, const uint4& q) { *(uint4*)a = q; }
#endif

// Lane `lane`'s row of a buffer at shared address buf (CH chunks a lane): its chunk c is
// at lane_row7(...) ^ (16 * c).
template <int CH>
DEV saddr lane_row7(saddr buf, int lane) {
  return buf + (saddr)(16 * slot7<CH>(lane, 0));
}

// Start copying a warp's tile at `tile_bytes` (32 lanes' CH chunks each, in order) into
// the buffer at buf, chunk c of lane l at slot7<CH>(l, c).
template <int CH>
DEV void tile_fetch7(const char* tile_bytes, saddr buf, int lane) {
  const uint4* g = (const uint4*)tile_bytes + lane;
  constexpr int P = period7<CH>();
  saddr at[P];
#pragma unroll
  for (int p = 0; p < P; ++p) at[p] = buf + (saddr)(16 * tile_slot7<CH>(p, lane));
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const saddr d = at[j % P] + (saddr)(16 * 32 * (j - j % P));
#if ASYNC7
    cp_async16_to(d, g + j * 32);
#else
    sts16(d, ldg4(g + j * 32));
#endif
  }
}

// The lanes' words (CH chunks each, lane l's chunk c at slot7<CH>(l, c) of the buffer at
// buf) written as a warp's tile at `tile_bytes` with coalesced 16-byte stores.
template <int CH>
DEV void tile_store7(char* tile_bytes, saddr buf, int lane, const u32* w) {
  const saddr row = lane_row7<CH>(buf, lane);
#pragma unroll
  for (int c = 0; c < CH; ++c)
    sts16(row ^ (saddr)(16 * c), make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]));
  __syncwarp();
  uint4* g = (uint4*)tile_bytes + lane;
  constexpr int P = period7<CH>();
  saddr at[P];
#pragma unroll
  for (int p = 0; p < P; ++p) at[p] = buf + (saddr)(16 * tile_slot7<CH>(p, lane));
#pragma unroll
  for (int j = 0; j < CH; ++j) g[j * 32] = lds16(at[j % P] + (saddr)(16 * 32 * (j - j % P)));
  __syncwarp();
}

// A lane's EPL codes at cp: 16-byte stores when aligned, else byte by byte.
DEV void lane_store_codes7(unsigned char* cp, const u32* codes, bool v16) {
  if (v16) {
#pragma unroll
    for (int j = 0; j < CC7; ++j)
      ((uint4*)cp)[j] =
          make_uint4(codes[4 * j], codes[4 * j + 1], codes[4 * j + 2], codes[4 * j + 3]);
  } else {
#pragma unroll
    for (int r = 0; r < EPL; ++r) cp[r] = (unsigned char)(codes[r >> 2] >> (8 * (r & 3)));
  }
}
#endif

#if OP == 7
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  alignas(EPL_SMEM_ALIGN) __shared__ uint4 smem[2 * WARPS * 32 * CH7];
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const int lig = lane & (L7 - 1);
  const saddr wbuf = saddr_of(smem + (threadIdx.x >> 5) * 64 * CH7);  // two buffers a warp
  const saddr bufb = 16 * 32 * CH7;                                   // bytes of one
  const bool vin = (((u64)xb) & 15) == 0;
  const bool vpay = (((u64)pay) & 15) == 0;
  const bool a4 = (((u64)pay) & 3) == 0;
  const i64 ncodes = K << LOG2_GS;  // the last group is stored whole
  const i64 ntiles = (ncodes + 32 * EPL - 1) / (32 * EPL);
  const i64 stride = (i64)gridDim.x * WARPS;
  // A tile whose elements all exist is fetched whole (warp-uniform); others load per lane.
  // Those are the tiles below nwhole: (t + 1) * 32 * EPL <= count, and t < ntiles.
  const i64 nwhole = vin ? min(count / (32 * EPL), ntiles) : 0;
  auto fetched = [&](i64 t) { return t < nwhole; };
  i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int cur = 0;
  if (fetched(tile)) tile_fetch7<CH7>(xb + tile * 32 * EPL * EB, wbuf, lane);
#if ASYNC7
  cp_async_commit();
#endif
  // Whole warps iterate together (the group's lanes shuffle when L7 > 1); a lane past the
  // last group encodes zeros and stores nothing.
  for (; tile < ntiles; tile += stride, cur ^= 1) {
    const i64 t0 = tile * 32 * EPL;
    const i64 base = t0 + lane * EPL;
    const saddr sb = wbuf + (cur ? bufb : 0);
    if (fetched(tile + stride))
      tile_fetch7<CH7>(xb + (tile + stride) * 32 * EPL * EB, wbuf + (cur ? 0 : bufb), lane);
#if ASYNC7
    cp_async_commit();  // possibly empty: one group per iteration keeps the count simple
    cp_async_wait1();   // all but the newest group: this tile is in
#endif
    __syncwarp();
    float v[EPL];
    if (fetched(tile)) {
      const saddr row = lane_row7<CH7>(sb, lane);
#pragma unroll
      for (int c = 0; c < CH7; ++c) {
        const uint4 q = lds16(row ^ (saddr)(16 * c));
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int r = 0; r < 16 / EB; ++r) v[c * (16 / EB) + r] = elem_f32(w, r);
      }
      __syncwarp();
    } else {
#pragma unroll
      for (int r = 0; r < EPL; ++r) {
        const i64 e = base + r;
        const u32 w[1] = {e < count ? load_elem_raw(xb, e) : 0u};
        v[r] = elem_f32(w, 0);
      }
    }
    u32 codes[EPL / 4], sbits, abits;
    taco_encode_lane<EPL, L7>(v, lig, codes, sbits, abits);
    if (t0 + 32 * EPL <= ncodes && vpay) {  // warp-uniform: the whole tile, coalesced
      tile_store7<CC7>((char*)(pay + t0), sb, lane, codes);
    } else if (base < ncodes) {
      lane_store_codes7(pay + base, codes, vpay);
    }
    if (lig == 0 && base < ncodes)
      taco_store_scales(pay, ncodes, K, base >> LOG2_GS, a4, sbits, abits);
  }
}
#endif

// ========================== taco ring hop, EPL elements per lane (10)
// Kernel 8's hop (with DEC, its decoded output too) in kernel 7's layout: each lane holds
// EPL consecutive elements (a group over L7 = G / EPL lanes: fewer shuffles, the group's
// scalars paid by fewer lanes). A warp's tile of 32 * EPL codes is copied into shared
// memory (cp.async) while the previous tile computes, in two buffers; its 32 * EPL own
// elements, needed only after the decode, in one buffer, copied in as soon as the previous
// tile has added its own (with DEC: once its decoded values have left through it). The
// codes and decoded values leave through those buffers with coalesced stores. One own
// buffer instead of two lets a block of four warps keep 64 float32 elements a lane within
// 48 KiB. Bitwise kernel 8: the same dequantization, addition and encode of every element
// and group.
#if OP == 10
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) coccl_codec(HOP_PARAMS) {
  // Per warp a tile's own elements (32 * CH7 chunks) and two tiles' codes (32 * CC7 each).
  alignas(EPL_SMEM_ALIGN) __shared__ uint4 smem[WARPS * 32 * (CH7 + 2 * CC7)];
  const int lane = threadIdx.x & 31;
  const int lig = lane & (L7 - 1);
  const HopIo io = hop_io(own, src, dst, HOP_DEC_ARG);
  const char* xb = io.xb;
  const unsigned char* pin = io.pin;
  unsigned char* pout = io.pout;
  const bool vin = io.vin, vpi = io.vpi, vpo = io.vpo;
  const saddr sb = saddr_of(smem + (threadIdx.x >> 5) * 32 * (CH7 + 2 * CC7));  // own
  const saddr scodes = sb + 16 * 32 * CH7;  // the two codes buffers
  const saddr bufc = 16 * 32 * CC7;          // bytes of one
  const bool a4i = (((u64)pin) & 3) == 0;
  const bool a4o = (((u64)pout) & 3) == 0;
  const i64 ncodes = K << LOG2_GS;  // a multiple of EPL: a lane's codes are all in or all out
  const i64 ntiles = (ncodes + 32 * EPL - 1) / (32 * EPL);
  const i64 stride = (i64)gridDim.x * WARPS;
  // A tile whose elements all exist, in aligned buffers, is fetched whole (warp-uniform);
  // others load per lane. Those are the tiles below nwhole: (t + 1) * 32 * EPL <= count,
  // and t < ntiles.
  const i64 nwhole = vin && vpi ? min(count / (32 * EPL), ntiles) : 0;
  auto fetched = [&](i64 t) { return t < nwhole; };
  auto fetch_codes = [&](i64 t, saddr b) {
    if (fetched(t)) tile_fetch7<CC7>((const char*)pin + t * 32 * EPL, b, lane);
#if ASYNC7
    cp_async_commit();  // possibly empty: one group per call keeps the count simple
#endif
  };
  auto fetch_own = [&](i64 t) {
    if (fetched(t)) tile_fetch7<CH7>(xb + t * 32 * EPL * EB, sb, lane);
#if ASYNC7
    cp_async_commit();
#endif
  };
  // cp.async groups in the order committed: codes(t), own(t), codes(t + stride),
  // own(t + stride), ...: each iteration commits the next tile's codes, then waits for
  // all but the two newest groups (this tile's codes are in) before the decode and for
  // all but the newest (this tile's own) before the addition.
  i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int cur = 0;
  fetch_codes(tile, scodes);
  fetch_own(tile);
  // Whole warps iterate together (a group's lanes shuffle); a lane past the last group
  // computes on zeros and stores nothing.
  for (; tile < ntiles; tile += stride, cur ^= 1) {
    const i64 t0 = tile * 32 * EPL;
    const i64 base = t0 + lane * EPL;
    const i64 g = base >> LOG2_GS;
    const bool live = base < ncodes;
    const bool whole = fetched(tile);
    const saddr sc = scodes + (cur ? bufc : 0);  // the tile's codes
    fetch_codes(tile + stride, scodes + (cur ? 0 : bufc));
#if ASYNC7
    cp_async_wait2();  // all but the two newest groups: this tile's codes are in
#endif
    __syncwarp();
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    if (live) taco_load_scales(pin, ncodes, K, g, a4i, s, alpha);
    u32 cw[EPL / 4];
    if (whole) {
      const saddr row = lane_row7<CC7>(sc, lane);
#pragma unroll
      for (int j = 0; j < CC7; ++j) {
        const uint4 q = lds16(row ^ (saddr)(16 * j));
        cw[4 * j] = q.x, cw[4 * j + 1] = q.y, cw[4 * j + 2] = q.z, cw[4 * j + 3] = q.w;
      }
    } else if (live) {
#pragma unroll
      for (int j = 0; j < EPL / 32; ++j) load_bytes32(pin + base + 32 * j, cw + 8 * j, vpi);
    } else {
#pragma unroll
      for (int i = 0; i < EPL / 4; ++i) cw[i] = 0;
    }
    float v[EPL];
    taco_dequant_lane<EPL, L7>(cw, s, alpha, lig, v);
#if ASYNC7
    cp_async_wait1();  // all but the newest group: this tile's own elements are in
#endif
    __syncwarp();
    if (whole) {
      const saddr row = lane_row7<CH7>(sb, lane);
#pragma unroll
      for (int c = 0; c < CH7; ++c) {
        const uint4 q = lds16(row ^ (saddr)(16 * c));
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int r = 0; r < 16 / EB; ++r) {
          const int i = c * (16 / EB) + r;
          v[i] = f_add(elem_f32(w, r), v[i]);
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < EPL; ++r) {
        const i64 e = base + r;
        const u32 w[1] = {e < count ? load_elem_raw(xb, e) : 0u};
        v[r] = e < count ? f_add(elem_f32(w, 0), v[r]) : 0.0f;
      }
    }
    __syncwarp();  // the own buffer and this tile's codes buffer are read
#if !DEC
    fetch_own(tile + stride);
#endif
    u32 codes[EPL / 4], sbits, abits;
    taco_encode_lane<EPL, L7>(v, lig, codes, sbits, abits);
    if (whole && vpo)
      tile_store7<CC7>((char*)(pout + t0), sc, lane, codes);
    else if (live)
      lane_store_codes7(pout + base, codes, vpo);
    if (live && lig == 0) taco_store_scales(pout, ncodes, K, g, a4o, sbits, abits);
#if DEC
    taco_dequant_encoded<EPL, L7>(codes, sbits, abits, lig, v);
    if (whole && io.vout) {
      u32 ow[CH7 * 4];
#pragma unroll
      for (int j = 0; j < EPL / 32; ++j) pack_out32(v + 32 * j, ow + NW * j);
      tile_store7<CH7>(io.ob + t0 * EB, sb, lane, ow);
    } else if (live) {
#pragma unroll
      for (int j = 0; j < EPL / 32; ++j)
        store_out32(io.ob, base + 32 * j, count, io.vout, v + 32 * j);
    }
    fetch_own(tile + stride);  // the decoded values have left through the own buffer
#endif
  }
}
#endif
