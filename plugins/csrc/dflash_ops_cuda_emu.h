// CPU emulation of the CUDA execution model, used ONLY to test dflash_ops_cuda.cu without a GPU
// (python -m dflash_trt.plugins.gpu_check --emulate). Compiled with DFLASH_CUDA_EMU defined, by a C++
// compiler, never by nvcc and never into the real extension.
//
// Each CTA runs its threads as ucontext fibers, one CTA after another, threads in a shuffled order between
// barriers. __syncthreads and every warp intrinsic are barriers; a warp intrinsic reached by only part of a
// warp, or a warp intrinsic and a __syncthreads reached at once, aborts with "EMU ERROR" (on a GPU: a hang or
// garbage). __shared__ variables are statics (one CTA at a time). Arithmetic is the host's: the fp16/bf16
// conversions are c10's (round to nearest even, as the CUDA intrinsics).
#pragma once
#include <ucontext.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <random>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
struct __half { c10::Half h; };
inline float __half2float(__half x) { return static_cast<float>(x.h); }
inline __half __float2half_rn(float f) { return __half{c10::Half(f)}; }
struct __nv_bfloat16 { c10::BFloat16 h; };
inline float __bfloat162float(__nv_bfloat16 x) { return static_cast<float>(x.h); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{c10::BFloat16(f)}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef void* cudaStream_t;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = 132; return 0; }
inline const char* cudaGetErrorString(cudaError_t) { return "emulated error"; }
inline cudaError_t cudaGetLastError() { return 0; }
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) uint4 { unsigned x, y, z, w; };

namespace dflash {
namespace emu {
struct Th { ucontext_t ctx; std::vector<char> stack; int state; };  // 0 run, 1 block bar, 2 warp bar, 3 done
inline dim3 g_tid, g_bid, g_bdim, g_gdim;
inline std::vector<Th>* g_th = nullptr;
inline int g_cur = -1;
inline ucontext_t g_sched;
inline std::function<void()> g_body;
inline uint64_t g_x[1024];
inline std::mt19937 g_rng(12345);
inline long long g_switches = 0;

inline void yield() { ++g_switches; swapcontext(&(*g_th)[g_cur].ctx, &g_sched); }
inline void entry() { g_body(); (*g_th)[g_cur].state = 3; }
inline void die(const char* m) { fprintf(stderr, "EMU ERROR: %s (block %u,%u)\n", m, g_bid.x, g_bid.y); abort(); }

inline void run_block(int nt) {
  std::vector<Th>& th = *g_th;
  std::vector<int> order(nt);
  for (int i = 0; i < nt; ++i) order[i] = i;
  while (true) {
    std::shuffle(order.begin(), order.end(), g_rng);
    for (int i : order) {
      if (th[i].state != 0) continue;
      g_cur = i;
      g_tid = dim3(i % g_bdim.x, (i / g_bdim.x) % g_bdim.y, i / (g_bdim.x * g_bdim.y));
      swapcontext(&g_sched, &th[i].ctx);
      // a thread may come back runnable only after a release; the loop above runs each once per round
    }
    bool any_run = false, all_done = true;
    for (auto& t : th) { any_run |= t.state == 0; all_done &= t.state == 3; }
    if (all_done) return;
    if (any_run) continue;
    bool released = false;
    for (int w = 0; w * 32 < nt; ++w) {
      int n2 = 0, n1 = 0, n3 = 0;
      for (int l = w * 32; l < std::min(nt, w * 32 + 32); ++l) {
        n2 += th[l].state == 2; n1 += th[l].state == 1; n3 += th[l].state == 3;
      }
      if (n2 == 0) continue;
      if (n1 || n3) die("warp intrinsic reached by part of a warp");
      for (int l = w * 32; l < std::min(nt, w * 32 + 32); ++l) th[l].state = 0;
      released = true;
    }
    if (released) continue;
    for (auto& t : th) if (t.state == 1) t.state = 0;
  }
}

template <typename F>
struct Launch {
  F f;
  dim3 grid, block;
  template <typename... A>
  void operator()(A... a) {
    g_gdim = grid;
    g_bdim = block;
    const int nt = block.x * block.y * block.z;
    std::vector<Th> th(nt);
    for (auto& t : th) t.stack.resize(1 << 16);
    g_th = &th;
    F fn = f;
    g_body = [&]() { fn(a...); };
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          g_bid = dim3(bx, by, bz);
          for (auto& t : th) {
            getcontext(&t.ctx);
            t.ctx.uc_stack.ss_sp = t.stack.data();
            t.ctx.uc_stack.ss_size = t.stack.size();
            t.ctx.uc_link = &g_sched;
            makecontext(&t.ctx, entry, 0);
            t.state = 0;
          }
          run_block(nt);
        }
    g_th = nullptr;
  }
};
template <typename F>
Launch<F> launch(F f, dim3 g, dim3 b, size_t = 0, cudaStream_t = nullptr) { return Launch<F>{f, g, b}; }
}  // namespace emu
}  // namespace dflash

#define threadIdx (::dflash::emu::g_tid)
#define blockIdx (::dflash::emu::g_bid)
#define blockDim (::dflash::emu::g_bdim)
#define gridDim (::dflash::emu::g_gdim)

inline void __syncthreads() { (*::dflash::emu::g_th)[::dflash::emu::g_cur].state = 1; ::dflash::emu::yield(); }
inline void emu_warp_bar() { (*::dflash::emu::g_th)[::dflash::emu::g_cur].state = 2; ::dflash::emu::yield(); }

template <typename T>
inline T emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= 8, "");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  ::dflash::emu::g_x[::dflash::emu::g_cur] = bits;
  emu_warp_bar();
  const uint64_t got = ::dflash::emu::g_x[src];
  emu_warp_bar();
  T r;
  memcpy(&r, &got, sizeof(T));
  return r;
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int o) {
  if (mask != 0xffffffffu) ::dflash::emu::die("partial mask");
  const int me = ::dflash::emu::g_cur;
  return emu_shfl(v, (me & ~31) | ((me & 31) ^ o));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d) {
  if (mask != 0xffffffffu) ::dflash::emu::die("partial mask");
  const int me = ::dflash::emu::g_cur, lane = me & 31;
  const T r = emu_shfl(v, lane >= (int)d ? me - (int)d : me);
  return r;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) ::dflash::emu::die("partial mask");
  const int me = ::dflash::emu::g_cur;
  ::dflash::emu::g_x[me] = pred ? 1 : 0;
  emu_warp_bar();
  unsigned b = 0;
  for (int l = 0; l < 32; ++l) b |= (unsigned)(::dflash::emu::g_x[(me & ~31) + l] & 1) << l;
  emu_warp_bar();
  return b;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
