// coccl GPU codec kernels, part 4 of 5: taco's kernels with EPL elements per lane, the
// encode (7) and the ring hop (10), and their shared-memory tile helpers (slots, cp.async
// fetches, coalesced stores). Compiled after codec_encode_kernels.cu (whose per-group
// taco encode and decode functions they run) and before codec_decode_kernels.cu, as one
// source: gpu_kernels.CODEC_SOURCES.

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
