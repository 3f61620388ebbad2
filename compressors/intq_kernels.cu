// coccl GPU kernels of the `int` codec (2..8-bit symmetric integers), bit-exact with
// FORMAT.md's `## int` section and the numba kernels of intq_cpu.py.
//
// compressors/intq_gpu.py compiles this file appended to codec_kernels.cu built with OP=0,
// which defines none of that file's kernels, only its helpers: the inline-PTX float32
// arithmetic (RNE, no FMA contraction, no flush of subnormals), the element loads and
// stores of type XT, the shared-memory staging of a warp's tile, group_umax and the
// Walsh-Hadamard stages wht_group. Every float operation below goes through them.
//
// Defines (besides codec_kernels.cu's OP=0, GS, XT, ACC, THREADS, MIN_BLOCKS):
//   IOP     1 encode, 2 decode
//   BITS    bits per code, 2..8
//   HAD     Hadamard block H (0: none; else a power of two, 8 <= H <= GS)
//   STOCH   encode: 1 stochastic rounding (FORMAT.md's u_i), 0 round to nearest even
//   NPL     elements per lane: 32, or 64 for GS = 2048 (a group lies in GS / NPL lanes)
//   ISTAGE  encode: 1 copies whole tiles into shared memory ahead (cp.async), 0 reads
//           lane by lane one tile ahead in registers (the kernel's comment says more)
//
// Layout: a warp works on tiles of 32 * NPL consecutive elements; lane l holds elements
// [NPL l, NPL l + NPL) of its tile in registers, as NPL / 32 halves of 32. Its codes are
// NPL * BITS / 32 whole words (a lane's first element is a multiple of 32), so a tile's
// codes are written and read as coalesced words (each lane's 16-byte vectors, or through
// shared memory), and the decode's elements as coalesced 16-byte chunks (staged_store),
// wherever the tile is whole and the buffers aligned; elsewhere each lane accesses its own
// elements and bytes. The encode reads a whole tile into shared memory one tile ahead
// (ISTAGE; lane by lane where the tile is partial or x unaligned).
//
// Kernel: `coccl_int(const void* src, void* dst, i64 count, i64 K, u64 key)`; encode:
// src = x, dst = payload; decode: src = payload, dst = out. key: the stochastic rounding's
// stream key (FORMAT.md; unused otherwise).

#ifndef IOP
#error "IOP must be defined"
#endif
#ifndef BITS
#define BITS 4
#endif
#ifndef HAD
#define HAD 0
#endif
#ifndef STOCH
#define STOCH 0
#endif
#ifndef NPL
#define NPL 32
#endif
#ifndef ISTAGE
#define ISTAGE 0
#endif

#define IQMAX ((1 << (BITS - 1)) - 1)
#define ILPG (GS / NPL)          // lanes per group
#define IHV (NPL / 32)           // halves of 32 elements per lane
#define ICW (NPL * BITS / 32)    // code words per lane
#define ITILE (32 * NPL)         // elements per warp tile
#define ICH (IHV * CPL)          // 16-byte chunks of a lane's elements
#define IOCH (IHV * 8)           // 16-byte chunks of a lane's float32 accumulator
#define ICS (ICW + 1)            // smem stride of a lane's code words (odd: no conflicts)
#if HAD > NPL
#define HLANES (HAD / NPL)  // lanes per Hadamard block
#else
#define HLANES 1
#endif

#define BITS_QMAX_F ((float)IQMAX)
#define IQB (1u << (BITS - 1))  // the offset of a code's unsigned form u = q + 2^(BITS-1)
// With BITS 2, 4 or 8 a code word holds ICPW whole codes; ISIGNS has each one's top bit,
// so that flipping them turns codes q into their unsigned forms u and back.
#define ICPW (32 / BITS)
#define ISIGNS ((0xffffffffu / ((1u << BITS) - 1u)) << (BITS - 1))
#define BITS_2M24 0x33800000u  // 2^-24

// ------------------------------------------------------------------ the key stream
DEV u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FORMAT.md's u_i: the top 24 bits of splitmix64's output i + 1 from state key, * 2^-24.
DEV float uniform24(u64 key, i64 i) {
  const u64 z = mix64(key + (u64)(i + 1) * 0x9E3779B97F4A7C15ull);
  return f_mul((float)(u32)(z >> 40), as_f(BITS_2M24));  // both exact
}

