// The tah codec's low-token selection (TAH_OP 4), compiled between tah_tables.cu and
// tah_kernels.cu (whose comment describes the variants): the token scores that kernel 1
// left at the payload's start become the token bitmap, bitwise the CPU's choice
// (tah_cpu.low_prefix: the nlow full tokens with the smallest keys score << 32 | t, so
// ties on the score go to the lower token index).
//
// One block (THREADS threads, launched as a grid of one) finds the nlow-th smallest score
// s* by a radix select over the bits of score - min (the scores' span, max - min, sets
// how many digits of up to 11 bits: one to three, none when all are equal), each digit
// a shared-memory histogram of the candidates (warps add one count per distinct digit,
// __match_any_sync) and a scan of it; then a token is low when its score is below s*, or
// equal to it with fewer than `need` equal scores at lower indices (a scan of the equal
// ones in token order). Token t of a chunk of SEL_CHUNK is thread t % THREADS's value
// number (t / THREADS) % SEL_CACHE, kept in registers (payloads of up to SEL_CHUNK full
// tokens read their scores once, larger ones once per pass).
#if TAH_OP == 4 || TAH_OP == 5
#ifndef SEL_CACHE
#define SEL_CACHE 16
#endif
#define SEL_CHUNK (SEL_CACHE * THREADS)
#define SEL_BINS 2048
#define SEL_SLOTS (SEL_CACHE * WARPS)  // per chunk: one count of equal scores a warp and value

// The exclusive prefix of x over the block's threads in order; total: the sum of all.
// red: WARPS words of shared memory. Has barriers: the whole block calls it.
DEV u32 block_scan(u32 x, u32* red, u32& total) {
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  u32 inc = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const u32 y = __shfl_sync(FULL_MASK, inc, lane >= d ? lane - d : lane);
    if (lane >= d) inc += y;
  }
  if (lane == 31) red[wib] = inc;
  __syncthreads();
  u32 before = 0, all = 0;
  for (int w = 0; w < WARPS; ++w) {
    before += w < wib ? red[w] : 0u;
    all += red[w];
  }
  __syncthreads();
  total = all;
  return before + inc - x;
}

// The thread's SEL_CACHE scores of the chunk at token base (0 at and past n). Aligned:
// predicated word loads, all in flight at once (no branch a score); else byte by byte.
DEV void load_scores(const unsigned char* pay, i64 base, i64 n, bool a4, u32* sc) {
  if (a4) {
#pragma unroll
    for (int j = 0; j < SEL_CACHE; ++j) {
      const i64 t = base + threadIdx.x + (i64)j * THREADS;
      sc[j] = t < n ? __ldg((const u32*)pay + t) : 0u;
    }
  } else {
#pragma unroll
    for (int j = 0; j < SEL_CACHE; ++j) {
      const i64 t = base + threadIdx.x + (i64)j * THREADS;
      sc[j] = t < n ? ld32(pay + 4 * t, false) : 0u;
    }
  }
}

// The block's minimum (or maximum) of x; red: WARPS words of shared memory. Barriers.
DEV u32 block_extreme(u32 x, bool largest, u32* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u32 y = __shfl_xor_sync(FULL_MASK, x, o);
    x = largest ? max(x, y) : min(x, y);
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  for (int w = 0; w < WARPS; ++w) x = largest ? max(x, red[w]) : min(x, red[w]);
  __syncthreads();
  return x;
}

// The smallest and largest score of the full tokens (the whole block gets them).
DEV void score_range(const unsigned char* pay, i64 nfull, bool a4, bool cached, u32* sc,
                     u32* red, u32& lo, u32& hi) {
  lo = 0xffffffffu;
  hi = 0u;
  for (i64 base = 0; base < nfull; base += SEL_CHUNK) {
    if (!cached) load_scores(pay, base, nfull, a4, sc);
#pragma unroll
    for (int j = 0; j < SEL_CACHE; ++j) {
      if (base + threadIdx.x + (i64)j * THREADS < nfull) {
        lo = min(lo, sc[j]);
        hi = max(hi, sc[j]);
      }
    }
  }
  lo = block_extreme(lo, false, red);
  hi = block_extreme(hi, true, red);
}

