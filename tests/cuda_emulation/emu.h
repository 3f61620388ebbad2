// Host emulation of the CUDA built-ins that the codec helpers (codec_kernels.cu,
// codec_tile_helpers.cu) and tah's kernels use, so that the tah kernels run on a CPU
// (tests/test_codec_tah_emulated.py): blocks of
// EMU_THREADS (= THREADS) threads, each a std::thread, one block after the other; warp
// shuffles, votes and barriers through std::barrier, shared-memory atomics through
// std::atomic_ref. The float arithmetic is codec_kernels.cu's host branch (plain IEEE float32,
// compiled with -ffp-contract=off); the GPU's inline PTX computes the same values.
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <thread>
#include <vector>
#include <algorithm>
#include <memory>
#include <atomic>
#ifndef THREADS
#define THREADS 256
#endif
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct Dim { unsigned x; };
thread_local Dim threadIdx;
Dim blockIdx{0}, gridDim{1};
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
template <class T> inline T __ldg(const T* p) { return *p; }
using std::min; using std::max;
inline unsigned __vmaxu2(unsigned a, unsigned b) {
  unsigned lo = std::max(a & 0xffffu, b & 0xffffu), hi = std::max(a >> 16, b >> 16);
  return lo | (hi << 16);
}
inline unsigned __vminu2(unsigned a, unsigned b) {
  unsigned lo = std::min(a & 0xffffu, b & 0xffffu), hi = std::min(a >> 16, b >> 16);
  return lo | (hi << 16);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
constexpr int EMU_THREADS = THREADS;
std::unique_ptr<std::barrier<>> g_block;
std::vector<std::unique_ptr<std::barrier<>>> g_warp;
uint64_t g_slots[EMU_THREADS];
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warp[threadIdx.x >> 5]->arrive_and_wait(); }
template <class T> T emu_shfl(T v, int src) {
  const int w = threadIdx.x >> 5;
  uint64_t bits = 0; std::memcpy(&bits, &v, sizeof(T));
  g_slots[threadIdx.x] = bits;
  g_warp[w]->arrive_and_wait();
  uint64_t r = g_slots[w * 32 + (src & 31)];
  g_warp[w]->arrive_and_wait();
  T out; std::memcpy(&out, &r, sizeof(T)); return out;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int m) { return emu_shfl(v, (threadIdx.x & 31) ^ m); }
template <class T> T __shfl_sync(unsigned, T v, int src) { return emu_shfl(v, src); }
// The 32 lanes' values of v (as 64-bit words) in all[], for the votes below.
template <class T> void emu_gather(T v, uint64_t* all) {
  const int w = threadIdx.x >> 5;
  uint64_t bits = 0; std::memcpy(&bits, &v, sizeof(T));
  g_slots[threadIdx.x] = bits;
  g_warp[w]->arrive_and_wait();
  for (int l = 0; l < 32; ++l) all[l] = g_slots[w * 32 + l];
  g_warp[w]->arrive_and_wait();
}
inline unsigned __ballot_sync(unsigned, int pred) {
  uint64_t all[32]; emu_gather<uint64_t>(pred ? 1u : 0u, all);
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= (all[l] ? 1u : 0u) << l;
  return m;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0u; }
inline unsigned __match_any_sync(unsigned, unsigned v) {
  uint64_t all[32]; emu_gather<uint64_t>(v, all);
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= (all[l] == v ? 1u : 0u) << l;
  return m;
}
// redux.sync: the 32 lanes' sum (modulo 2^32) and largest value of an unsigned.
inline unsigned __reduce_add_sync(unsigned, unsigned v) {
  uint64_t all[32]; emu_gather<uint64_t>(v, all);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r += (unsigned)all[l];
  return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  uint64_t all[32]; emu_gather<uint64_t>(v, all);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r = std::max(r, (unsigned)all[l]);
  return r;
}
inline int __clz(unsigned x) { return x == 0u ? 32 : __builtin_clz(x); }
inline int __ffs(unsigned x) { return x == 0u ? 0 : __builtin_ctz(x) + 1; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
// Runs kernel() in every thread of a grid of `blocks` blocks of EMU_THREADS threads, one
// block after the other (the kernels' blocks share nothing but global memory), each
// thread a std::thread with its threadIdx and blockIdx set.
template <class F> void emu_run_grid(long long blocks, F kernel) {
  gridDim.x = (unsigned)blocks;
  for (long long b = 0; b < blocks; ++b) {
    blockIdx.x = (unsigned)b;
    g_block = std::make_unique<std::barrier<>>(EMU_THREADS);
    g_warp.clear();
    for (int w = 0; w < EMU_THREADS / 32; ++w)
      g_warp.push_back(std::make_unique<std::barrier<>>(32));
    std::vector<std::thread> ts;
    for (int t = 0; t < EMU_THREADS; ++t)
      ts.emplace_back([=] {
        threadIdx.x = t;
        kernel();
      });
    for (auto& t : ts) t.join();
  }
}
