// The tah codec's token scores (TAH_OP 1, and 6 where they are split in two launches),
// compiled after tah_kernels.cu (whose comment describes the variants, and whose load8
// this uses) with tah_tables.cu's tables: FORMAT.md's step 1, bit-exact with
// tah_cpu.token_keys' scores.
//
// Kernel 1 takes one token at a time a block: the block's largest |x| bits (one barrier),
// then each warp's sums S and M of its elements' table terms. With SC_SPLIT (tah_gpu's
// default where the payload has room) each warp's lane 0 stores its two sums (int64) in
// scratch at payload byte `sums`, and kernel 6, one thread a token, adds a token's sums and
// writes its score: the score's serial arithmetic (log2_fixed's twenty dependent squarings,
// floor_div's double division) runs once per token in a launch of its own, not on the
// block's path between one token and the next. Without SC_SPLIT (payloads too small for
// the scratch) the block adds its warps' sums (a second barrier) and thread 0 writes the
// score. Either way the score is 0 where S = 0: a token of zeros or with a NaN or an
// infinity (whose terms are never summed); any other token's largest element adds W[0] > 0.
// Kernel 1 also takes ROW (the token length at compile time, as the tile kernels) and
// SC_PAIR (16-bit types: levels from the elements' own bits, two a word; see PAIR_MIN).
#if TAH_OP == 1 || TAH_OP == 6
#ifndef SC_SPLIT
#define SC_SPLIT 0
#endif

DEV long long log2_fixed(long long s) {  // floor(log2(s) * 2^20), s >= 1, integers only
  const int n = 63 - __clzll(s);
  // x in [2^30, 2^31) before each squaring and below 2^32 after its shift: 32 bits, so
  // each square is one 32 x 32 -> 64-bit product on this one thread's serial path.
  u32 x = (u32)(n >= 30 ? s >> (n - 30) : s << (30 - n));
  u32 frac = 0;
#pragma unroll 1
  for (int i = 0; i < SCORE_FRAC; ++i) {
    x = (u32)(((u64)x * x) >> 30);
    frac <<= 1;
    if (x >= (1u << 31)) {
      x >>= 1;
      frac |= 1;
    }
  }
  return ((long long)n << SCORE_FRAC) | frac;
}

// floor(a / b) for a >= 0, b > 0: below 2^53 through a double quotient (a and b exact,
// the rounded quotient within 1 of the floor) and one correction, else the integer
// division. Bitwise the integer division's result either way.
DEV long long floor_div(long long a, long long b) {
  if (a < (1LL << 53)) {
    long long q = (long long)((double)a / (double)b);
    const long long r = a - q * b;
    if (r < 0)
      --q;
    else if (r >= b)
      ++q;
    return q;
  }
  return a / b;
}

// Token score from its sums: 0 for S = 0 (a token that is not live), else
// log2fix(S) + floor(M 2^20 / S).
DEV u32 token_score(long long ss, long long ll) {
  return ss == 0 ? 0u : (u32)(log2_fixed(ss) + floor_div(ll << SCORE_FRAC, ss));
}
#endif

#if TAH_OP == 1
#define SC_COPIES 16  // copies of the table: a half-warp's 64-bit loads hit 16 bank pairs
#define SC_STRIDE_LOG 7  // log2 of SC_COPIES * 8, the bytes between a level's entries
#define SC_CAP ((u32)SCORE_LEVELS << SC_STRIDE_LOG)  // the byte offset of level 256's
#ifndef SC_PAIR
#define SC_PAIR 0
#endif
#if SC_PAIR && XT == 0
#error "SC_PAIR is for 16-bit elements"
#endif

