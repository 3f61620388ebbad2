// The tah codec's token scores (TAH_OP 1), compiled after tah_kernels.cu (whose comment
// describes the variants, and whose load8 this uses) with tah_tables.cu's tables:
// FORMAT.md's step 1, bit-exact with tah_cpu.token_keys' scores.
#if TAH_OP == 1
#define SC_COPIES 16  // copies of the table: a half-warp's 64-bit loads hit 16 bank pairs

DEV long long log2_fixed(long long s) {  // floor(log2(s) * 2^20), s >= 1, integers only
  const int n = 63 - __clzll(s);
  long long x = n >= 30 ? s >> (n - 30) : s << (30 - n);
  long long frac = 0;
#pragma unroll 1
  for (int i = 0; i < SCORE_FRAC; ++i) {
    x = (x * x) >> 30;
    frac <<= 1;
    if (x >= (1LL << 31)) {
      x >>= 1;
      frac |= 1;
    }
  }
  return ((long long)n << SCORE_FRAC) | frac;
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

// A chunk's terms: the packed (W << 32 | WL) of each element's level, summed (each half
// of a thread's sum stays below 2^32: at most MAX_ROW / THREADS elements of < 2^17).
DEV u64 chunk_terms(const u32* a, u32 amax, const u64* tab, int copy) {
  u64 acc = 0;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    u32 lev = (amax - a[r]) >> 19;
    lev = a[r] == 0u ? SCORE_LEVELS : min(lev, (u32)SCORE_LEVELS);
    acc += tab[lev * SC_COPIES + copy];
  }
  return acc;
}

// One block per token (grid-stride): token t's score, a uint32, little-endian at payload
// bytes [4 t, 4 t + 4) (scratch until the encode kernel writes the tiles' centres). A
// thread reads chunks of 8 elements, ch = tid, tid + THREADS, ..., the first SC_CACHE
// kept in registers for the second sweep (the sums).
extern "C" __global__ void __launch_bounds__(THREADS)
tah_kernel(const void* __restrict__ src, unsigned char* __restrict__ pay, i64 count, i64 row,
           i64 ntok) {
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
  __syncthreads();
  for (i64 t = blockIdx.x; t < ntok; t += gridDim.x) {
    const i64 s0 = t * row, n = s0 + row < count ? row : count - s0;
    const i64 nch = (n + 7) >> 3;
    u32 a[SC_CACHE][8];
    u32 m = 0;
#pragma unroll
    for (int c = 0; c < SC_CACHE; ++c) {
      chunk_abs(xb, s0, n, threadIdx.x + (i64)c * THREADS, vec, a[c]);
#pragma unroll
      for (int r = 0; r < 8; ++r) m = max(m, a[c][r]);
    }
    for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
      u32 b[8];
      chunk_abs(xb, s0, n, ch, vec, b);
#pragma unroll
      for (int r = 0; r < 8; ++r) m = max(m, b[r]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, (u32)__shfl_xor_sync(FULL_MASK, m, o));
    if (lane == 0) red_m[wib] = m;
    __syncthreads();
    u32 amax = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) amax = max(amax, red_m[w]);
    const bool live = amax != 0u && amax < 0x7f800000u;
    u64 acc = 0;
    if (live) {
#pragma unroll
      for (int c = 0; c < SC_CACHE; ++c) acc += chunk_terms(a[c], amax, tab, copy);
      for (i64 ch = threadIdx.x + (i64)SC_CACHE * THREADS; ch < nch; ch += THREADS) {
        u32 b[8];
        chunk_abs(xb, s0, n, ch, vec, b);
        acc += chunk_terms(b, amax, tab, copy);
      }
    }
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
      for (int w = 0; w < WARPS; ++w) {
        ss += red_s[w];
        ll += red_l[w];
      }
      const long long score = live ? log2_fixed(ss) + (ll << SCORE_FRAC) / ss : 0;
      st32(pay + 4 * t, (u32)score, a4);
    }
    // No barrier here: the next token writes red_m (read before the last barrier) and
    // red_s / red_l only after its first barrier, which thread 0 reaches after its reads.
  }
}
#endif
