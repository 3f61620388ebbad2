// coccl GPU kernels of the `int` codec (2..8-bit symmetric integers), bit-exact with
// FORMAT.md's `## int` section and the numba kernels of intq_cpu.py.
//
// compressors/intq_gpu.py compiles this file, then intq_encode.cu (the encode kernel) and
// intq_decode.cu (the decode kernel), appended to codec_kernels.cu and
// codec_tile_helpers.cu built with OP=0, which defines none of those files' kernels, only
// their helpers: the inline-PTX float32 arithmetic (RNE, no FMA contraction, no flush of
// subnormals), the element loads and stores of type XT, the shared-memory staging of a
// warp's tile, group_umax and the Walsh-Hadamard stages wht_group. Every float operation
// of the int kernels goes through them. This file holds the defines and the helpers both
// kernels share (the key stream, the rotation, the payload's layout, the staging slots).
//
// Defines (besides codec_kernels.cu's OP=0, GS, XT, ACC, THREADS, MIN_BLOCKS):
//   IOP     1 encode, 2 decode
//   BITS    bits per code, 2..8
//   HAD     Hadamard block H (0: none; else a power of two, 8 <= H <= GS)
//   STOCH   encode: 1 stochastic rounding (FORMAT.md's u_i), 0 round to nearest even
//   NPL     elements per lane: 32, or 64 for GS = 2048 (a group lies in GS / NPL lanes)
//   ISTAGE  encode: 1 copies whole tiles into shared memory ahead (cp.async), 0 reads
//           lane by lane one tile ahead in registers (intq_encode.cu's kernel says more)
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
