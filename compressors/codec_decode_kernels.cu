// coccl GPU codec kernels, part 5 of 5: the decode kernels (taco's transposed whole
// tiles and the 32-elements-a-lane decode, 2 and 4; int8 with any group size, 5 and 6)
// and the 32-elements-a-lane ring hops (taco 8, int8 9). Compiled last, after
// codec_kernels.cu, codec_tile_helpers.cu, codec_encode_kernels.cu and
// codec_epl_kernels.cu, as one source: gpu_kernels.CODEC_SOURCES.

// =============================================================== int8 decode
#if OP == 4 || OP == 6 || OP == 9
// Int8 code q as a float32, exactly: (1.5 * 2^23 + q) - 1.5 * 2^23. A value decodes as
// int8_float(q) * scale (FORMAT.md); the decode kernels (4, 6) and the ring hop (9) all
// use this, so they decode bitwise alike.
DEV float int8_float(int q) { return f_sub(as_f(BITS_MAGIC + (u32)q), as_f(BITS_MAGIC)); }

// Code r (0..31) of a lane's 32 codes packed in cw, sign-extended.
DEV int int8_code(const u32* cw, int r) { return ((int)(cw[r >> 2] << (24 - 8 * (r & 3)))) >> 24; }
#endif

// ======================================== taco decode of a whole tile, transposed (2)
// Kernel 2's path for whole tiles of 16-byte aligned payload and a 16-bit output (not
// accumulated) when a group spans LPG = 4 or 8 lanes (G = 128, 256: a group's store then
// fills whole 32-byte sectors). A lane decodes its 32 consecutive codes and runs the Hadamard stages h < 32 in
// registers, as taco_dequant_lane does; the warp then transposes the values through shared
// memory, so that a lane holds, for 32 / LPG offsets j of its group's 32-element blocks,
// the value at j of every block. The stages h = 32 .. G/2 then pair values within the
// lane: a + b and a - b, bitwise the shuffled fma(+-1, own, partner) of wht_group (each
// rounds the exact sum once), in the same order of stages, so that no shuffle is left.
// A lane's offsets are runs of four, j = 4 lig + 4 LPG r (r < TNR): it stores each run
// straight to global memory as one 8-byte piece, and the LPG lanes of a group write 4 LPG
// consecutive elements at once, whole 32-byte sectors. (Float32 outputs and the
// accumulating decode keep the staged path: their scattered 16-byte stores were slower
// at large counts.)
// Shared memory is padded by one 16-byte slot every eight (chunk c at slot c + c / 8):
// every access of the warp is free of bank conflicts and every address is a per-lane
// base plus a constant.
#if OP == 2 && ASH && STAGE && (LPG == 4 || LPG == 8) && EB == 2 && !ACC
#define TACO_T 1
#define TNR (8 / LPG)   // runs of four offsets a lane holds in each block
#define TSLOTS (9 * 32)  // a warp's buffer: 32 lanes x 8 chunks of 16 bytes, padded
// The warp's whole tiles tile, tile + stride, ... below nfull (payload and output 16-byte
// aligned); returns the first tile it did not decode.
DEV i64 taco_decode_tiles_t(const unsigned char* pay, char* ob, i64 ncodes, i64 K, i64 tile,
                            i64 nfull, i64 stride, int lane, uint4* sb) {
  const int gl = lane / LPG, lig = lane % LPG;  // the lane's group in the tile, index in it
  for (; tile < nfull; tile += stride) {
    const i64 t0 = tile << 10;
    // the element of the lane's first run; run (b, r) starts 32 b + 4 LPG r after it
    const i64 e0 = t0 + (gl * GS + 4 * lig);
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    taco_load_scales(pay, ncodes, K, (t0 >> LOG2_GS) + 32 * lane / GS, true, s, alpha);
    const uint4* cp = (const uint4*)(pay + t0);
    const uint4 c0 = ldg4(cp + lane), c1 = ldg4(cp + 32 + lane);
    // the codes, read coalesced (chunk 32 j + lane), to the lanes that own them (2 lane + j)
    sb[lane + (lane >> 3)] = c0;
    sb[36 + lane + (lane >> 3)] = c1;
    __syncwarp();
    const uint4 d0 = sb[2 * lane + (lane >> 2)], d1 = sb[2 * lane + (lane >> 2) + 1];
    __syncwarp();
    const u32 cw[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
    float v[32];
#pragma unroll
    for (int i = 0; i < 8; ++i) unpack4_fp8(cw[i], v + 4 * i);
    wht_group<32, 1>(v, 0);  // stages h = 1 .. 16
    // transpose: the lane's chunk j (elements 4 j ..) to chunk 8 lane + j; then the lane
    // reads chunk (gl LPG + b) 8 + lig + LPG r, its run (b, r), into u[4 (b TNR + r) ..]
#pragma unroll
    for (int j = 0; j < 8; ++j)
      sb[9 * lane + j] = make_uint4(as_u(v[4 * j]), as_u(v[4 * j + 1]), as_u(v[4 * j + 2]),
                                    as_u(v[4 * j + 3]));
    __syncwarp();
    float u[32];
#pragma unroll
    for (int b = 0; b < LPG; ++b)
#pragma unroll
      for (int r = 0; r < TNR; ++r) {
        const uint4 q = sb[9 * (gl * LPG + b) + lig + LPG * r];
        float* x = u + 4 * (b * TNR + r);
        x[0] = as_f(q.x); x[1] = as_f(q.y); x[2] = as_f(q.z); x[3] = as_f(q.w);
      }
    __syncwarp();
    // stages h = 32 t: block b with block b + t (bit t of b clear)
#pragma unroll
    for (int t = 1; t < LPG; t <<= 1)
#pragma unroll
      for (int b = 0; b < LPG; ++b)
        if ((b & t) == 0) {
#pragma unroll
          for (int i = 0; i < 4 * TNR; ++i) {
            const float a = u[4 * TNR * b + i], c = u[4 * TNR * (b + t) + i];
            u[4 * TNR * b + i] = f_add(a, c);
            u[4 * TNR * (b + t) + i] = f_sub(a, c);
          }
        }
    taco_scale_lane<32>(s, alpha, u);
#pragma unroll
    for (int b = 0; b < LPG; ++b)
#pragma unroll
      for (int r = 0; r < TNR; ++r) {
        const i64 e = e0 + 32 * b + 4 * LPG * r;
        const float* x = u + 4 * (b * TNR + r);
        *(uint2*)(ob + 2 * e) = make_uint2(pack_out2(x[0], x[1]), pack_out2(x[2], x[3]));
      }
  }
  return tile;
}
#else
#define TACO_T 0
#endif

// ======================================================== fast decode kernel (2, 4)
#if OP == 2 || OP == 4
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
#if ACC
#define OCPL 8
#else
#define OCPL CPL
#endif
  const unsigned char* pay = (const unsigned char*)src;
  char* ob = (char*)dst;
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int lig = lane & (LPG - 1);
  (void)lig;
#if TACO_T
  __shared__ uint4 smem[WARPS * TSLOTS];
  uint4* sb = smem + wib * TSLOTS;
#else
  __shared__ uint4 smem[WARPS * 32 * OCPL];
  uint4* sb = smem + wib * 32 * OCPL;
#endif
  const bool vout = (((u64)ob) & 15) == 0;
  const bool vpay = (((u64)pay) & 15) == 0;
#if OP == 2
  const i64 ncodes = K << LOG2_GS;
  const bool a4 = (((u64)pay) & 3) == 0;
#else
  const i64 ncodes = count;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
#endif
  const i64 ntiles = (count + 1023) >> 10;
  const i64 stride = (i64)gridDim.x * WARPS;
  i64 tile = (i64)blockIdx.x * WARPS + wib;
#if TACO_T
  if (vout && vpay)
    tile = taco_decode_tiles_t(pay, ob, ncodes, K, tile, count >> 10, stride, lane, sb);
#endif
  // the rest: every tile where taco_decode_tiles_t is not compiled, else the partial last
  // tile and the tiles of unaligned buffers
  for (; tile < ntiles; tile += stride) {
    const i64 t0 = tile << 10;
    const i64 base = t0 + lane * 32;
    const i64 g = base >> LOG2_GS;
    const bool staged = !TACO_T && STAGE && vout && vpay && (t0 + 1024 <= count);
    // per-group scale(s)
#if OP == 2
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    if (g < K) taco_load_scales(pay, ncodes, K, g, a4, s, alpha);
#else
    float scale = 0.0f;
    if (g < K) scale = as_f(ld32(pay + count + 4 * g, a4));
#endif
    u32 cw[8];
#if ACC
    uint4 acc[8];
#endif
    if (staged) {
      const uint4* cp = (const uint4*)(pay + t0);
      const uint4 c0 = ldg4(cp + lane), c1 = ldg4(cp + 32 + lane);
#if ACC
      const uint4* ap = (const uint4*)(ob + t0 * 4);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = ap[j * 32 + lane];
#endif
      sb[swz(lane)] = c0;
      sb[swz(32 + lane)] = c1;
      __syncwarp();
      const uint4 d0 = sb[swz(2 * lane)], d1 = sb[swz(2 * lane + 1)];
      __syncwarp();
      cw[0] = d0.x; cw[1] = d0.y; cw[2] = d0.z; cw[3] = d0.w;
      cw[4] = d1.x; cw[5] = d1.y; cw[6] = d1.z; cw[7] = d1.w;
    } else {
      load_codes32(pay, base, ncodes, cw, vpay);
    }
    float v[32];
#if OP == 2
    taco_dequant_lane(cw, s, alpha, lig, v);
#else
#pragma unroll
    for (int r = 0; r < 32; ++r) v[r] = f_mul(int8_float(int8_code(cw, r)), scale);
#endif
    // ---- output
    if (staged) {
#if ACC
      uint4* op = (uint4*)(ob + t0 * 4);
#pragma unroll
      for (int j = 0; j < 8; ++j) sb[swz(j * 32 + lane)] = acc[j];
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint4 q = sb[swz(lane * 8 + j)];
        q.x = as_u(f_add(as_f(q.x), v[4 * j]));
        q.y = as_u(f_add(as_f(q.y), v[4 * j + 1]));
        q.z = as_u(f_add(as_f(q.z), v[4 * j + 2]));
        q.w = as_u(f_add(as_f(q.w), v[4 * j + 3]));
        sb[swz(lane * 8 + j)] = q;
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) op[j * 32 + lane] = sb[swz(j * 32 + lane)];
      __syncwarp();
#else
      u32 ow[NW];
      pack_out32(v, ow);
      staged_store<CPL>((uint4*)(ob + t0 * EB), sb, lane, ow);
#endif
    } else if (base < count) {
#if ACC
      float* o = (float*)ob + base;
      if (vout && base + 32 <= count) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint4 q = ((uint4*)o)[j];
          q.x = as_u(f_add(as_f(q.x), v[4 * j]));
          q.y = as_u(f_add(as_f(q.y), v[4 * j + 1]));
          q.z = as_u(f_add(as_f(q.z), v[4 * j + 2]));
          q.w = as_u(f_add(as_f(q.w), v[4 * j + 3]));
          ((uint4*)o)[j] = q;
        }
      } else {
#pragma unroll
        for (int r = 0; r < 32; ++r)
          if (base + r < count) o[r] = f_add(o[r], v[r]);
      }