// SC_PAIR: a 16-bit type's levels from its own bits, two elements a 32-bit word. With h
// an element's |x| bits and HA the token's largest, the float32 bits are a linear
// function of h, a = (h << k) + o, wherever this is used: bfloat16 k = 16, o = 0 (every
// value); float16 k = 13, o = 112 << 23 (normal values). Then (A - a) >> 19 =
// (HA - h) >> (19 - k) and min(l, 256) = min(HA - h, 256 << PAIR_SHIFT) >> PAIR_SHIFT.
// HA - h >= 0 in each half of the word, so one 32-bit subtraction takes both (no borrow
// crosses); a 16x2 min caps them. PAIR_MIN: the HA from which every element of the token
// takes this form, zeros included (their level must be 256): bfloat16 HA >= 256 << 3,
// else the kernel's Z variant; float16 HA >= 0x4400 (|x| >= 4), where a zero or a
// subnormal (h < 0x400, whose float32 bits are not linear in h) is more than 256 << 6
// below HA in both forms. A float16 token without zeros or subnormals (every h >= 0x400:
// all of them normal) takes it at any HA. Other tokens take the float32 path.
#if SC_PAIR
#if XT == 2
#define PAIR_SHIFT 3
#define PAIR_MIN 0x0800u
#else
#define PAIR_SHIFT 6
#define PAIR_MIN 0x4400u
#endif
#define PAIR_CAP (((u32)SCORE_LEVELS << PAIR_SHIFT) * 0x10001u)  // the cap, in both halves
#define PAIR_LO (SC_STRIDE_LOG - PAIR_SHIFT)  // low half: d << PAIR_LO is level << 7
#define PAIR_HI (16 - PAIR_LO)                // high half: d >> PAIR_HI is level << 7
#define PAIR_MASK ((2u * SCORE_LEVELS - 1u) << SC_STRIDE_LOG)  // the level's bits, 0..256
#endif

// The |x| bits of a thread's chunk ch (8 elements) of the token at s0 with n elements.
DEV void chunk_abs(const char* xb, i64 s0, i64 n, i64 ch, bool vec, u32* a) {
  const i64 left = n - 8 * ch;
  const int ml = left <= 0 ? 0 : (left < 8 ? (int)left : 8);
  float v[8];
  load8(xb, s0 + 8 * ch, ml, vec, v);
#pragma unroll
  for (int r = 0; r < 8; ++r) a[r] = as_u(v[r]) & 0x7fffffffu;  // zeros past n weigh 0
}

#define SC_WORDS (2 * EB)  // 32-bit words of a chunk of 8 elements

// The raw words of a thread's first SC_CACHE chunks (ch = tid + c THREADS) of the token at
// s0 with n elements, zero past n. Where x is aligned and n a multiple of 8 (every chunk
// whole or past n) they are 16-byte loads that nothing here uses, so all of them are in
// flight at once (and, issued a token ahead, while that token's sums run); else element
// by element.
DEV void load_cached(const char* xb, i64 s0, i64 n, bool vec, u32 (*w)[SC_WORDS]) {
  if (vec && (n & 7) == 0) {
    const uint4* p = (const uint4*)(xb + (s0 + 8 * (i64)threadIdx.x) * EB);
    const bool all = 8 * (i64)SC_CACHE * THREADS <= n;  // known at compile time for ROW
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c) {
      const bool in = all || 8 * ((i64)threadIdx.x + (i64)c * THREADS) < n;
#pragma unroll
      for (int q = 0; q < SC_WORDS / 4; ++q) {
        const uint4 u = in ? ldg4(p + c * THREADS * (SC_WORDS / 4) + q) : make_uint4(0, 0, 0, 0);
        w[c][4 * q] = u.x;
        w[c][4 * q + 1] = u.y;
        w[c][4 * q + 2] = u.z;
        w[c][4 * q + 3] = u.w;
      }
    }
  } else {
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c) {
      const i64 e0 = 8 * ((i64)threadIdx.x + (i64)c * THREADS);
#pragma unroll
      for (int q = 0; q < SC_WORDS; ++q) w[c][q] = 0u;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const u32 h = e0 + r < n ? load_elem_raw(xb, s0 + e0 + r) : 0u;
#if XT == 0
        w[c][r] = h;
#else
        w[c][r >> 1] |= h << (16 * (r & 1));
#endif
      }
    }
  }
}

// Token t's elements: TROW, the short last token's fewer.
DEV i64 token_len(i64 t, i64 count) {
  const i64 s0 = t * TROW;
  return s0 + TROW <= count ? TROW : count - s0;
}

// load_cached of token t: a whole token (every token but a short last one) with its length
// a constant where ROW is defined, so that its chunks' bounds are known at compile time.
DEV void load_token(const char* xb, i64 t, i64 count, bool vec, u32 (*w)[SC_WORDS]) {
  const i64 n = token_len(t, count);
  if (n == TROW)
    load_cached(xb, t * TROW, TROW, vec, w);
  else
    load_cached(xb, t * TROW, n, vec, w);
}

