// The tah codec's window encode (TAH_OP 8): with the codec's window option, the whole
// encode in one kernel that reads each token once from memory where a window is small.
// Compiled after tah_score.cu (whose score_token gives a token's sums), tah_encode.cu
// (whose encode_group encodes a tile group) and the files before them, as one text.
//
// The low tokens of a window depend only on its own tokens' scores, so one block takes a
// window whole: the scores of its full tokens (each as kernel 1 takes one: the block's
// largest |x|, then each warp's sums, here kept in shared memory), their ranks within the
// window (tah_select.cu's rank_window, as the selection within windows), then the
// window's tiles (as kernel 2's), which read the tokens again: from L2, where the window
// was read a moment before. The low tokens before the window's first token t0 are
// (t0 / win) nlow (every window before it is whole), so the tiles' places need nothing
// from other blocks. The bitmap's bytes hold 8 tokens and a window need not begin at one,
// so a block takes a span of whole windows that begins and ends at bytes (window_span:
// lcm(win, 8) tokens), keeps the span's bits in shared memory (the places of its tiles
// count them there) and writes the span's bytes at its end. The last span holds the short
// last token (never low; its tiles are the last window's) and the bitmap's unused bits
// (0).
//
// Defines: those of kernel 1 (XT, ROW, SC_PAIR; SC_SPLIT is 1) and of kernel 2 (TILE,
// BH, BL, EPL, PIVOT, RATIO_BITS); WMAX, the largest window it takes (a multiple of 4);
// WIN_PREFETCH (below).
#if TAH_OP == 8
#if !SC_SPLIT
#error "the window encode keeps its warps' sums (SC_SPLIT 1)"
#endif
#ifndef WMAX
#define WMAX 1024
#endif
#ifndef ROW
#error "the window encode needs ROW"
#endif
#define SC_BATCH 32            // tokens whose warps' sums the block holds before their scores
#define SPAN_WORDS (WMAX / 4)  // a span of lcm(win, 8) <= 8 WMAX tokens' bits
// The two phases of a window are functions of their own (codec_tile_helpers.cu's COLD:
// not inlined on the device): each then has the registers of the kernel it comes from
// (kernel 1's, kernel 2's), and only the few values of the loops over spans and windows
// are kept across a call (inlined, the kernel spilled ~1 KB at the same bound).
#define PHASE COLD
#ifndef WIN_PREFETCH
#define WIN_PREFETCH 0
#endif

// WIN_PREFETCH: the block asks L2 for the next window's tokens (the next in its span, or
// its next span's first) before this window's tiles, so that their reads from memory run
// under the tiles' work instead of after it (up to two windows a block in L2).
DEV void prefetch_window(const char* xb, i64 t0, i64 t1) {
#if WIN_PREFETCH
  const i64 first = t0 * TROW * EB, bytes = (t1 - t0) * TROW * EB;
  for (i64 i = 128 * (i64)threadIdx.x; i < bytes; i += 128 * THREADS) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(xb + first + i));
#endif
  }
#endif
}

// The scores of full tokens [t0, f1) into wsc[0, f1 - t0) (tab: the table in shared
// memory; red_m and sums: shared memory for score_token's maxima and the warps' sums).
// Has barriers: the whole block calls it.
PHASE void window_scores(const void* src, i64 count, i64 t0, i64 f1, const u64* tab,
                         u32 (*red_m)[WARPS], long long* sums, u32* wsc) {
  ScoreBlock b = score_block(src, nullptr, count, f1, tab, red_m);  // no payload: scores
  b.sums = sums + 2 * SC_BATCH * (threadIdx.x >> 5);
  for (i64 tb = t0; tb < f1; tb += SC_BATCH) {
    b.tb = tb;
    b.tend = min(tb + SC_BATCH, f1);
    u32 w0[SC_CACHE][SC_WORDS], w1[SC_CACHE][SC_WORDS];
    load_token(b.xb, tb, count, b.vec, w0);
    score_run(b, tb, 1, w0, w1);
    __syncthreads();  // the batch's sums
    if (threadIdx.x < b.tend - tb) {
      long long ss = 0, ll = 0;
      for (int w = 0; w < WARPS; ++w) {
        ss += sums[2 * SC_BATCH * w + 2 * threadIdx.x];
        ll += sums[2 * SC_BATCH * w + 2 * threadIdx.x + 1];
      }
      wsc[tb - t0 + threadIdx.x] = token_score(ss, ll);
    }
    __syncthreads();  // the scores; the sums free for the next batch
  }
}