#else
      store_out32(ob, base, count, vout, v);
#endif
    }
  }
}
#endif

// ============================================ int8 with any group size (5: encode)
#if OP == 5
DEV u32 elem_absraw(u32 h) {
#if XT == 0
  return h & 0x7fffffffu;
#else
  return h & 0x7fffu;
#endif
}

DEV float elem_raw_f32(u32 h) {
#if XT == 0
  return as_f(h);
#elif XT == 2
  return as_f(h << 16);
#else
  return h2f(h);
#endif
}

// One warp per group, lanes striding over its elements.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  const char* xb = (const char*)src;
  unsigned char* pay = (unsigned char*)dst;
  const int lane = threadIdx.x & 31;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
  for (i64 g = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); g < K; g += (i64)gridDim.x * WARPS) {
    const i64 start = g * GS;
    const i64 end = start + GS < count ? start + GS : count;
    u32 mb = 0;
    for (i64 e = start + lane; e < end; e += 32) mb = max(mb, elem_absraw(load_elem_raw(xb, e)));
#pragma unroll
    for (int t = 1; t < 32; t <<= 1) mb = max(mb, (u32)__shfl_xor_sync(FULL_MASK, mb, t));
    const bool bad = mb >= INF_BITS;
    bool tiny;
    const float scale = int8_scale(mb, bad, elem_raw_f32(mb), tiny);
    const float inv = mb != 0 ? f_div(as_f(BITS_ONE), scale) : 0.0f;
    for (i64 e = start + lane; e < end; e += 32) {
      const float x = elem_raw_f32(load_elem_raw(xb, e));
      const int q = int8_clamp(f2i_rn(tiny ? f_div(x, scale) : f_mul(x, inv)));
      pay[e] = bad ? (unsigned char)0 : (unsigned char)(q & 0xff);
    }
    if (lane == 0) st32(pay + count + 4 * g, bad ? BITS_NAN : as_u(scale), a4);
  }
}
#endif

