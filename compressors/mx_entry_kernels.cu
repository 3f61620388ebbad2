// coccl GPU kernels of the microscaled codecs, part 4 of 4: the per-payload scale S of
// an E4M3 mx encode (OP 6), taco_fp's transform, energy and chunk bodies (OP 4, 5), and
// the entry point coccl_mx of every OP. Compiled last, after mx_kernels.cu,
// mx_encode_kernels.cu and mx_decode_kernels.cu, as one source: mx_gpu.MX_SOURCES.

#if OP == 6
DEV float tensor_scale(u32 amax_bits) {  // S = max(amax / (448 * qmax), 2^-126)
  const float s = f_div(as_f(amax_bits), f_mul(as_f(BITS_448), as_f(QMAX_BITS)));
  return as_u(s) < BITS_MIN_NORMAL ? as_f(BITS_MIN_NORMAL) : s;
}
#endif

// ================================================================= taco_fp
#if OP == 4 || OP == 5
#define SCALE_OFF(K) ((K) * BPB)
#define ALPHA_OFF(K) ((K) * BPB + 4 * (K))

// The unnormalised Walsh-Hadamard transform of the group (FORMAT.md, taco step 2), stages
// h = 1 .. G/2 in order: within the lane's run for h < 32, then between the lanes of runs
// r and r ^ (h / 32) (the lower one keeps a + b, the upper a - b).
DEV void wht(float* v, int r) {
  for (int h = 1; h < EPL; h <<= 1)
    for (int i = 0; i < EPL; ++i)
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = f_add(a, b);
        v[i + h] = f_sub(a, b);
      }
  for (int m = 1; m < LPB; m <<= 1) {
    const bool lower = (r & m) == 0;
    for (int i = 0; i < EPL; ++i) {
      const float o = __shfl_xor_sync(FULL, v[i], m);
      v[i] = lower ? f_add(v[i], o) : f_sub(o, v[i]);
    }
  }
}
#endif

#if OP == 4
// The group's energy: the lane's run of 32 summed in order, then the pairwise tree over the
// runs (an xor butterfly: a + b is b + a, so every lane of the group ends with the root).
DEV float energy(const float* v) {
  float e = 0.0f;
  for (int j = 0; j < EPL; ++j) e = f_add(e, f_mul(v[j], v[j]));
  for (int m = 1; m < LPB; m <<= 1) e = f_add(e, __shfl_xor_sync(FULL, e, m));
  return e;
}

DEV void chunk_body(u8* pay, i64 K, i64 j, const u32* xb, bool live) {
  float v[EPL];
  u32 c[EPL], w[WPL];
  const int r = (int)(j % LPB);
  // Every lane runs every step (the shuffles); a bad or dead group's results are dropped.
  const bool bad = group_max(lane_amax(xb)) >= BITS_INF;
  const float qmax = as_f(QMAX_BITS), cinv = as_f(CINV_BITS);
  for (int i = 0; i < EPL; ++i) v[i] = as_f(xb[i]);
  const float m = f_div(energy(v), (float)BS);
  const u32 ab = as_u(f_div(qmax, f_sqrt(f_add(m, as_f(BITS_LAMBDA)))));  // >= 0
  float alpha = as_f(ab < BITS_1EM3 ? BITS_1EM3 : (ab > BITS_1E3 ? BITS_1E3 : ab));
  for (int i = 0; i < EPL; ++i) v[i] = f_mul(v[i], alpha);
  wht(v, r);
  u32 amax = 0;
  for (int i = 0; i < EPL; ++i) amax = umax(amax, as_u(v[i]) & 0x7fffffffu);
  amax = group_max(amax);
  int p = 127 - (int)(amax >> 23);  // step 4: a power of two toward [1, 2)
  p = p < -116 ? -116 : (p > 116 ? 116 : p);
  const float two = as_f((u32)(127 + p) << 23);
  alpha = f_mul(alpha, two);
  const float s = f_div(f_mul(f_mul(as_f(amax), two), cinv), qmax);
  const float kq = amax != 0 ? f_div(cinv, s) : 0.0f;
  for (int i = 0; i < EPL; ++i) c[i] = bad ? 0u : elem_code(as_u(f_mul(f_mul(v[i], two), kq)));
  if (!live) return;
  pack_words(c, w);
  const unsigned al = alignment(pay);
  store_words(pay + j * (4 * WPL), w, al);
  if (r == 0) {  // FORMAT.md step 6: NaN scales for a bad group
    const i64 k = j / LPB;
    const u32 sbits = bad ? BITS_NAN : as_u(s), abits = bad ? BITS_NAN : as_u(alpha);
    u8* ps = pay + SCALE_OFF(K) + 4 * k;
    u8* pa = pay + ALPHA_OFF(K) + 4 * k;
    if (al >= 4) {
      *(u32*)ps = sbits, *(u32*)pa = abits;
    } else {
      st32(ps, sbits), st32(pa, abits);
    }
  }
}
#endif

