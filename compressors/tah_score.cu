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
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c) {
      const i64 e0 = 8 * ((i64)threadIdx.x + (i64)c * THREADS);
      const bool in = e0 < n;
#pragma unroll
      for (int q = 0; q < SC_WORDS / 4; ++q) {
        const uint4 u = in ? ldg4((const uint4*)(xb + (s0 + e0) * EB) + q) : make_uint4(0, 0, 0, 0);
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

// The warp's sums of its lanes' packed terms (S << 32 | M, each half below 2^32): redux
// adds 32-bit words modulo 2^32, so each half goes as two 16-bit pieces, whose sums over
// 32 lanes stay below 2^21 (exact). Four independent reductions, one instruction each.
DEV void warp_sums(u64 acc, long long& s, long long& l) {
  const u32 hs = (u32)(acc >> 32), hl = (u32)acc;
  const u32 s_lo = __reduce_add_sync(FULL_MASK, hs & 0xffffu);
  const u32 s_hi = __reduce_add_sync(FULL_MASK, hs >> 16);
  const u32 l_lo = __reduce_add_sync(FULL_MASK, hl & 0xffffu);
  const u32 l_hi = __reduce_add_sync(FULL_MASK, hl >> 16);
  s = ((long long)s_hi << 16) + s_lo;
  l = ((long long)l_hi << 16) + l_lo;
}

// One block per token (grid-stride; tah_gpu launches one wave of MIN_BLOCKS blocks an SM,
// so that every block takes the same number of tokens, to within one). A thread reads
// chunks of 8 elements, ch = tid, tid + THREADS, ..., the first SC_CACHE kept in registers
// for the second sweep (the sums), those of the block's next token loaded while this
// token's reduction and sums run. With SC_SPLIT, warp w's sums of token t are int64 words
// w ntok + t (S) and (WARPS + w) ntok + t (M) at payload byte `sums` (8-byte aligned),
// which kernel 6 reads; else token t's score, a uint32, is written little-endian at
// payload bytes [4 t, 4 t + 4) (scratch until the encode kernel writes the tiles' centres).
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
tah_kernel(const void* __restrict__ src, unsigned char* __restrict__ pay, i64 count, i64 row,
           i64 ntok, i64 z0, i64 zn, i64 sums) {
  __shared__ u64 tab[(SCORE_LEVELS + 1) * SC_COPIES];
  // The warps' largest |x| bits, by token parity: a warp writes token t + 1's after the
  // barrier of token t, which every warp passes only once it has read token t - 1's.
  __shared__ u32 red_m[2][WARPS];
#if !SC_SPLIT
  __shared__ long long red_s[WARPS], red_l[WARPS];
  const bool a4 = (((u64)pay) & 3) == 0;
#endif
  const char* xb = (const char*)src;
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5, copy = lane & (SC_COPIES - 1);
  const bool vec = (((u64)xb) & 15) == 0;
  const unsigned char* tb = (const unsigned char*)tab;
  const u32 c8 = 8u * (u32)copy;
  for (int i = threadIdx.x; i < (SCORE_LEVELS + 1) * SC_COPIES; i += THREADS) {
    const int l = i / SC_COPIES;
    tab[i] = ((u64)TAH_SCORE_W[l] << 32) | (u64)TAH_SCORE_WL[l];
  }
  // The multi-block selection's histograms (zn u32 words at payload byte z0, 4-byte
  // aligned; none for the one-block selection), zeroed here: no launch of their own.
  for (i64 i = (i64)blockIdx.x * THREADS + threadIdx.x; i < zn; i += (i64)gridDim.x * THREADS)
    ((u32*)(pay + z0))[i] = 0u;
  __syncthreads();
  u32 w[SC_CACHE][SC_WORDS];  // the raw words of this token's cached chunks
  if (blockIdx.x < ntok) {
    const i64 s0 = (i64)blockIdx.x * row;
    load_cached(xb, s0, s0 + row < count ? row : count - s0, vec, w);
  }
  int par = 0;
  for (i64 t = blockIdx.x; t < ntok; t += gridDim.x) {
    const i64 s0 = t * row, n = s0 + row < count ? row : count - s0;
    const i64 nch = (n + 7) >> 3;
    u32 m = 0;
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c) {
      u32 a[8];
      raw_abs(w[c], a);
#pragma unroll
      for (int r = 0; r < 8; ++r) m = max(m, a[r]);
    }
    for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
      u32 b[8];
      chunk_abs(xb, s0, n, ch, vec, b);
#pragma unroll
      for (int r = 0; r < 8; ++r) m = max(m, b[r]);
    }
    // The next token's cached chunks, loaded while this token's reductions and sums run.
    u32 wn[SC_CACHE][SC_WORDS];
    const i64 tn = t + gridDim.x;
    if (tn < ntok) {
      const i64 s1 = tn * row;
      load_cached(xb, s1, s1 + row < count ? row : count - s1, vec, wn);
    }
    m = __reduce_max_sync(FULL_MASK, m);
    if (lane == 0) red_m[par][wib] = m;
    __syncthreads();
    u32 amax = 0;
#pragma unroll
    for (int w8 = 0; w8 < WARPS; ++w8) amax = max(amax, red_m[par][w8]);
    par ^= 1;
    const bool live = amax != 0u && amax < 0x7f800000u;
    u64 acc = 0;
    if (live && amax >= ((u32)SCORE_LEVELS << 19))  // the block alike: no zero test
      acc = thread_terms<false>(xb, s0, n, nch, vec, w, amax, tb, c8);
    else if (live)
      acc = thread_terms<true>(xb, s0, n, nch, vec, w, amax, tb, c8);
    long long s, l;
    warp_sums(acc, s, l);
#if SC_SPLIT
    if (lane == 0) {
      long long* p = (long long*)(pay + sums);
      p[(i64)wib * ntok + t] = s;
      p[(i64)(WARPS + wib) * ntok + t] = l;
    }
#else
    if (lane == 0) {
      red_s[wib] = s;
      red_l[wib] = l;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long ss = 0, ll = 0;
      for (int w8 = 0; w8 < WARPS; ++w8) {
        ss += red_s[w8];
        ll += red_l[w8];
      }
      st32(pay + 4 * t, token_score(ss, ll), a4);
    }
    // The next token writes red_s / red_l only after its barrier, which thread 0 reaches
    // after its reads.
#endif
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c)
#pragma unroll
      for (int q = 0; q < SC_WORDS; ++q) w[c][q] = wn[c][q];
  }
}
#endif

#if TAH_OP == 6
// The scores from kernel 1's sums (SC_SPLIT): thread t adds token t's `parts` pairs of
// int64 sums at payload byte `sums` (part w's S at word w ntok + t, its M at word
// (parts + w) ntok + t: a warp's loads are consecutive words) and writes its score, a
// uint32, little-endian at payload bytes [4 t, 4 t + 4). The sums lie past byte 4 ntok.
extern "C" __global__ void __launch_bounds__(THREADS)
tah_kernel(unsigned char* __restrict__ pay, i64 ntok, i64 sums, i64 parts, i64 unused) {
  const long long* p = (const long long*)(pay + sums);
  const bool a4 = (((u64)pay) & 3) == 0;
  for (i64 t = (i64)blockIdx.x * THREADS + threadIdx.x; t < ntok; t += (i64)gridDim.x * THREADS) {
    long long ss = 0, ll = 0;
    for (i64 w = 0; w < parts; ++w) {
      ss += p[w * ntok + t];
      ll += p[(parts + w) * ntok + t];
    }
    st32(pay + 4 * t, token_score(ss, ll), a4);
  }
}
#endif