// ============================================ int8 with any group size (6: decode)
#if OP == 6
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
coccl_codec(const void* __restrict__ src, void* __restrict__ dst, i64 count, i64 K) {
  const unsigned char* pay = (const unsigned char*)src;
  const bool a4 = (((u64)pay + (u64)count) & 3) == 0;
  for (i64 e = (i64)blockIdx.x * THREADS + threadIdx.x; e < count; e += (i64)gridDim.x * THREADS) {
    const float scale = as_f(ld32(pay + count + 4 * (e / GS), a4));
    const int q = (int)(signed char)pay[e];
    const float v = f_mul(int8_float(q), scale);
#if ACC
    ((float*)dst)[e] = f_add(((float*)dst)[e], v);
#elif XT == 0
    ((float*)dst)[e] = v;
#else
    ((unsigned short*)dst)[e] = (unsigned short)out_bits1(v);
#endif
  }
}
#endif

// ============================================ taco ring hop: decode, add own, encode (8)
// One hop of a ring ReduceScatter in one pass: pout = encode(float32(own) + decode(pin)),
// own holding `count` elements of type XT, pin and pout taco payloads of `count` elements.
// Bitwise what the three-kernel path gives (acc = own; decode-accumulate pin into acc;
// encode acc): the decode is kernel 2's arithmetic, the addition is its accumulate
// (acc + decoded, one rounding), positions past `count` are zero as an encode of acc reads
// them, and the encode is taco_encode_lane, which every encode kernel shares. With DEC
// the same pass writes dec = decode(pout) (kernel 2's arithmetic on the codes and scales
// in hand), so the last hop of an AllReduce needs no decode kernel after it. Layout of the
// fast kernels (32 elements per lane, tiles of 1024). With STAGE a whole tile whose
// buffers are 16-byte aligned is read and written through shared memory in coalesced
// 16-byte accesses (all of its loads issued before any is used); other tiles per lane.
#if OP == 8
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) coccl_codec(HOP_PARAMS) {
#if STAGE
  __shared__ uint4 smem[WARPS * 32 * CPL];
  uint4* sb = smem + (threadIdx.x >> 5) * 32 * CPL;
#endif
  const int lane = threadIdx.x & 31;
  const int lig = lane & (LPG - 1);
  const HopIo io = hop_io(own, src, dst, HOP_DEC_ARG);
  const char* xb = io.xb;
  const unsigned char* pin = io.pin;
  unsigned char* pout = io.pout;
  const bool vin = io.vin, vpi = io.vpi, vpo = io.vpo;
  const bool a4i = (((u64)pin) & 3) == 0;
  const bool a4o = (((u64)pout) & 3) == 0;
  const i64 ncodes = K << LOG2_GS;  // a multiple of 32: a lane's codes are all in or all out
  const i64 ntiles = (ncodes + 1023) >> 10;
  // Whole warps iterate together (a group's lanes shuffle); a lane past the last group
  // computes on zeros and stores nothing.
  for (i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); tile < ntiles;
       tile += (i64)gridDim.x * WARPS) {
    const i64 t0 = tile << 10;
    const i64 base = t0 + lane * 32;
    const i64 g = base >> LOG2_GS;
    const bool live = base < ncodes;
#if STAGE
    const bool staged = vin && vpi && vpo && io.vout && t0 + 1024 <= count;
#endif
    float s = as_f(BITS_ONE), alpha = as_f(BITS_ONE);
    u32 cw[8], w[NW];
    if (live) taco_load_scales(pin, ncodes, K, g, a4i, s, alpha);
#if STAGE
    if (staged) {
      uint4 tc[2], tx[CPL];
      const uint4* gc = (const uint4*)(pin + t0);
      const uint4* gx = (const uint4*)(xb + t0 * EB);
#pragma unroll
      for (int j = 0; j < 2; ++j) tc[j] = ldg4(gc + j * 32 + lane);
#pragma unroll
      for (int j = 0; j < CPL; ++j) tx[j] = ldg4(gx + j * 32 + lane);
      staged_transpose<2>(tc, sb, lane, cw);
      staged_transpose<CPL>(tx, sb, lane, w);
    } else
#endif
    {
      if (live) {
        load_bytes32(pin + base, cw, vpi);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) cw[i] = 0;
      }
      lane_load(xb, base, count, vin, w);  // zero past count
    }
    float v[32];
    taco_dequant_lane(cw, s, alpha, lig, v);