// One digit of the radix select over score - lo: among the full tokens whose relative
// score agrees with prefix above bit shift + width, the digit (bits [shift, shift +
// width)) holding the k-th smallest (1-based); prefix takes it, k becomes the rank within.
DEV void select_digit(const unsigned char* pay, i64 nfull, bool a4, bool cached, u32* sc, u32 lo,
                      int shift, int width, u32& prefix, u32& k, u32* hist, u32* red, u32* pick) {
  const int lane = threadIdx.x & 31;
  const int top = shift + width;
  for (int i = threadIdx.x; i < SEL_BINS; i += THREADS) hist[i] = 0u;
  __syncthreads();
  for (i64 base = 0; base < nfull; base += SEL_CHUNK) {
    if (!cached) load_scores(pay, base, nfull, a4, sc);
#pragma unroll
    for (int j = 0; j < SEL_CACHE; ++j) {
      const i64 t = base + threadIdx.x + (i64)j * THREADS;
      const u32 rel = sc[j] - lo;
      const bool in = t < nfull && (top >= 32 || (rel >> top) == (prefix >> top));
      const u32 d = in ? (rel >> shift) & ((1u << width) - 1u) : 0xffffffffu;
      const u32 peers = __match_any_sync(FULL_MASK, d);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[d], (u32)__popc(peers));
    }
  }
  __syncthreads();
  constexpr int per = SEL_BINS / THREADS;  // bins a thread scans, in order
  u32 local = 0;
#pragma unroll
  for (int i = 0; i < per; ++i) local += hist[threadIdx.x * per + i];
  u32 total;
  u32 before = block_scan(local, red, total);
  if (before < k && k <= before + local) {  // exactly one thread
    for (int i = 0; i < per; ++i) {
      const u32 h = hist[threadIdx.x * per + i];
      if (k <= before + h) {
        pick[0] = (u32)(threadIdx.x * per + i);
        pick[1] = k - before;
        break;
      }
      before += h;
    }
  }
  __syncthreads();
  prefix |= pick[0] << shift;
  k = pick[1];
  __syncthreads();  // pick and hist are rewritten by the next digit
}

// The multi-block selection (SEL_MULTI, tah_gpu's _SELECT_MULTI): the radix digits of the
// scores themselves, fixed (bits [21, 32), [10, 21), [0, 10): no range pass), each one
// launch of many blocks (TAH_OP 5) adding a shared-memory histogram of its tokens'
// digits into a global one in payload scratch (the step region, which kernel 1 zeroed and
// kernel 2 overwrites); each block of digit d first finds digits 0..d-1 from the
// histograms before it (the same scans in every block, so all agree); then the selection
// kernel (TAH_OP 4, one block) finds all three from the histograms, s* and its rank k, and
// writes the bitmap as before. A histogram is a sum, the same in any order of the blocks'
// atomics, and no block waits for another within a launch.
#define SEL_DIGITS 3
DEV int digit_shift(int d) { return d == 0 ? 21 : d == 1 ? 10 : 0; }
DEV int digit_width(int d) { return d == 2 ? 10 : 11; }

// The bin of global histogram h (SEL_BINS counts) holding the k-th (1-based) candidate;
// k becomes the rank within it. red: WARPS words, pick: 2 words of shared memory. Barriers.
DEV u32 pick_bin(const u32* h, u32& k, u32* red, u32* pick) {
  constexpr int per = SEL_BINS / THREADS;  // bins a thread scans, in order
  u32 mine[per];
  u32 local = 0;
#pragma unroll
  for (int i = 0; i < per; ++i) {
    mine[i] = h[threadIdx.x * per + i];
    local += mine[i];
  }
  u32 total;
  u32 before = block_scan(local, red, total);
  if (before < k && k <= before + local) {  // exactly one thread
    for (int i = 0; i < per; ++i) {
      if (k <= before + mine[i]) {
        pick[0] = (u32)(threadIdx.x * per + i);
        pick[1] = k - before;
        break;
      }
      before += mine[i];
    }
  }
  __syncthreads();
  const u32 d = pick[0];
  k = pick[1];
  __syncthreads();  // pick is rewritten by the next call
  return d;
}

// The score bits above digit d of the nlow-th smallest score (prefix) and its rank among
// the scores sharing them (k), from the global histograms of digits 0..d-1 at hist.
DEV void derive_prefix(const u32* hist, int d, u32& prefix, u32& k, u32* red, u32* pick) {
  prefix = 0;
  for (int j = 0; j < d; ++j)
    prefix |= pick_bin(hist + j * SEL_BINS, k, red, pick) << digit_shift(j);
}