#if OP == 5
DEV void chunk_body(const u8* pay, void* out, i64 count, i64 K, i64 j, bool live, bool vec) {
  u32 w[WPL] = {0};
  float v[EPL];
  const unsigned al = alignment(pay);
  const i64 k = live ? j / LPB : 0;
  if (live) load_words(pay + j * (4 * WPL), w, al);
  for (int i = 0; i < EPL; ++i) v[i] = elem_value(code_at(w, i));
  wht(v, (int)(j % LPB));
  if (!live) return;
  const u8* ps = pay + SCALE_OFF(K) + 4 * k;
  const u8* pa = pay + ALPHA_OFF(K) + 4 * k;
  const u32 sbits = al >= 4 ? __ldg((const u32*)ps) : ld32(ps);
  const u32 abits = al >= 4 ? __ldg((const u32*)pa) : ld32(pa);
  const float sc = f_mul(as_f(sbits), as_f(CINV_BITS));
  const float ia = f_div(as_f(BITS_ONE), as_f(abits));
  for (int i = 0; i < EPL; ++i) v[i] = sat_inf(f_mul(f_mul(v[i], sc), ia));
  store_chunk(out, j * EPL, count, vec, v);
}
#endif

// ================================================================== entry
// Grid-stride over the chunks j < K * LPB: warp w of the grid takes chunks
// [32 UNR w, 32 UNR (w + 1)) + 32 UNR (number of warps) * step, lane l chunks l + 32 u.
#ifdef MX_HOST
#define RESTRICT
#else
#define RESTRICT __restrict__
#endif

