// Host emulation of the CUDA built-ins that the codec kernels use, for
// tests/test_codec_int_host.py: one warp of 32 std::threads in lockstep at every shuffle
// and __syncwarp (a std::barrier), __shared__ arrays as statics, one block.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using std::max;
using std::min;
#define __device__
#define __host__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(a, b)
#define __restrict__
#define __shared__ static
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct Dim { unsigned x; };
thread_local Dim threadIdx;
Dim blockIdx{0}, gridDim{1};
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
template <class T> T __ldg(const T* p) { return *p; }
inline unsigned __vmaxu2(unsigned a, unsigned b) {
  unsigned lo = std::max(a & 0xffffu, b & 0xffffu), hi = std::max(a >> 16, b >> 16);
  return lo | (hi << 16);
}
std::barrier<>* g_bar;
unsigned g_slot[32];
inline void __syncwarp() { g_bar->arrive_and_wait(); }
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int t) {
  int l = threadIdx.x & 31;
  g_slot[l] = v;
  g_bar->arrive_and_wait();
  unsigned r = g_slot[l ^ t];
  g_bar->arrive_and_wait();
  return r;
}
inline float __shfl_xor_sync(unsigned m, float v, int t) {
  return __uint_as_float(__shfl_xor_sync(m, __float_as_uint(v), t));
}
inline int __any_sync(unsigned, int pred) {
  int l = threadIdx.x & 31;
  g_slot[l] = pred != 0;
  g_bar->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= g_slot[i];
  g_bar->arrive_and_wait();
  return r != 0;
}
