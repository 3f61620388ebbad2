// coccl GPU codec kernels, part 2 of 5: the helpers on memory and across lanes that the
// kernels share: the warp tile's loads and stores staged through shared memory (cp.async),
// a lane's own element and code loads and stores, the taco payload's scales, the ring
// hops' arguments, group_umax and the Walsh-Hadamard stages (wht_group). Compiled after
// codec_kernels.cu (its defines, arithmetic and conversions) and before
// codec_encode_kernels.cu, as one source: gpu_kernels.CODEC_SOURCES; the int and tah
// kernels are compiled after these two files alone, with OP=0.

// ----------------------------------------------------------------- memory helpers
// cp.async (sm_80+): a 16-byte global -> shared copy that holds no register while in
// flight (ASYNC7 0: none; callers then copy through registers).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ASYNC7 1
// The shared-memory (32-bit) address of a generic pointer into shared memory.
DEV u32 smem_addr(const void* p) {
  u32 d;
  asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}"
      : "=r"(d) : "l"(p));
  return d;
}
// A 16-byte copy to the shared-memory address d (as smem_addr gives).
DEV void cp_async16_to(u32 d, const uint4* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
DEV void cp_async16(uint4* dst, const uint4* src) { cp_async16_to(smem_addr(dst), src); }
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
DEV void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
DEV void cp_async_wait2() { asm volatile("cp.async.wait_group 2;" ::: "memory"); }
#else
#define ASYNC7 0
#endif

DEV int swz(int c) { return c ^ ((c >> 3) & 7); }  // 16-byte chunk -> smem slot

DEV uint4 ldg4(const uint4* p) { return __ldg(p); }

// The four words of q at w[0..3].
DEV void put4(u32* w, const uint4 q) {
  w[0] = q.x;
  w[1] = q.y;
  w[2] = q.z;
  w[3] = q.w;
}

// A warp's tile read coalesced (t: chunk j * 32 + lane of it, CH chunks per lane) handed
// to the lanes that own it: lane l gets chunks [l * CH, l * CH + CH) as words w.
template <int CH>
DEV void staged_transpose(const uint4* t, uint4* sb, int lane, u32* w) {
#pragma unroll
  for (int j = 0; j < CH; ++j) sb[swz(j * 32 + lane)] = t[j];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    put4(w + 4 * j, sb[swz(lane * CH + j)]);
  }
  __syncwarp();
}

// Coalesced read of a warp's tile (CH chunks per lane) into the lanes' own words.
template <int CH>
DEV void staged_load(const uint4* g, uint4* sb, int lane, u32* w) {
  uint4 t[CH];
#pragma unroll
  for (int j = 0; j < CH; ++j) t[j] = ldg4(g + j * 32 + lane);
  staged_transpose<CH>(t, sb, lane, w);
}

// The lanes' own words -> coalesced write of the warp's tile.
template <int CH>
DEV void staged_store(uint4* g, uint4* sb, int lane, const u32* w) {
#pragma unroll
  for (int j = 0; j < CH; ++j)
    sb[swz(lane * CH + j)] = make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < CH; ++j) g[j * 32 + lane] = sb[swz(j * 32 + lane)];
  __syncwarp();
}

// A lane's 32 input elements starting at element `base`, zero past `count`.
DEV void lane_load(const char* xb, i64 base, i64 count, bool vec, u32* w) {
  if (vec && base + 32 <= count) {
    const uint4* p = (const uint4*)(xb + base * EB);
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      put4(w + 4 * j, ldg4(p + j));
    }
  } else {
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = 0;
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      const i64 e = base + r;
      const u32 h = e < count ? load_elem_raw(xb, e) : 0u;
#if XT == 0
      w[r] = h;
#else
      w[r >> 1] |= h << (16 * (r & 1));
#endif
    }
  }
}

// 32 bytes (8 words) at p, all of them or only the first `n` (n < 32).
DEV void store_bytes32(unsigned char* p, const u32* c, bool vec, int n) {
  if (vec && n >= 32) {
    uint4* q = (uint4*)p;
    q[0] = make_uint4(c[0], c[1], c[2], c[3]);
    q[1] = make_uint4(c[4], c[5], c[6], c[7]);
  } else {
#pragma unroll
    for (int r = 0; r < 32; ++r)
      if (r < n) p[r] = (unsigned char)(c[r >> 2] >> (8 * (r & 3)));
  }
}

DEV void load_bytes32(const unsigned char* p, u32* c, bool vec) {
  if (vec) {
    const uint4* q = (const uint4*)p;
    put4(c, ldg4(q));
    put4(c + 4, ldg4(q + 1));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      c[i] = (u32)p[4 * i] | ((u32)p[4 * i + 1] << 8) | ((u32)p[4 * i + 2] << 16) |
             ((u32)p[4 * i + 3] << 24);
  }
}

// The 32 code bytes at p[base, base + 32) as 8 little-endian words: load_bytes32 where all
// 32 are below n, else byte by byte with the bytes at and past n zero.
DEV void load_codes32(const unsigned char* p, i64 base, i64 n, u32* c, bool vec) {
  if (base + 32 <= n) {
    load_bytes32(p + base, c, vec);
    return;
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) c[r] = 0;
#pragma unroll
  for (int r = 0; r < 32; ++r)
    if (base + r < n) c[r >> 2] |= (u32)p[base + r] << (8 * (r & 3));
}