// The |x| bits of a chunk's 8 elements from its raw words.
DEV void raw_abs(const u32* w, u32* a) {
#pragma unroll
  for (int r = 0; r < 8; ++r) a[r] = as_u(elem_f32(w, r)) & 0x7fffffffu;
}

// A chunk's terms: the packed (W << 32 | WL) of each element's level, summed (each half
// of a thread's sum stays below 2^32: at most MAX_ROW / THREADS elements of < 2^17). The
// table tab holds level l's SC_COPIES copies at bytes [l << SC_STRIDE_LOG, ...), this
// thread's at byte offset c8 (its copy times 8), so that min(l, 256)'s entry is at
// min(d >> (19 - SC_STRIDE_LOG), SC_CAP) with the low bits cleared and c8 set, for
// d = amax - a: a shift, a min and one three-input logic op from d, no multiply or add.
// Z: a zero's level must be set to SCORE_LEVELS; without Z the caller knows that
// amax >= 256 << 19, where (amax - 0) >> 19 reaches it anyway.
template <bool Z>
DEV u64 chunk_terms(const u32* a, u32 amax, const unsigned char* tab, u32 c8) {
  constexpr u32 low = (1u << SC_STRIDE_LOG) - 1u;
  u64 acc = 0;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const u32 d = Z && a[r] == 0u ? ~0u : amax - a[r];  // a zero: past the cap too
    const u32 off = min(d >> (19 - SC_STRIDE_LOG), SC_CAP);
    acc += *(const u64*)(tab + ((off & ~low) | c8));
  }
  return acc;
}

// A thread's terms of its chunks at amax (tab, c8: the table, its copy's byte offset):
// those of its cached raw words w, then those it reads again (the token's chunks past
// SC_CACHE THREADS).
template <bool Z>
DEV u64 thread_terms(const char* xb, i64 s0, i64 n, i64 nch, bool vec, const u32 (*w)[SC_WORDS],
                     u32 amax, const unsigned char* tab, u32 c8) {
  u64 acc = 0;
#pragma unroll
  for (int c = 0; c < SC_CACHE; ++c) {
    u32 a[8];
    raw_abs(w[c], a);
    acc += chunk_terms<Z>(a, amax, tab, c8);
  }
  for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
    u32 b[8];
    chunk_abs(xb, s0, n, ch, vec, b);
    acc += chunk_terms<Z>(b, amax, tab, c8);
  }
  return acc;
}

#if SC_PAIR
// The |x| words (both halves' sign bits cleared) of a thread's chunk ch of the token at
// s0 with n elements (one 16-byte load where it is whole and x aligned), zero past n.
DEV void chunk_pairs(const char* xb, i64 s0, i64 n, i64 ch, bool vec, u32* a2) {
  const i64 e0 = s0 + 8 * ch, left = n - 8 * ch;
  if (vec && left >= 8) {
    const uint4 u = ldg4((const uint4*)(xb + e0 * EB));
    a2[0] = u.x;
    a2[1] = u.y;
    a2[2] = u.z;
    a2[3] = u.w;
  } else {
#pragma unroll
    for (int r = 0; r < 8; r += 2) {
      const u32 lo = r < left ? load_elem_raw(xb, e0 + r) : 0u;
      const u32 hi = r + 1 < left ? load_elem_raw(xb, e0 + r + 1) : 0u;
      a2[r >> 1] = lo | (hi << 16);
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) a2[q] &= 0x7fff7fffu;
}

// A chunk's terms from its |x| words at ha2 (HA in both halves, HA >= PAIR_MIN): per word
// one subtraction and one 16x2 min for both elements, then each element's table offset
// (its level << 7, from its half moved into place, and c8) in a shift and one logic op.
DEV u64 pair_terms(const u32* a2, u32 ha2, const unsigned char* tab, u32 c8) {
  u64 acc = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const u32 d = __vminu2(ha2 - a2[q], PAIR_CAP);
    acc += *(const u64*)(tab + (((d << PAIR_LO) & PAIR_MASK) | c8));
    acc += *(const u64*)(tab + (((d >> PAIR_HI) & PAIR_MASK) | c8));
  }
  return acc;
}
#endif