// The bitmap of one chunk: a token is low when its score is below s, or equal to s with
// fewer than `need` equal scores before it (`run` of them in the chunks before).
DEV void select_write(unsigned char* bm, i64 base, i64 nfull, i64 nbytes, const u32* sc, u32 s,
                      u32 need, u32& run, u32* slots, u32* red) {
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < SEL_CACHE; ++j) {
    const i64 t = base + threadIdx.x + (i64)j * THREADS;
    const u32 eqm = __ballot_sync(FULL_MASK, t < nfull && sc[j] == s);
    if (lane == 0) slots[j * WARPS + wib] = (u32)__popc(eqm);
  }
  __syncthreads();
  const u32 mine = threadIdx.x < SEL_SLOTS ? slots[threadIdx.x] : 0u;
  u32 total;
  const u32 before = block_scan(mine, red, total);
  if (threadIdx.x < SEL_SLOTS) slots[threadIdx.x] = run + before;  // equal ones before the slot
  run += total;
  __syncthreads();
  const u32 below = (1u << lane) - 1u;
#pragma unroll
  for (int j = 0; j < SEL_CACHE; ++j) {
    const i64 t = base + threadIdx.x + (i64)j * THREADS;
    const bool full = t < nfull;
    const bool eq = full && sc[j] == s;
    const u32 eqm = __ballot_sync(FULL_MASK, eq);  // again: fewer registers than keeping it
    const u32 rank = slots[j * WARPS + wib] + (u32)__popc(eqm & below);
    const bool low = full && (sc[j] < s || (eq && rank < need));
    const u32 lm = __ballot_sync(FULL_MASK, low);
    const i64 b0 = (t - lane) >> 3;  // the warp's 32 tokens: 4 whole bytes
    if (lane < 4 && b0 + lane < nbytes) bm[b0 + lane] = (unsigned char)(lm >> (8 * lane));
  }
  __syncthreads();  // slots are rewritten by the next chunk
}