DEV void st32(unsigned char* p, u32 v, bool aligned) {
  if (aligned) {
    *(u32*)p = v;
  } else {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
  }
}

DEV u32 ld32(const unsigned char* p, bool aligned) {
  if (aligned) return __ldg((const u32*)p);
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// A function the compiler keeps out of line: a rare path that would otherwise be inlined
// as instructions predicated off (which every warp still issues).
#if defined(__CUDA_ARCH__)
#define COLD __device__ __noinline__
#else
#define COLD inline
#endif

// The words at unaligned addresses ps (low half) and pa (high half), byte by byte (a
// payload's scales when it is not 4-byte aligned); returned by value, as a call's
// reference arguments would live in local memory.
COLD u64 ld32x2_bytes(const unsigned char* ps, const unsigned char* pa) {
  return (u64)ld32(ps, false) | ((u64)ld32(pa, false) << 32);
}

// Group g's scales in a taco payload of K groups whose codes end at byte ncodes
// (FORMAT.md: every group's s, then every group's alpha, each there only when DUAL / ASH);
// a4: the scales are 4-byte aligned. Loading leaves s and alpha as they are where absent.
DEV void taco_load_scales(const unsigned char* pay, i64 ncodes, i64 K, i64 g, bool a4, float& s,
                          float& alpha) {
  const unsigned char* ps = pay + ncodes + 4 * g;
  const unsigned char* pa = ps + (DUAL ? 4 * K : 0);
  if (a4) {
    if (DUAL) s = as_f(__ldg((const u32*)ps));
    if (ASH) alpha = as_f(__ldg((const u32*)pa));
  } else {
    const u64 w = ld32x2_bytes(ps, pa);
    if (DUAL) s = as_f((u32)w);
    if (ASH) alpha = as_f((u32)(w >> 32));
  }
}

DEV void taco_store_scales(unsigned char* pay, i64 ncodes, i64 K, i64 g, bool a4, u32 sbits,
                           u32 abits) {
  if (DUAL) st32(pay + ncodes + 4 * g, sbits, a4);
  if (ASH) st32(pay + ncodes + (DUAL ? 4 * K : 0) + 4 * g, abits, a4);
}

// ------------------------------------------------------ the ring hops' arguments
// Kernels 8, 9 and 10 take (own, src, dst[, dec], count, K): own's `count` elements, the
// received payload src, the payload dst they write and, with DEC, the decoded output dec.
#if DEC
#define HOP_DEC_PARAM void *dec,
#define HOP_DEC_ARG dec
#else
#define HOP_DEC_PARAM
#define HOP_DEC_ARG nullptr
#endif
#define HOP_PARAMS \
  const void *own, const void *__restrict__ src, void *__restrict__ dst, HOP_DEC_PARAM i64 count, \
      i64 K

// A hop's buffers as bytes, and which allow 16-byte accesses (vout: true without dec).
struct HopIo {
  const char* xb;
  const unsigned char* pin;
  unsigned char* pout;
  char* ob;
  bool vin, vpi, vpo, vout;
};

DEV HopIo hop_io(const void* own, const void* src, void* dst, void* dec) {
  HopIo io;
  io.xb = (const char*)own;
  io.pin = (const unsigned char*)src;
  io.pout = (unsigned char*)dst;
  io.ob = (char*)dec;
  io.vin = (((u64)io.xb) & 15) == 0;
  io.vpi = (((u64)io.pin) & 15) == 0;
  io.vpo = (((u64)io.pout) & 15) == 0;
  io.vout = (((u64)io.ob) & 15) == 0;
  return io;
}

// --------------------------------------------------------- group reductions
template <int L = LPG>  // L lanes per group
DEV u32 group_umax(u32 m) {
#pragma unroll
  for (int t = 1; t < L; t <<= 1) m = max(m, (u32)__shfl_xor_sync(FULL_MASK, m, t));
  return m;
}

// --------------------------------------------------------------- Walsh-Hadamard
// Stages h = 1 .. G/2 in order; pairs (i, i+h) with bit h of i clear: v_i = a + b,
// v_{i+h} = a - b. A lane holds N consecutive elements of a group spread over L lanes:
// stages h < N are inside the lane, the others across lanes.
template <int N = 32, int L = LPG>
DEV void wht_group(float* v, int lig) {
#pragma unroll
  for (int h = 1; h < N; h <<= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = f_add(a, b);
        v[i + h] = f_sub(a, b);
      }
    }
  }
#pragma unroll
  for (int t = 1; t < L; t <<= 1) {
    // The lane whose bit is clear holds a and computes a + b; its partner holds b and
    // computes a - b. fma(+-1, own, partner) rounds (partner +- own) exactly once and
    // its product is exact, so it is bitwise the plain add/sub, not a contraction.
    const float sgn = (lig & t) ? -1.0f : 1.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = f_fma(sgn, v[i], __shfl_xor_sync(FULL_MASK, v[i], t));
  }
}