// A thread's terms are at most 2^16 an element (W[0]), of at most SC_ELEMS elements.
#define SC_ELEMS (8 * ((TROW + 8 * THREADS - 1) / (8 * THREADS)))

// The warp's sums of its lanes' packed terms (S << 32 | M, each half below 2^32): redux
// adds 32-bit words modulo 2^32, so where 32 lanes' halves may reach 2^32 (more than 2^11
// elements a thread) each half goes as two 16-bit pieces, whose sums over 32 lanes stay
// below 2^21 (exact): four independent reductions, one instruction each; else two.
DEV void warp_sums(u64 acc, long long& s, long long& l) {
  const u32 hs = (u32)(acc >> 32), hl = (u32)acc;
  if (SC_ELEMS <= (1 << 11)) {
    s = __reduce_add_sync(FULL_MASK, hs);
    l = __reduce_add_sync(FULL_MASK, hl);
    return;
  }
  const u32 s_lo = __reduce_add_sync(FULL_MASK, hs & 0xffffu);
  const u32 s_hi = __reduce_add_sync(FULL_MASK, hs >> 16);
  const u32 l_lo = __reduce_add_sync(FULL_MASK, hl & 0xffffu);
  const u32 l_hi = __reduce_add_sync(FULL_MASK, hl >> 16);
  s = ((long long)s_hi << 16) + s_lo;
  l = ((long long)l_hi << 16) + l_lo;
}

// What a block's tokens share: its arguments, the table, the warps' maxima, its sums.
struct ScoreBlock {
  const char* xb;
  unsigned char* pay;
  i64 count, ntok;
  bool vec;
  const unsigned char* tab;  // the table in shared memory
  u32 c8;                    // this thread's copy of it (byte offset)
  u32 (*red_m)[WARPS];       // the warps' largest |x| bits, by token parity
#if SC_SPLIT
  long long* sums;  // this warp's S of token t at sums[2 t], its M at sums[2 t + 1]
#else
  long long* red_s;  // the warps' sums, for thread 0's score
  long long* red_l;
  bool a4;
#endif
};

// Token t's score (or its warps' sums), its cached chunks' raw words in w, and the next
// token's (t + gridDim.x, if any) loaded into wn meanwhile. par: the token's parity in
// the block's sequence (red_m's half). Returns whether there is a next token.
DEV bool score_token(const ScoreBlock& b, i64 t, int par, u32 (*w)[SC_WORDS],
                     u32 (*wn)[SC_WORDS]) {
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const i64 s0 = t * TROW, n = token_len(t, b.count);
  const i64 nch = (n + 7) >> 3;
  // More chunks than the cache holds: only for rows longer than SC_CACHE THREADS chunks.
  const bool more = TROW > 8 * (i64)SC_CACHE * THREADS;
#if SC_PAIR
  u32 a[SC_CACHE][SC_WORDS];  // the |x| words of the cached chunks
  u32 m2 = 0, n2 = ~0u;         // their largest and (float16) smallest |x| bits
#pragma unroll
  for (int c = 0; c < SC_CACHE; ++c)
#pragma unroll
    for (int q = 0; q < SC_WORDS; ++q) {
      a[c][q] = w[c][q] & 0x7fff7fffu;
      m2 = __vmaxu2(m2, a[c][q]);
      if (XT == 1) n2 = __vminu2(n2, a[c][q]);
    }
  if (more)
    for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
      u32 c4[4];
      chunk_pairs(b.xb, s0, n, ch, b.vec, c4);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        m2 = __vmaxu2(m2, c4[q]);
        if (XT == 1) n2 = __vminu2(n2, c4[q]);
      }
    }
  u32 m = max(m2 & 0xffffu, m2 >> 16);  // the element's own |x| bits
  // float16: whether the thread has a zero or a subnormal (zeros past n count too).
  const bool tiny = XT == 1 && min(n2 & 0xffffu, n2 >> 16) < 0x400u;
#else
  u32 m = 0;
#pragma unroll
  for (int c = 0; c < SC_CACHE; ++c) {
    u32 a8[8];
    raw_abs(w[c], a8);
#pragma unroll
    for (int r = 0; r < 8; ++r) m = max(m, a8[r]);
  }
  if (more)
    for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
      u32 c8[8];
      chunk_abs(b.xb, s0, n, ch, b.vec, c8);