#if TAH_OP == 5
// Digit `digit`'s histogram (SEL_MULTI): the full tokens whose scores agree with the
// nlow-th smallest's digits before it, each block a grid-stride share of them, into the
// global histogram at hist (u32 words, 4-byte aligned: tah_gpu takes this path only then).
extern "C" __global__ void __launch_bounds__(THREADS)
tah_kernel(unsigned char* __restrict__ pay, i64 nfull, i64 nlow, i64 hist0, i64 digit) {
  __shared__ u32 sh[SEL_BINS];
  __shared__ u32 red[WARPS];
  __shared__ u32 pick[2];
  u32* hist = (u32*)(pay + hist0);
  const int d = (int)digit;
  u32 prefix, k = (u32)nlow;
  derive_prefix(hist, d, prefix, k, red, pick);
  for (int i = threadIdx.x; i < SEL_BINS; i += THREADS) sh[i] = 0u;
  __syncthreads();
  const int shift = digit_shift(d), top = shift + digit_width(d);
  const u32 mask = (1u << digit_width(d)) - 1u;
  const u32* sc = (const u32*)pay;
  for (i64 t = (i64)blockIdx.x * THREADS + threadIdx.x; t < nfull; t += (i64)gridDim.x * THREADS) {
    const u32 s = sc[t];
    if (top >= 32 || (s >> top) == (prefix >> top)) atomicAdd(&sh[(s >> shift) & mask], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < SEL_BINS; i += THREADS)
    if (sh[i] != 0u) atomicAdd(&hist[d * SEL_BINS + i], sh[i]);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS, 1)
tah_kernel(unsigned char* __restrict__ pay, i64 ntok, i64 nfull, i64 nlow, i64 bm0,
           i64 hist0) {
  static_assert(SEL_SLOTS <= THREADS && SEL_BINS % THREADS == 0, "selection sizes");
  __shared__ u32 hist[SEL_BINS];
  __shared__ u32 slots[SEL_SLOTS];
  __shared__ u32 red[WARPS];
  __shared__ u32 pick[2];
  if (blockIdx.x != 0) return;
  const bool a4 = (((u64)pay) & 3) == 0;
  const bool cached = nfull <= SEL_CHUNK;
  u32 sc[SEL_CACHE];
  load_scores(pay, 0, nfull, a4, sc);
  u32 s = 0u, k = (u32)nlow;  // nlow = 0: no score is below 0 and none is taken at it
  if (nlow > 0 && hist0 > 0) {  // SEL_MULTI: the three digits from their histograms
    derive_prefix((const u32*)(pay + hist0), SEL_DIGITS, s, k, red, pick);
  } else if (nlow > 0) {
    u32 lo, hi;
    score_range(pay, nfull, a4, cached, sc, red, lo, hi);
    const int nb = hi == lo ? 0 : 32 - __clz(hi - lo);  // bits of the relative scores
    for (int top = nb; top > 0;) {  // the same in the whole block
      const int width = top < 11 ? top : 11;
      select_digit(pay, nfull, a4, cached, sc, lo, top - width, width, s, k, hist, red, pick);
      top -= width;
    }
    s += lo;
  }
  const i64 nbytes = (ntok + 7) >> 3;
  u32 run = 0;
  for (i64 base = 0; base < ntok; base += SEL_CHUNK) {
    if (!cached || base > 0) load_scores(pay, base, nfull, a4, sc);
    select_write(pay + bm0, base, nfull, nbytes, sc, s, k, run, slots, red);
  }
}
#endif
#endif  // TAH_OP 5

// ================================================================ window selection (7)
#if TAH_OP == 7
// The tokens a block takes at once for windows of `win`: lcm(win, 8), whole windows that
// begin and end at bitmap bytes, so that the block owns its bytes (a span).
DEV i64 window_span(i64 win) { return win * 8 / min(win & -win, (i64)8); }

// A window's low tokens among its n scores sc: a token is low when fewer than `need`
// tokens of the window have a smaller key score << 32 | t (ties to the lower index). Its
// bit is set in the span's bits sbm, the window's first token at bit bit0.
DEV void rank_window(const u32* sc, i64 n, i64 need, i64 bit0, u32* sbm) {
  for (i64 i = threadIdx.x; i < n; i += THREADS) {
    const u32 s = sc[i];
    i64 rank = 0;
    for (i64 j = 0; j < n && rank < need; ++j) rank += sc[j] < s || (sc[j] == s && j < i);
    const i64 bit = bit0 + i;
    if (rank < need) atomicOr(&sbm[bit >> 5], 1u << (bit & 31));
  }
}

// The span [s0, s1)'s bitmap bytes from its bits sbm (LSB first; bits of tokens that are
// not low, the short last token's and those past NT, are 0).
DEV void write_span(unsigned char* bm, const u32* sbm, i64 s0, i64 s1) {
  for (i64 j = threadIdx.x; j < ((s1 - s0 + 7) >> 3); j += THREADS)
    bm[(s0 >> 3) + j] = ((const unsigned char*)sbm)[j];
}

#ifndef WMAX
#define WMAX 1024  // the largest window (tah_format.MAX_WINDOW)
#endif
// The low tokens chosen within windows of `win` consecutive full tokens (the codec's
// window option; tah_cpu.low_prefix): window [w0, w1) has `nlow` low tokens when whole
// (w1 - w0 = win), `nrest` when it is the shorter last one (rank_window's rule). A block
// takes a span (window_span), window by window: the window's scores (left by kernel 1 at
// payload bytes [4 t, 4 t + 4)) into shared memory, ranked into the span's bits, then
// the span's bytes.
extern "C" __global__ void __launch_bounds__(THREADS)
tah_kernel(unsigned char* __restrict__ pay, i64 ntok, i64 nfull, i64 win, i64 bm0, i64 lows) {
  __shared__ u32 wsc[WMAX];      // the window's scores
  __shared__ u32 sbm[WMAX / 4];  // the span's bits, token s0 + i at bit i
  const bool a4 = (((u64)pay) & 3) == 0;
  const i64 nlow = lows & 0xffffffff, nrest = lows >> 32;  // packed: one argument fewer
  const i64 span = window_span(win);
  for (i64 s0 = (i64)blockIdx.x * span; s0 < ntok; s0 += (i64)gridDim.x * span) {
    const i64 s1 = min(s0 + span, ntok);
    for (int i = threadIdx.x; i < WMAX / 4; i += THREADS) sbm[i] = 0u;
    __syncthreads();
    for (i64 t0 = s0; t0 < s1; t0 += win) {
      const i64 f1 = min(min(t0 + win, s1), nfull), n = f1 - t0;  // full tokens [t0, f1)
      const i64 need = n == win ? nlow : (n > 0 ? nrest : 0);
      if (need == 0) continue;  // the block alike
      for (i64 i = threadIdx.x; i < n; i += THREADS) wsc[i] = ld32(pay + 4 * (t0 + i), a4);
      __syncthreads();
      rank_window(wsc, n, need, t0 - s0, sbm);
      __syncthreads();  // the bits; wsc free for the next window
    }
    write_span(pay + bm0, sbm, s0, s1);
    __syncthreads();  // read before the next span zeroes them
  }
}
#endif  // TAH_OP 7