// The tiles of tokens [t0, t1) (up to tile K for the last window), their places from the
// span's bits (sbm: the bitmap's bytes from byte s0 / 8 on, s0 the span's first token, pre
// the low tokens before it). The warps take consecutive tile groups.
PHASE void window_tiles(const void* src, unsigned char* pay, i64 count, i64 K, i64 piv0,
                        i64 t0, i64 t1, const unsigned char* sbm, i64 s0, i64 pre) {
  const int lane = threadIdx.x & 31, li = lane & (LT - 1);
  const bool vec = (((u64)src) & 15) == 0, a4 = (((u64)pay) & 3) == 0;
  const i64 tpr = TROW / TILE;  // tiles a token
  const i64 kw0 = t0 * tpr, kw1 = min(t1 * tpr, K);
  const i64 ngroups = (kw1 - kw0 + TPW - 1) / TPW;
  LowRun run;
  run.byte0 = run.org = s0 >> 3;
  run.pre = pre;
  for (i64 gs = 0; gs < ngroups; gs += WARPS) {
    low_advance(sbm, (kw0 + gs * TPW) / tpr, run);  // the same in every thread
    const i64 g = gs + (threadIdx.x >> 5);
    if (g >= ngroups) break;  // the whole warp
    const i64 k0 = kw0 + g * TPW;
    const bool whole = vec && k0 + TPW <= kw1 && (k0 + TPW) * TILE <= count;
    encode_group((const char*)src, pay, k0, kw1, whole, count, K, piv0, sbm, run, TROW, a4,
                 lane, li);
  }
}


extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
tah_kernel(const void* __restrict__ src, unsigned char* __restrict__ pay, i64 count, i64 K,
           i64 piv0, i64 bm0, i64 win, i64 lows) {
  __shared__ u64 tab[(SCORE_LEVELS + 1) * SC_COPIES];
  __shared__ u32 red_m[2][WARPS];
  __shared__ long long sums[WARPS * 2 * SC_BATCH];  // warp w's S, M of batch token i
  __shared__ u32 wsc[WMAX];                         // the window's scores
  __shared__ u32 sbm[SPAN_WORDS];                   // the span's bits, token s0 + i at bit i
  const i64 ntok = (count + TROW - 1) / TROW, nfull = count / TROW;
  const i64 nlow = lows & 0xffffffff, nrest = lows >> 32;  // a whole window's, the last's
  const i64 span = window_span(win);
  for (int i = threadIdx.x; i < (SCORE_LEVELS + 1) * SC_COPIES; i += THREADS) {
    const int l = i / SC_COPIES;
    tab[i] = ((u64)TAH_SCORE_W[l] << 32) | (u64)TAH_SCORE_WL[l];
  }
  for (i64 s0 = (i64)blockIdx.x * span; s0 < ntok; s0 += (i64)gridDim.x * span) {
    const i64 s1 = min(s0 + span, ntok);
    for (int i = threadIdx.x; i < SPAN_WORDS; i += THREADS) sbm[i] = 0u;
    __syncthreads();  // the table (first span), the bits zeroed
    for (i64 t0 = s0; t0 < s1; t0 += win) {
      const i64 t1 = min(t0 + win, s1), f1 = min(t1, nfull);  // full tokens [t0, f1)
      const i64 need = f1 - t0 == win ? nlow : (f1 > t0 ? nrest : 0);
      if (need > 0) {  // the block alike
        window_scores(src, count, t0, f1, tab, red_m, sums, wsc);
        rank_window(wsc, f1 - t0, need, t0 - s0, sbm);
        __syncthreads();  // the window's bits
      }
      const i64 n0 = t1 < s1 ? t1 : s0 + (i64)gridDim.x * span;  // the block's next window
      prefetch_window((const char*)src, n0, min(n0 + win, nfull));
      window_tiles(src, pay, count, K, piv0, t0, t1, (const unsigned char*)sbm, s0,
                   s0 / win * nlow);
      __syncthreads();  // the next window's bits are set after these tiles read theirs
    }
    write_span(pay + bm0, sbm, s0, s1);
    __syncthreads();  // read before the next span zeroes them
  }
}
#endif  // TAH_OP 8
