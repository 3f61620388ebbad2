// The tah codec's token scores (TAH_OP 1), compiled after tah_kernels.cu (whose comment
// describes the variants, and whose load8 this uses) with tah_tables.cu's tables:
// FORMAT.md's step 1, bit-exact with tah_cpu.token_keys' scores.
#if TAH_OP == 1
#define SC_COPIES 16  // copies of the table: a half-warp's 64-bit loads hit 16 bank pairs

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

// A chunk's terms: the packed (W << 32 | WL) of each element's level (tc: the thread's
// copy of the table, every SC_COPIES-th entry), summed (each half
// of a thread's sum stays below 2^32: at most MAX_ROW / THREADS elements of < 2^17).
// Z: a zero's level must be set to SCORE_LEVELS; without Z the caller knows that
// amax >= 256 << 19, where (amax - 0) >> 19 reaches it anyway.
template <bool Z>
DEV u64 chunk_terms(const u32* a, u32 amax, const u64* tc) {
  u64 acc = 0;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    u32 lev = min((amax - a[r]) >> 19, (u32)SCORE_LEVELS);
    if (Z) lev = a[r] == 0u ? SCORE_LEVELS : lev;
    acc += tc[lev * SC_COPIES];
  }
  return acc;
}

// A thread's terms of its chunks at amax (tc: its copy of the table): those of its cached
// raw words w, then those it reads again (the token's chunks past SC_CACHE THREADS).
template <bool Z>
DEV u64 thread_terms(const char* xb, i64 s0, i64 n, i64 nch, bool vec, const u32 (*w)[SC_WORDS],
                     u32 amax, const u64* tc) {
  u64 acc = 0;
#pragma unroll
  for (int c = 0; c < SC_CACHE; ++c) {
    u32 a[8];
    raw_abs(w[c], a);
    acc += chunk_terms<Z>(a, amax, tc);
  }
  for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
    u32 b[8];
    chunk_abs(xb, s0, n, ch, vec, b);
    acc += chunk_terms<Z>(b, amax, tc);
  }
  return acc;
}

// One block per token (grid-stride): token t's score, a uint32, little-endian at payload
// bytes [4 t, 4 t + 4) (scratch until the encode kernel writes the tiles' centres). A
// thread reads chunks of 8 elements, ch = tid, tid + THREADS, ..., the first SC_CACHE
// kept in registers for the second sweep (the sums).
extern "C" __global__ void __launch_bounds__(THREADS)
tah_kernel(const void* __restrict__ src, unsigned char* __restrict__ pay, i64 count, i64 row,
           i64 ntok, i64 z0, i64 zn) {
  __shared__ u64 tab[(SCORE_LEVELS + 1) * SC_COPIES];
  __shared__ u32 red_m[WARPS];
  __shared__ long long red_s[WARPS], red_l[WARPS];
  const char* xb = (const char*)src;
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5, copy = lane & (SC_COPIES - 1);
  const bool a4 = (((u64)pay) & 3) == 0, vec = (((u64)xb) & 15) == 0;
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, (u32)__shfl_xor_sync(FULL_MASK, m, o));
    if (lane == 0) red_m[wib] = m;
    __syncthreads();
    u32 amax = 0;
#pragma unroll
    for (int w8 = 0; w8 < WARPS; ++w8) amax = max(amax, red_m[w8]);
    const bool live = amax != 0u && amax < 0x7f800000u;
    u64 acc = 0;
    if (live && amax >= ((u32)SCORE_LEVELS << 19))  // the block alike: no zero test
      acc = thread_terms<false>(xb, s0, n, nch, vec, w, amax, tab + copy);
    else if (live)
      acc = thread_terms<true>(xb, s0, n, nch, vec, w, amax, tab + copy);
    long long s = (long long)(acc >> 32), l = (long long)(acc & 0xffffffffull);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s += __shfl_xor_sync(FULL_MASK, s, o);
      l += __shfl_xor_sync(FULL_MASK, l, o);
    }
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
      const long long score = live ? log2_fixed(ss) + floor_div(ll << SCORE_FRAC, ss) : 0;
      st32(pay + 4 * t, (u32)score, a4);
    }
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c)
#pragma unroll
      for (int q = 0; q < SC_WORDS; ++q) w[c][q] = wn[c][q];
    // No barrier here: the next token writes red_m (read before the last barrier) and
    // red_s / red_l only after its first barrier, which thread 0 reaches after its reads.
  }
}
#endif