#pragma unroll
      for (int r = 0; r < 8; ++r) m = max(m, c8[r]);
    }
#endif
  // The next token's cached chunks, loaded while this token's reductions and sums run.
  const i64 tn = t + gridDim.x;
  const bool next = tn < b.ntok;
  if (next) load_token(b.xb, tn, b.count, b.vec, wn);
  m = __reduce_max_sync(FULL_MASK, m);
#if SC_PAIR
  // The warp's largest |x| bits (16) and, in the high half, 0xffff if a float16 lane has
  // a zero or a subnormal: a 16x2 max over the warps gives both the block's.
  if (XT == 1 && __any_sync(FULL_MASK, tiny)) m |= 0xffff0000u;
  if (lane == 0) b.red_m[par][wib] = m;
  __syncthreads();
  u32 hb = 0;
#pragma unroll
  for (int w8 = 0; w8 < WARPS; ++w8) hb = __vmaxu2(hb, b.red_m[par][w8]);
  const u32 ha = hb & 0xffffu;
  u32 amax = as_u(raw_to_f32(ha));
  const bool exact = ha >= PAIR_MIN || (XT == 1 && hb < 0x10000u);  // see PAIR_MIN
#else
  if (lane == 0) b.red_m[par][wib] = m;
  __syncthreads();
  u32 amax = 0;
#pragma unroll
  for (int w8 = 0; w8 < WARPS; ++w8) amax = max(amax, b.red_m[par][w8]);
#endif
  const bool live = amax != 0u && amax < 0x7f800000u;
  const i64 nmore = more ? nch : 0;
  u64 acc = 0;
#if SC_PAIR
  if (live && exact) {
    const u32 ha2 = ha * 0x10001u;
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c) acc += pair_terms(a[c], ha2, b.tab, b.c8);
    if (more)
      for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
        u32 c4[4];
        chunk_pairs(b.xb, s0, n, ch, b.vec, c4);
        acc += pair_terms(c4, ha2, b.tab, b.c8);
      }
  } else if (live && amax >= ((u32)SCORE_LEVELS << 19)) {
    acc = thread_terms<false>(b.xb, s0, n, nmore, b.vec, a, amax, b.tab, b.c8);
  } else if (live) {
    acc = thread_terms<true>(b.xb, s0, n, nmore, b.vec, a, amax, b.tab, b.c8);
  }
#else
  if (live && amax >= ((u32)SCORE_LEVELS << 19))  // the block alike: no zero test
    acc = thread_terms<false>(b.xb, s0, n, nmore, b.vec, w, amax, b.tab, b.c8);
  else if (live)
    acc = thread_terms<true>(b.xb, s0, n, nmore, b.vec, w, amax, b.tab, b.c8);
#endif
  long long s, l;
  warp_sums(acc, s, l);
#if SC_SPLIT
  if (lane == 0) {
    b.sums[2 * t] = s;
    b.sums[2 * t + 1] = l;
  }
#else
  if (lane == 0) {
    b.red_s[wib] = s;
    b.red_l[wib] = l;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    long long ss = 0, ll = 0;
    for (int w8 = 0; w8 < WARPS; ++w8) {
      ss += b.red_s[w8];
      ll += b.red_l[w8];
    }
    st32(b.pay + 4 * t, token_score(ss, ll), b.a4);
  }
  // The next token writes red_s / red_l only after its barrier, which thread 0 reaches
  // after its reads.
#endif
  return next;
}