#if OP == 6
extern "C" __global__ void __launch_bounds__(THREADS)
coccl_mx(const void* src, void* dst, i64 count, i64 K) {
  __shared__ u32 red[THREADS / 32];
  (void)src;
  u8* pay = (u8*)dst;  // reads partials, writes S: disjoint bytes of the payload
  u32 m = 0;
  for (i64 j = threadIdx.x; j < count; j += THREADS) m = umax(m, ld32(pay + 4 * j));
  m = block_max(m, red);
  if (threadIdx.x == 0) st32(pay + TENSOR_OFF(K), as_u(tensor_scale(m)));
}
#elif OP == 3
extern "C" __global__ void __launch_bounds__(THREADS)
coccl_mx(const void* RESTRICT src, void* RESTRICT dst, i64 count, i64 K) {
  __shared__ u32 red[THREADS / 32];
  const i64 n = K * LPB, step = (i64)gridDim.x * THREADS * UNR;
  const int lane = (int)(threadIdx.x & 31);
  const bool vec = aligned(src, 16);
  u32 m = 0;
  for (i64 j0 = ((i64)blockIdx.x * THREADS + threadIdx.x - lane) * UNR; j0 < n; j0 += step) {
    u32 xb[UNR][EPL];
    for (int u = 0; u < UNR; ++u) load_chunk(src, (j0 + 32 * u + lane) * EPL, count, vec, xb[u]);
    for (int u = 0; u < UNR; ++u) {
      const u32 a = group_max(lane_amax(xb[u]));  // the finite blocks only
      if (a < BITS_INF) m = umax(m, a);
    }
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) st32((u8*)dst + 4 * blockIdx.x, m);  // partial b, in the code area
}
#elif OP == 1 || OP == 4
extern "C" __global__ void ENC_BOUNDS
coccl_mx(const void* RESTRICT src, void* RESTRICT dst, i64 count, i64 K) {
  u8* pay = (u8*)dst;
  const i64 n = K * LPB, step = (i64)gridDim.x * THREADS * UNR;
  const int lane = (int)(threadIdx.x & 31);
  const bool vec = aligned(src, 16);
#if OP == 1 && SC
  const E4m3Payload s = e4m3_payload(as_f(ld32(pay + TENSOR_OFF(K))));  // S: OP 6 wrote it
#else
  const float s = 0.0f;
#endif
  for (i64 j0 = ((i64)blockIdx.x * THREADS + threadIdx.x - lane) * UNR; j0 < n; j0 += step) {
#if PAIRS || E4M3_WORDS
    u32 xb[UNR][EPL / 2];
    for (int u = 0; u < UNR; ++u) load_pairs(src, (j0 + 32 * u + lane) * EPL, count, vec, xb[u]);
#else
    u32 xb[UNR][EPL];
    for (int u = 0; u < UNR; ++u) load_chunk(src, (j0 + 32 * u + lane) * EPL, count, vec, xb[u]);
#endif
#pragma unroll  // xb[u] in registers, not local memory (the E4M3 body is long)
    for (int u = 0; u < UNR; ++u) {
      const i64 j = j0 + 32 * u + lane;
#if OP == 1
      chunk_body(pay, K, j, xb[u], s, j < n);  // whole blocks live or dead alike
#else
      (void)s;
      chunk_body(pay, K, j, xb[u], j < n);
#endif
    }
  }
}
#else
extern "C" __global__ void DEC_BOUNDS
coccl_mx(const void* RESTRICT src, void* RESTRICT dst, i64 count, i64 K) {
  const u8* pay = (const u8*)src;
  const i64 n = K * LPB, step = (i64)gridDim.x * THREADS * UNR;
  const int lane = (int)(threadIdx.x & 31);
  const bool vec = aligned(dst, 16);
#if OP == 2
  const float s = SC ? as_f(ld32(pay + TENSOR_OFF(K))) : 0.0f;
#if STAGED
  __shared__ uint4 smem[THREADS * SCH];
  uint4* sb = smem + (threadIdx.x - lane) * SCH;  // the warp's buffer
#endif
#endif
  i64 j0 = ((i64)blockIdx.x * THREADS + threadIdx.x - lane) * UNR;  // the warp's first chunk
#if OP == 2 && FAST
  if (vec && aligned(pay, 4)) {
    // The steps whose UNR spans are whole come first (j0 only grows); the lane's code
    // words, scale bytes and the warp's span of out move on by the grid's step, and each
    // step's words and scales are loaded during the step before (while it decodes).
    const i64 whole = count / EPL;  // chunks wholly inside out
    const u32* cw = (const u32*)pay + (j0 + lane) * WPL;
    const u8* sp = pay + SCALE_OFF(K) + (j0 + lane) / LPB;  // LPB divides 32 and j0
    uint4* op = (uint4*)dst + j0 * SCH;  // the span: 32 SCH pieces of 16 bytes per u
    u32 w[UNR][WPL], sc[UNR];
    load_step(cw, sp, j0 + 32 * UNR <= whole, w, sc);
    for (; j0 + 32 * UNR <= whole; j0 += step) {
      u32 wn[UNR][WPL], scn[UNR];
      cw += step * WPL, sp += step / LPB;
      load_step(cw, sp, j0 + step + 32 * UNR <= whole, wn, scn);
      for (int u = 0; u < UNR; ++u) {
        u32 o[OUT_WORDS];
        chunk_out(w[u], sc[u], s, o);
#if STAGED
        store_span_words(op + 32 * SCH * u, sb, lane, o);
#else
        op[32 * u + lane] = make_uint4(o[0], o[1], o[2], o[3]);
#endif
      }
      op += step * SCH;
      for (int u = 0; u < UNR; ++u) {
        for (int q = 0; q < WPL; ++q) w[u][q] = wn[u][q];
        sc[u] = scn[u];
      }
    }
  }
#endif
  for (; j0 < n; j0 += step) {
    for (int u = 0; u < UNR; ++u) {
      const i64 j = j0 + 32 * u + lane;
#if OP == 2
      float y[EPL];
      if (j < n) decode_chunk(pay, K, j, s, y);
#if STAGED
      const i64 w0 = (j0 + 32 * u) * EPL;  // the warp's span: the same in every lane
      if (vec && w0 + 32 * EPL <= count) {
        store_span(dst, w0, sb, lane, y);
        continue;
      }
#endif
      if (j < n) store_chunk(dst, j * EPL, count, vec, y);
#else
      chunk_body(pay, dst, count, K, j, j < n, vec);
#endif
    }
  }
}
#endif