DEV float floor_f(float a) {  // exact, no flush of subnormals
#if defined(__CUDA_ARCH__)
  float d;
  asm("cvt.rmi.f32.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
#else
  return floorf(a);
#endif
}

// ----------------------------------------------------------- the rotation (step 2)
// The transform of every block of HAD among a lane's NPL values v (lane: its index in
// the warp; blocks start at multiples of HAD, tiles at multiples of ITILE >= HAD).
DEV void int_rotate(float* v, int lane) {
#if HAD >= NPL
  wht_group<NPL, HLANES>(v, lane & (HLANES - 1));
#elif HAD > 0
#pragma unroll
  for (int b = 0; b < NPL; b += HAD) wht_group<HAD, 1>(v + b, 0);
#endif
}

// ------------------------------------------------------------ the payload's layout
struct IntPay {
  i64 coded;   // elements with codes: count, or count rounded up to HAD
  i64 cbytes;  // bytes of codes: the scales start here
  i64 ntiles;  // warp tiles over the coded elements
  bool p4;     // the payload is 4-byte aligned (a tile's codes: whole words)
  bool a4;     // the scales are 4-byte aligned
};

DEV IntPay int_pay(const void* pay, i64 count) {
  IntPay p;
  p.coded = HAD ? (count + HAD - 1) / HAD * HAD : count;
  p.cbytes = (p.coded * BITS + 7) >> 3;
  p.ntiles = (p.coded + ITILE - 1) / ITILE;
  p.p4 = (((u64)pay) & 3) == 0;
  p.a4 = (((u64)pay + (u64)p.cbytes) & 3) == 0;
  return p;
}

// A lane's slots in its warp's staging buffers, the same in every tile, so computed once
// before the tile loop (the compiler recomputes the swizzles in every tile otherwise).
// Of a 16-byte chunk buffer (swz's layout, as staged_transpose and staged_store use it):
// chunk j * 32 + lane of the tile lies at slot col[j & 1] + 64 * (j >> 1) (swz moves only
// bits 0-2, by bits 3-5), and where ICH <= 8 the lane's own chunk lane * ICH + c at
// row ^ c (c < ICH changes none of bits 3-5). Of the code-word buffer (stride ICS a lane):
// word j * 32 + lane of the tile lies at code_slot(j).
struct IntSlots {
  int col[2], row, code;
};

DEV IntSlots int_slots(int lane) {
  IntSlots s;
  s.col[0] = swz(lane);
  s.col[1] = swz(32 + lane);
  s.row = swz(lane * ICH);
  s.code = (lane / ICW) * ICS + lane % ICW;  // word lane (j = 0)
  return s;
}

DEV int col_slot(const IntSlots& s, int j) { return s.col[j & 1] + 64 * (j >> 1); }

DEV int code_slot(const IntSlots& s, int lane, int j) {
  if (32 % ICW == 0) return s.code + j * (32 / ICW) * ICS;  // lane / ICW steps 32 / ICW
  const int wi = j * 32 + lane;
  return (wi / ICW) * ICS + wi % ICW;
}

// A whole tile's code words: word wi of the tile belongs to lane wi / ICW. Moved through
// the warp's buffer cb (stride ICS per lane) so that global accesses are coalesced.
DEV void codes_store(u32* g, u32* cb, const IntSlots& sl, int lane, const u32* cw) {
#pragma unroll
  for (int j = 0; j < ICW; ++j) cb[lane * ICS + j] = cw[j];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < ICW; ++j) g[j * 32 + lane] = cb[code_slot(sl, lane, j)];
  __syncwarp();
}

// The decode's side: raw[j] is word j * 32 + lane of the tile (coalesced loads, made a
// tile ahead by int_fetch), cw the lane's own words.
DEV void codes_load(const u32* raw, u32* cb, const IntSlots& sl, int lane, u32* cw) {
#pragma unroll
  for (int j = 0; j < ICW; ++j) cb[code_slot(sl, lane, j)] = raw[j];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < ICW; ++j) cw[j] = cb[lane * ICS + j];
  __syncwarp();
}

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
          const uint4 q = sb[sl.row ^ c];
          dst[4 * c] = q.x;
          dst[4 * c + 1] = q.y;
          dst[4 * c + 2] = q.z;
          dst[4 * c + 3] = q.w;
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