// One block per token (grid-stride; tah_gpu launches one wave of MIN_BLOCKS blocks an SM,
// so that every block takes the same number of tokens, to within one). A thread reads
// chunks of 8 elements, ch = tid, tid + THREADS, ..., the first SC_CACHE kept in registers
// for the second sweep (the sums), those of the block's next token loaded while this
// token's reduction and sums run: two arrays of them, whose roles the loop's two calls
// swap (no copy from one to the other). With SC_SPLIT, warp w's sums of token t are int64
// words 2 (w ntok + t) (S) and the next (M) at payload byte `sums` (8-byte aligned: one
// address a store pair), which kernel 6 reads; else token t's score, a uint32, is written
// little-endian at payload bytes [4 t, 4 t + 4) (scratch until the encode kernel writes
// the tiles' centres). With SC_PAIR the largest |x| is found on the 16-bit bits, two
// elements a word (the order of the bits is the order of the values), and tokens at or
// above PAIR_MIN take pair_terms.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
tah_kernel(const void* __restrict__ src, unsigned char* __restrict__ pay, i64 count, i64 row,
           i64 ntok, i64 z0, i64 zn, i64 sums) {
  __shared__ u64 tab[(SCORE_LEVELS + 1) * SC_COPIES];
  // The warps' largest |x| bits, by token parity: a warp writes token t + 1's after the
  // barrier of token t, which every warp passes only once it has read token t - 1's.
  __shared__ u32 red_m[2][WARPS];
  ScoreBlock b;
  b.xb = (const char*)src;
  b.pay = pay;
  b.count = count;
  b.ntok = ntok;
  b.vec = (((u64)src) & 15) == 0;
  b.tab = (const unsigned char*)tab;
  b.c8 = 8u * (u32)(threadIdx.x & (SC_COPIES - 1));
  b.red_m = red_m;
#if SC_SPLIT
  b.sums = (long long*)(pay + sums) + 2 * (i64)(threadIdx.x >> 5) * ntok;
#else
  __shared__ long long red_s[WARPS], red_l[WARPS];
  b.red_s = red_s;
  b.red_l = red_l;
  b.a4 = (((u64)pay) & 3) == 0;
#endif
  for (int i = threadIdx.x; i < (SCORE_LEVELS + 1) * SC_COPIES; i += THREADS) {
    const int l = i / SC_COPIES;
    tab[i] = ((u64)TAH_SCORE_W[l] << 32) | (u64)TAH_SCORE_WL[l];
  }
  // The multi-block selection's histograms (zn u32 words at payload byte z0, 4-byte
  // aligned; none for the one-block selection), zeroed here: no launch of their own.
  for (i64 i = (i64)blockIdx.x * THREADS + threadIdx.x; i < zn; i += (i64)gridDim.x * THREADS)
    ((u32*)(pay + z0))[i] = 0u;
  __syncthreads();
  if (blockIdx.x >= ntok) return;
  u32 w0[SC_CACHE][SC_WORDS], w1[SC_CACHE][SC_WORDS];  // this token's and the next's
  load_token(b.xb, blockIdx.x, count, b.vec, w0);
#if SC_PAIR
  for (i64 t = blockIdx.x;; t += gridDim.x) {
    if (!score_token(b, t, 0, w0, w1)) break;
    t += gridDim.x;
    if (!score_token(b, t, 1, w1, w0)) break;
  }
#else
  // The float32 path keeps a token's |x| bits past its loads of the next: one call a
  // token, the next token's words copied (the two calls' form spills at MIN_BLOCKS).
  for (i64 t = blockIdx.x, par = 0;; t += gridDim.x, par ^= 1) {
    if (!score_token(b, t, (int)par, w0, w1)) break;
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c)
#pragma unroll
      for (int q = 0; q < SC_WORDS; ++q) w0[c][q] = w1[c][q];
  }
#endif
}
#endif

#if TAH_OP == 6
// The scores from kernel 1's sums (SC_SPLIT): thread t adds token t's `parts` pairs of
// int64 sums at payload byte `sums` (part w's S at word 2 (w ntok + t), its M at the word
// after: a warp's loads are consecutive pairs of words) and writes its score, a
// uint32, little-endian at payload bytes [4 t, 4 t + 4). The sums lie past byte 4 ntok.
extern "C" __global__ void __launch_bounds__(THREADS)
tah_kernel(unsigned char* __restrict__ pay, i64 ntok, i64 sums, i64 parts, i64 unused) {
  const long long* p = (const long long*)(pay + sums);
  const bool a4 = (((u64)pay) & 3) == 0;
  for (i64 t = (i64)blockIdx.x * THREADS + threadIdx.x; t < ntok; t += (i64)gridDim.x * THREADS) {
    long long ss = 0, ll = 0;
    for (i64 w = 0; w < parts; ++w) {
      ss += p[2 * (w * ntok + t)];
      ll += p[2 * (w * ntok + t) + 1];
    }
    st32(pay + 4 * t, token_score(ss, ll), a4);
  }
}
#endif