#pragma unroll
    for (int r = 0; r < 32; ++r) v[r] = base + r < count ? f_add(elem_f32(w, r), v[r]) : 0.0f;
    u32 codes[8], sbits, abits;
    taco_encode_lane<32, LPG>(v, lig, codes, sbits, abits);
#if STAGE
    if (staged)
      staged_store<2>((uint4*)(pout + t0), sb, lane, codes);
    else
#endif
    if (live)
      store_bytes32(pout + base, codes, vpo, 32);
    if (live && lig == 0) taco_store_scales(pout, ncodes, K, g, a4o, sbits, abits);
#if DEC
    taco_dequant_encoded(codes, sbits, abits, lig, v);
#if STAGE
    if (staged) {
      u32 ow[NW];
      pack_out32(v, ow);
      staged_store<CPL>((uint4*)(io.ob + t0 * EB), sb, lane, ow);
    } else
#endif
    if (live)
      store_out32(io.ob, base, count, io.vout, v);
#endif
  }
}
#endif

// ============================================ int8 ring hop: decode, add own, encode (9)
// Kernel 8's int8 twin: pout = int8_encode(float32(own) + int8_decode(pin)), own holding
// `count` elements of type XT, pin and pout int8 payloads of `count` elements (count
// codes, then K float32 scales at byte count). Bitwise the three-kernel path: kernel 4's
// decode and accumulate (acc + q * scale, one rounding each), then kernel 3's quantizer
// on the float32 sum (whose infinity is float32's); positions past `count` are zero, which
// leaves a partial group's absmax as an encode of the `count` elements finds it.
#if OP == 9
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) coccl_codec(HOP_PARAMS) {
  const int lane = threadIdx.x & 31;
  const int lig = lane & (LPG - 1);
  const HopIo io = hop_io(own, src, dst, HOP_DEC_ARG);
  const char* xb = io.xb;
  const unsigned char* pin = io.pin;
  unsigned char* pout = io.pout;
  const bool vin = io.vin, vpi = io.vpi, vpo = io.vpo;
  const bool a4i = (((u64)pin + (u64)count) & 3) == 0;
  const bool a4o = (((u64)pout + (u64)count) & 3) == 0;
  const i64 ntiles = (count + 1023) >> 10;
  // Whole warps iterate together (a group's lanes shuffle); a lane past `count` computes
  // on zeros and stores nothing.
  for (i64 tile = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); tile < ntiles;
       tile += (i64)gridDim.x * WARPS) {
    const i64 base = (tile << 10) + lane * 32;
    const i64 g = base >> LOG2_GS;
    float scale = 0.0f;
    u32 cw[8];
    if (base < count) scale = as_f(ld32(pin + count + 4 * g, a4i));
    load_codes32(pin, base, count, cw, vpi);
    u32 w[NW];
    lane_load(xb, base, count, vin, w);  // zero past count
    float v[32];
    u32 m = 0;
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      const float fq = int8_float(int8_code(cw, r));
      v[r] = base + r < count ? f_add(elem_f32(w, r), f_mul(fq, scale)) : 0.0f;
      m = max(m, as_u(v[r]) & 0x7fffffffu);
    }
    const u32 mb = group_umax(m);
    u32 codes[8], sbits;
    int8_quantize_lane(v, mb, 0x7f800000u, as_f(mb), codes, sbits);
    if (base < count) {
      const i64 left = count - base;
      store_bytes32(pout + base, codes, vpo, left >= 32 ? 32 : (int)left);
      if (lig == 0) st32(pout + count + 4 * g, sbits, a4o);
#if DEC
      // dec = decode(pout): kernel 4's arithmetic on the codes and scale in hand
#pragma unroll
      for (int r = 0; r < 32; ++r) v[r] = f_mul(int8_float(int8_code(codes, r)), as_f(sbits));
      store_out32(io.ob, base, count, io.vout, v);
#endif
    }
  }
}
#endif
