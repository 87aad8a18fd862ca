// DFlash CUDA kernels: raw-pointer __global__ kernels and their launchers. Plain nvcc compiles this file
// (no torch headers): plugins/check_cuda.sh builds it for sm_90a / sm_100a / sm_103a on machines without a GPU;
// dflash_ops_cuda_glue.cpp registers the torch ops that call the launchers.
//
// Determinism: every reduction has a fixed shape (per-thread strided loops, xor-butterfly warp sums, warps
// summed in order), no floating-point atomics; the same inputs give the same outputs run to run and whatever
// else is in the batch (a row's result depends on that row only).
#ifdef DFLASH_CUDA_EMU  // the CPU emulation of these kernels (plugins/gpu_check.py --emulate)
#include "dflash_ops_cuda_emu.h"
#define DFLASH_LAUNCH(kernel, grid, block, stream) ::dflash::emu::launch(kernel, grid, block)
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define DFLASH_LAUNCH(kernel, grid, block, stream) kernel<<<grid, block, 0, stream>>>
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dflash_ops_common.h"
#include "dflash_ops_cuda.cuh"

namespace dflash {
namespace cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr long long kNoIndex = 0x7fffffffffffffffLL;

// ------------------------------------------------------------------------------------------ loads
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ double ld(const double* p) { return *p; }

__device__ __forceinline__ float ld_any(const void* p, int dt, int64_t i) {
  switch (dt) {
    case kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// round to the precision of dtype dt (nearest even), as a torch op that produces dt does
__device__ __forceinline__ float round_any(float x, int dt) {
  switch (dt) {
    case kF16: return __half2float(__float2half_rn(x));
    case kBF16: return __bfloat162float(__float2bfloat16_rn(x));
    default: return x;
  }
}

__device__ __forceinline__ void st_any(void* p, int dt, int64_t i, float x) {
  switch (dt) {
    case kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    case kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    default: static_cast<float*>(p)[i] = x;
  }
}

// ------------------------------------------------------------------------------------- reductions
// torch.argmax order: NaN first, then larger values, ties to the lower index. A strict total order, so any
// reduction tree gives the same answer.
template <typename V>
__device__ __forceinline__ bool better(V a, long long ia, V b, long long ib) {
  const bool na = a != a, nb = b != b;
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

template <typename V>
__device__ __forceinline__ void warp_argbest(V& v, long long& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const V v2 = __shfl_xor_sync(kFull, v, o);
    const long long i2 = __shfl_xor_sync(kFull, i, o);
    if (better(v2, i2, v, i)) { v = v2; i = i2; }
  }
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);  // commutative: every lane agrees
  return v;
}

template <typename V>
__device__ __forceinline__ void take(V a, long long ia, V& bv, long long& bi) {
  if (better(a, ia, bv, bi)) { bv = a; bi = ia; }
}

// argmax over x[lo, hi) by a block of NT threads; the result is valid in thread 0. The aligned body is read
// with 16-byte loads (8 bf16 / fp16, 4 fp32, 2 fp64 per load), two in flight per thread.
template <typename T, int NT>
__device__ void block_argmax(const T* x, int64_t lo, int64_t hi, typename Acc<T>::type& out_v, long long& out_i) {
  using V = typename Acc<T>::type;
  constexpr int kVec = 16 / sizeof(T);
  __shared__ V s_v[NT / 32];
  __shared__ long long s_i[NT / 32];
  V bv = -INFINITY;
  long long bi = kNoIndex;
  int64_t head = (int64_t)(((16 - (reinterpret_cast<uintptr_t>(x + lo) & 15)) & 15) / sizeof(T));
  if (reinterpret_cast<uintptr_t>(x + lo) % sizeof(T) != 0 || head > hi - lo) head = hi - lo;
  for (int64_t j = lo + threadIdx.x; j < lo + head; j += NT) take<V>(ld(x + j), j, bv, bi);
  const int64_t vlo = lo + head, nvec = (hi - vlo) / kVec;
  const uint4* vp = reinterpret_cast<const uint4*>(x + vlo);
  int64_t q = threadIdx.x;
  for (; q + NT < nvec; q += 2 * NT) {
    const uint4 u0 = vp[q], u1 = vp[q + NT];
    T e0[kVec], e1[kVec];  // register moves: memcpy keeps the reinterpretation well defined
    memcpy(e0, &u0, sizeof(u0));
    memcpy(e1, &u1, sizeof(u1));
#pragma unroll
    for (int z = 0; z < kVec; ++z) take<V>(ld(e0 + z), vlo + q * kVec + z, bv, bi);
#pragma unroll
    for (int z = 0; z < kVec; ++z) take<V>(ld(e1 + z), vlo + (q + NT) * kVec + z, bv, bi);
  }
  for (; q < nvec; q += NT) {
    const uint4 u0 = vp[q];
    T e0[kVec];
    memcpy(e0, &u0, sizeof(u0));
#pragma unroll
    for (int z = 0; z < kVec; ++z) take<V>(ld(e0 + z), vlo + q * kVec + z, bv, bi);
  }
  for (int64_t j = vlo + nvec * kVec + threadIdx.x; j < hi; j += NT) take<V>(ld(x + j), j, bv, bi);
  warp_argbest(bv, bi);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { s_v[warp] = bv; s_i[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    bv = lane < NT / 32 ? s_v[lane] : V(-INFINITY);
    bi = lane < NT / 32 ? s_i[lane] : kNoIndex;
    warp_argbest(bv, bi);
    if (lane == 0) { out_v = bv; out_i = bi; }
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------- prepare_draft_blocks
constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kScanThreads) prepare_offsets_kernel(const int64_t* starts, int64_t n,
                                                                        int64_t* offsets) {
  __shared__ long long sums[kScanThreads];
  const int t = threadIdx.x;
  const int64_t chunk = (n + kScanThreads - 1) / kScanThreads;
  const int64_t lo = t * chunk, hi = lo + chunk < n ? lo + chunk : n;
  long long local = 0;
  for (int64_t i = lo; i < hi; ++i) local += starts[i] > 0 ? starts[i] : 0;
  sums[t] = local;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off <<= 1) {  // inclusive Hillis-Steele scan
    const long long add = t >= off ? sums[t - off] : 0;
    __syncthreads();
    sums[t] += add;
    __syncthreads();
  }
  long long run = t ? sums[t - 1] : 0;
  if (t == 0) offsets[0] = 0;
  for (int64_t i = lo; i < hi; ++i) {
    run += starts[i] > 0 ? starts[i] : 0;
    offsets[i + 1] = run;
  }
}

constexpr int kFillThreads = 256, kFillSplits = 4;

// blockIdx.x < R: request blockIdx.x (its block, and a 1/kFillSplits share of its context slots);
// blockIdx.x == R: the -1 padding after the last request's slots.
__global__ void __launch_bounds__(kFillThreads) prepare_fill_kernel(
    const int64_t* last_tokens, const int64_t* starts, const int64_t* block_tables, int64_t n, int64_t max_blocks,
    int64_t block_size, int64_t mask_token_id, int64_t page_size, int64_t cap, const int64_t* offsets,
    int64_t* block_ids, int64_t* positions, int64_t* ctx_slots) {
  const int64_t r = blockIdx.x;
  const int64_t step = (int64_t)gridDim.y * blockDim.x;
  const int64_t first = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
  if (r == n) {
    for (int64_t i = offsets[n] + first; i < cap; i += step) ctx_slots[i] = kPad;
    return;
  }
  const int64_t start = starts[r] > 0 ? starts[r] : 0;
  if (blockIdx.y == 0) {
    for (int64_t j = threadIdx.x; j < block_size; j += blockDim.x) {
      block_ids[r * block_size + j] = j == 0 ? last_tokens[r] : mask_token_id;
      positions[r * block_size + j] = starts[r] + j;
    }
  }
  const int64_t base = offsets[r];
  const int64_t* table = block_tables + r * max_blocks;
  for (int64_t p = first; p < start && base + p < cap; p += step) {
    const int64_t page = p / page_size;
    ctx_slots[base + p] = page < max_blocks ? table[page] * page_size + p % page_size : kPad;
  }
}

// ---------------------------------------------------------------------------------------- verify
constexpr int kArgmaxThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_split_kernel(const T* logits, int64_t row_stride,
                                                                       int64_t vocab, int splits, double* part_v,
                                                                       int64_t* part_i) {
  const int64_t row = blockIdx.x;
  const int s = blockIdx.y;
  const int64_t chunk = (vocab + splits - 1) / splits;
  const int64_t lo = s * chunk, hi = lo + chunk < vocab ? lo + chunk : vocab;
  typename Acc<T>::type v;
  long long i;
  block_argmax<T, kArgmaxThreads>(logits + row * row_stride, lo, hi, v, i);
  if (threadIdx.x == 0) {
    part_v[row * splits + s] = (double)v;
    part_i[row * splits + s] = i;
  }
}

__global__ void argmax_finalize_kernel(const double* part_v, const int64_t* part_i, int64_t rows, int splits,
                                       int64_t* out) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // uniform per warp
  double v = -INFINITY;
  long long i = kNoIndex;
  for (int s = lane; s < splits; s += 32) {
    const double v2 = part_v[row * splits + s];
    const long long i2 = part_i[row * splits + s];
    if (better(v2, i2, v, i)) { v = v2; i = i2; }
  }
  warp_argbest(v, i);
  if (lane == 0) out[row] = i;
}

// a = longest prefix of drafts equal to the choice of the previous row; committed = d_1..d_a, choice[a], -1...
// Malformed requests (lengths or rows out of range) commit nothing: accepted = 0, num_committed = 0.
__global__ void accept_kernel(const int64_t* drafts, const int64_t* draft_lens, const int64_t* row_offsets,
                              int64_t n, int64_t k_max, const int64_t* choice, int64_t rows, int64_t* accepted,
                              int64_t* committed, int64_t* num_committed) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const int64_t k = draft_lens[r], o = row_offsets[r];
  int64_t* out = committed + r * (k_max + 1);
  if (k < 0 || k > k_max || o < 0 || o + k + 1 > rows) {
    for (int64_t j = 0; j <= k_max; ++j) out[j] = kPad;
    accepted[r] = 0;
    num_committed[r] = 0;
    return;
  }
  const int64_t* d = drafts + r * k_max;
  const int64_t* post = choice + o;
  int64_t a = 0;
  while (a < k && d[a] == post[a]) { out[a] = d[a]; ++a; }
  out[a] = post[a];
  for (int64_t j = a + 1; j <= k_max; ++j) out[j] = kPad;
  accepted[r] = a;
  num_committed[r] = a + 1;
}

// ------------------------------------------------------------------------------------------ sampling
// One CTA per logits row. The distribution is filtered_probs' (float64 throughout):
//   s_i = x_i / T, e_i = exp(s_i - max s), top-k keeps x_i >= the k-th largest value (ties included),
//   top-p keeps the smallest prefix of the descending order whose mass reaches top_p * Z (ties at the cut
//   taken in index order), token = first index whose running kept mass exceeds u * total.
// Thresholds are found by a 16-way search over the order-preserving 32-bit key of the float logit (exact:
// x -> x / T is strictly increasing), so nothing is sorted.
constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kCuts = 15;  // thresholds per search pass: 4 bits of the key per pass

__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);  // -0 == +0, as in the comparisons of torch
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float funkey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct SampleShared {
  double red[kSampleWarps][kCuts];
  double sums[kCuts];
  double seg_mass[kSampleWarps];
  long long tie_cnt[kSampleWarps];
  long long tie_base[kSampleWarps];
  long long owner[kSampleWarps];
  float fmax[kSampleWarps];
  uint32_t lo, hi;
  double f_above, target, excl;
  long long keep_ties;
  int wstar;
};

__device__ long long block_min_ll(long long v, SampleShared& sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const long long w = __shfl_xor_sync(kFull, v, o);
    v = w < v ? w : v;
  }
  if ((threadIdx.x & 31) == 0) sm.owner[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sm.owner[0];
  for (int w = 1; w < kSampleWarps; ++w) v = sm.owner[w] < v ? sm.owner[w] : v;
  __syncthreads();
  return v;
}

__device__ float block_max_f(float v, SampleShared& sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  if ((threadIdx.x & 31) == 0) sm.fmax[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sm.fmax[0];
  for (int w = 1; w < kSampleWarps; ++w) v = fmaxf(v, sm.fmax[w]);
  __syncthreads();
  return v;
}

__device__ double block_sum_d(double v, SampleShared& sm) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) sm.seg_mass[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0.0;
  for (int w = 0; w < kSampleWarps; ++w) v += sm.seg_mass[w];
  __syncthreads();
  return v;
}

// The largest key t in [lo, hi] with F(t) >= target, where F(t) = sum over i with key_i >= t of w_i
// (w_i = 1, or e_i when kMass), given F(lo) >= target. *f_above = F(t + 1). Deterministic.
template <typename T, bool kMass>
__device__ uint32_t search_key(const T* x, int64_t vocab, uint32_t lo, uint32_t hi, double target, double temp,
                               double smax, double* f_above_out, SampleShared& sm) {
  double f_above = 0.0;  // F(hi + 1)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  while (lo < hi) {
    const uint64_t width = (uint64_t)hi - lo + 1;
    const bool narrow = width <= kCuts + 1;
    const int m = narrow ? (int)(width - 1) : kCuts;
    uint32_t t[kCuts];
#pragma unroll
    for (int j = 0; j < kCuts; ++j)
      t[j] = narrow ? lo + 1 + (j < m ? j : m - 1) : lo + (uint32_t)(((uint64_t)(j + 1) * width) / (kCuts + 1));
    double acc[kCuts];
#pragma unroll
    for (int j = 0; j < kCuts; ++j) acc[j] = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kSampleThreads) {
      const float xf = ld(x + i);
      const uint32_t key = fkey(xf);
      if (key < t[0] || key > hi) continue;
      const double w = kMass ? exp((double)xf / temp - smax) : 1.0;
#pragma unroll
      for (int j = 0; j < kCuts; ++j)
        if (j < m && key >= t[j]) acc[j] += w;
    }
#pragma unroll
    for (int j = 0; j < kCuts; ++j) {
      const double v = warp_sum(acc[j]);
      if (lane == 0) sm.red[warp][j] = v;
    }
    __syncthreads();
    if (threadIdx.x < m) {
      double s = 0.0;
      for (int w = 0; w < kSampleWarps; ++w) s += sm.red[w][threadIdx.x];
      sm.sums[threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int best = -1;  // F(t_j) = f_above + sums[j] does not increase with j: the passing j form a prefix
      for (int j = 0; j < m; ++j)
        if (f_above + sm.sums[j] >= target) best = j;
      uint32_t nlo = lo, nhi;
      double nfa;
      if (best < 0) {
        nhi = t[0] - 1;
        nfa = f_above + sm.sums[0];
      } else if (best + 1 < m) {
        nlo = t[best];
        nhi = t[best + 1] - 1;
        nfa = f_above + sm.sums[best + 1];
      } else {
        nlo = t[best];
        nhi = hi;
        nfa = f_above;
      }
      sm.lo = nlo;
      sm.hi = nhi;
      sm.f_above = nfa;
    }
    __syncthreads();
    lo = sm.lo;
    hi = sm.hi;
    f_above = sm.f_above;
    __syncthreads();
  }
  *f_above_out = f_above;
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads) sample_kernel(
    const T* logits, int64_t row_stride, int64_t vocab, const int64_t* draft_lens, const int64_t* row_offsets,
    int64_t n, const int64_t* starts, const int64_t* seeds, const double* temperature, const int64_t* top_k,
    const double* top_p, int64_t* out) {
  __shared__ SampleShared sm;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;

  // the owner request of this row: the lowest r with row in [row_offsets[r], row_offsets[r] + K_r]
  long long own = kNoIndex;
  for (int64_t r = tid; r < n; r += kSampleThreads) {
    const int64_t o = row_offsets[r], k = draft_lens[r];
    if (k >= 0 && row >= o && row <= o + k && r < own) own = r;
  }
  own = block_min_ll(own, sm);
  const double temp = own < n ? temperature[own] : 0.0;
  if (!(temp > 0.0)) {  // greedy, or a row no request owns
    float v;
    long long i;
    block_argmax<T, kSampleThreads>(x, 0, vocab, v, i);
    if (tid == 0) out[row] = i;
    return;
  }
  const int64_t position = starts[own] + (row - row_offsets[own]) + 1;
  const int64_t k_param = top_k[own];
  const double p_param = top_p[own];
  const bool use_k = k_param > 0 && k_param < vocab, use_p = p_param < 1.0;

  float m = -INFINITY;
  for (int64_t i = tid; i < vocab; i += kSampleThreads) m = fmaxf(m, ld(x + i));
  m = block_max_f(m, sm);
  const uint32_t key_max = fkey(m);
  const double smax = (double)m / temp;

  double dummy;
  const uint32_t key_k = use_k ? search_key<T, false>(x, vocab, 0u, key_max, (double)k_param, temp, smax, &dummy, sm)
                               : 0u;
  uint32_t key_p = 0u;
  if (use_p) {
    double z = 0.0;
    for (int64_t i = tid; i < vocab; i += kSampleThreads) {
      const float xf = ld(x + i);
      if (fkey(xf) >= key_k) z += exp((double)xf / temp - smax);
    }
    z = block_sum_d(z, sm);
    const double target = p_param * z;
    double greater;  // kept mass strictly above the cut
    key_p = search_key<T, true>(x, vocab, key_k, key_max, target, temp, smax, &greater, sm);
    // ties at the cut value: count them per warp segment (index order), keep the first q
    const int64_t seg = ((vocab + kSampleWarps - 1) / kSampleWarps + 31) / 32 * 32;
    const int64_t lo = warp * seg, hi = lo + seg < vocab ? lo + seg : vocab;
    long long cnt = 0;
    for (int64_t b = lo; b < hi; b += 32) {
      const int64_t i = b + lane;
      cnt += __popc(__ballot_sync(kFull, i < hi && fkey(ld(x + i)) == key_p));
    }
    if (lane == 0) sm.tie_cnt[warp] = cnt;
    __syncthreads();
    if (tid == 0) {
      long long run = 0;
      for (int w = 0; w < kSampleWarps; ++w) { sm.tie_base[w] = run; run += sm.tie_cnt[w]; }
      const double e_cut = exp((double)funkey(key_p) / temp - smax);
      long long q = run;
      if (e_cut > 0.0) {
        const double need = ceil((target - greater) / e_cut);
        q = need < 1.0 ? 1 : (need < (double)run ? (long long)need : run);
      }
      sm.keep_ties = q;
    }
    __syncthreads();
  }

  // kept mass per warp segment, in index order
  const int64_t seg = ((vocab + kSampleWarps - 1) / kSampleWarps + 31) / 32 * 32;
  const int64_t seg_lo = warp * seg, seg_hi = seg_lo + seg < vocab ? seg_lo + seg : vocab;
  const long long keep_ties = use_p ? sm.keep_ties : 0;
  const unsigned below = (1u << lane) - 1u;
  auto weight = [&](int64_t i, long long& tie_run, bool& kept) -> double {
    const bool valid = i < seg_hi;
    const float xf = valid ? ld(x + i) : 0.0f;
    const uint32_t key = fkey(xf);
    const bool tie = use_p && valid && key == key_p;
    const unsigned tb = __ballot_sync(kFull, tie);
    const long long rank = tie_run + __popc(tb & below);
    tie_run += __popc(tb);
    kept = valid && (!use_k || key >= key_k) && (!use_p || key > key_p || (tie && rank < keep_ties));
    return kept ? exp((double)xf / temp - smax) : 0.0;
  };
  {
    long long tie_run = use_p ? sm.tie_base[warp] : 0;
    double mass = 0.0;
    for (int64_t b = seg_lo; b < seg_hi; b += 32) {
      bool kept;
      mass += warp_sum(weight(b + lane, tie_run, kept));
    }
    if (lane == 0) sm.seg_mass[warp] = mass;
  }
  __syncthreads();
  if (tid == 0) {
    double total = 0.0;
    for (int w = 0; w < kSampleWarps; ++w) total += sm.seg_mass[w];
    const double target = philox_uniform(seeds[own], position) * total;
    double run = 0.0, excl = 0.0;
    int wstar = -1, wlast = 0;
    for (int w = 0; w < kSampleWarps; ++w) {
      if (sm.seg_mass[w] > 0.0) wlast = w;
      if (wstar < 0 && run + sm.seg_mass[w] > target) { wstar = w; excl = run; }
      run += sm.seg_mass[w];
    }
    if (wstar < 0) {  // u * total rounded onto the total: the last segment with mass
      wstar = wlast;
      excl = 0.0;
      for (int w = 0; w < wlast; ++w) excl += sm.seg_mass[w];
    }
    sm.wstar = wstar;
    sm.excl = excl;
    sm.target = target;
  }
  __syncthreads();
  if (warp == sm.wstar) {
    const double target = sm.target;
    double running = sm.excl;
    long long tie_run = use_p ? sm.tie_base[warp] : 0;
    long long found = -1, last_kept = -1;
    for (int64_t b = seg_lo; b < seg_hi; b += 32) {
      bool kept;
      const double w = weight(b + lane, tie_run, kept);
      double s = w;  // inclusive scan over the tile
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(kFull, s, o);
        if (lane >= o) s += y;
      }
      const unsigned hit = __ballot_sync(kFull, kept && running + s > target);
      const unsigned kb = __ballot_sync(kFull, kept);
      if (kb) last_kept = b + 31 - __clz(kb);
      if (hit) { found = b + __ffs(hit) - 1; break; }
      running += warp_sum(w);
    }
    if (lane == 0) out[row] = found >= 0 ? found : (last_kept >= 0 ? last_kept : vocab - 1);
  }
}

// ------------------------------------------------------------------------------------ context_append
constexpr int kAppendThreads = 128;  // one warp per (token, kv head)

__global__ void __launch_bounds__(kAppendThreads) context_append_kernel(
    const void* k, const void* v, const void* w, const void* cos, const void* sin, const int64_t* slots,
    void* k_cache, void* v_cache, int64_t tokens, int64_t kv_heads, int64_t head_dim, int64_t num_slots,
    AppendDTypes dt, float eps) {
  const int64_t item = (int64_t)blockIdx.x * (kAppendThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (item >= tokens * kv_heads) return;  // uniform per warp
  const int64_t t = item / kv_heads, h = item % kv_heads;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;  // padding (or a slot outside the cache: nothing written)
  const int64_t src = item * head_dim, half = head_dim / 2, dst = (slot * kv_heads + h) * head_dim;
  float ss = 0.0f;
  for (int64_t j = lane; j < head_dim; j += 32) {
    const float a = ld_any(k, dt.k, src + j);
    ss = __fadd_rn(ss, __fmul_rn(a, a));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)head_dim), eps)));
  for (int64_t j = lane; j < half; j += 32) {
    const float n0 = round_any(__fmul_rn(ld_any(k, dt.k, src + j), r), dt.k);
    const float n1 = round_any(__fmul_rn(ld_any(k, dt.k, src + j + half), r), dt.k);
    const float k0 = round_any(__fmul_rn(ld_any(w, dt.w, j), n0), dt.p);
    const float k1 = round_any(__fmul_rn(ld_any(w, dt.w, j + half), n1), dt.p);
    const float c0 = ld_any(cos, dt.cs, t * head_dim + j), c1 = ld_any(cos, dt.cs, t * head_dim + j + half);
    const float s0 = ld_any(sin, dt.cs, t * head_dim + j), s1 = ld_any(sin, dt.cs, t * head_dim + j + half);
    // rotate-half: out[j] = k[j] cos[j] - k[j+half] sin[j], out[j+half] = k[j+half] cos[j+half] + k[j] sin[j+half];
    // each product and the sum rounded to dtype q, as the eager x * cos + rot * sin
    const float a0 = round_any(__fmul_rn(k0, c0), dt.q), b0 = round_any(__fmul_rn(-k1, s0), dt.q);
    const float a1 = round_any(__fmul_rn(k1, c1), dt.q), b1 = round_any(__fmul_rn(k0, s1), dt.q);
    const float o0 = round_any(__fadd_rn(a0, b0), dt.q), o1 = round_any(__fadd_rn(a1, b1), dt.q);
    st_any(k_cache, dt.kc, dst + j, o0);
    st_any(k_cache, dt.kc, dst + j + half, o1);
  }
  for (int64_t j = lane; j < head_dim; j += 32) st_any(v_cache, dt.vc, dst + j, ld_any(v, dt.v, src + j));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ------------------------------------------------------------------------------------------ launchers
cudaError_t launch_prepare_draft_blocks(const int64_t* last_tokens, const int64_t* starts,
                                        const int64_t* block_tables, int64_t num_requests, int64_t max_blocks,
                                        int64_t block_size, int64_t mask_token_id, int64_t page_size,
                                        int64_t num_ctx_slots, int64_t* block_ids, int64_t* positions,
                                        int64_t* ctx_slots, int64_t* ctx_offsets, cudaStream_t stream) {
  DFLASH_LAUNCH(prepare_offsets_kernel, 1, kScanThreads, stream)(starts, num_requests, ctx_offsets);
  dim3 grid((unsigned)(num_requests + 1), kFillSplits);
  DFLASH_LAUNCH(prepare_fill_kernel, grid, kFillThreads, stream)(
      last_tokens, starts, block_tables, num_requests, max_blocks, block_size, mask_token_id, page_size,
      num_ctx_slots, ctx_offsets, block_ids, positions, ctx_slots);
  return cudaGetLastError();
}

int greedy_splits(int64_t rows, int64_t vocab, int num_sms) {
  if (rows <= 0) return 1;
  const int64_t want = ceil_div(2 * (int64_t)num_sms, rows);  // about two CTAs per SM
  const int64_t most = vocab / 4096 > 1 ? vocab / 4096 : 1;   // at least 4096 logits per CTA
  int64_t s = want < most ? want : most;
  s = s < 64 ? s : 64;
  return (int)(s > 1 ? s : 1);
}

static cudaError_t launch_accept(const int64_t* drafts, const int64_t* draft_lens, const int64_t* row_offsets,
                                 int64_t n, int64_t k_max, const int64_t* choice, int64_t rows, int64_t* accepted,
                                 int64_t* committed, int64_t* num_committed, cudaStream_t stream) {
  if (n > 0)
    DFLASH_LAUNCH(accept_kernel, (unsigned)ceil_div(n, 128), 128, stream)(
        drafts, draft_lens, row_offsets, n, k_max, choice, rows, accepted, committed, num_committed);
  return cudaGetLastError();
}

cudaError_t launch_greedy_verify(const void* logits, DType dtype, int64_t rows, int64_t vocab, int64_t row_stride,
                                 const int64_t* drafts, const int64_t* draft_lens, const int64_t* row_offsets,
                                 int64_t num_requests, int64_t k_max, int splits, double* scratch_val,
                                 int64_t* scratch_idx, int64_t* argmax, int64_t* accepted, int64_t* committed,
                                 int64_t* num_committed, cudaStream_t stream) {
  if (rows > 0) {
    dim3 grid((unsigned)rows, (unsigned)splits);
    switch (dtype) {
      case kF16:
        DFLASH_LAUNCH(argmax_split_kernel<__half>, grid, kArgmaxThreads, stream)(
            static_cast<const __half*>(logits), row_stride, vocab, splits, scratch_val, scratch_idx);
        break;
      case kBF16:
        DFLASH_LAUNCH(argmax_split_kernel<__nv_bfloat16>, grid, kArgmaxThreads, stream)(
            static_cast<const __nv_bfloat16*>(logits), row_stride, vocab, splits, scratch_val, scratch_idx);
        break;
      case kF64:
        DFLASH_LAUNCH(argmax_split_kernel<double>, grid, kArgmaxThreads, stream)(
            static_cast<const double*>(logits), row_stride, vocab, splits, scratch_val, scratch_idx);
        break;
      default:
        DFLASH_LAUNCH(argmax_split_kernel<float>, grid, kArgmaxThreads, stream)(
            static_cast<const float*>(logits), row_stride, vocab, splits, scratch_val, scratch_idx);
    }
    DFLASH_LAUNCH(argmax_finalize_kernel, (unsigned)ceil_div(rows, 8), 256, stream)(
        scratch_val, scratch_idx, rows, splits, argmax);
  }
  return launch_accept(drafts, draft_lens, row_offsets, num_requests, k_max, argmax, rows, accepted, committed,
                       num_committed, stream);
}

cudaError_t launch_sampling_verify(const void* logits, DType dtype, int64_t rows, int64_t vocab, int64_t row_stride,
                                   const int64_t* drafts, const int64_t* draft_lens, const int64_t* row_offsets,
                                   int64_t num_requests, int64_t k_max, const int64_t* starts, const int64_t* seeds,
                                   const double* temperature, const int64_t* top_k, const double* top_p,
                                   int64_t* sampled, int64_t* accepted, int64_t* committed, int64_t* num_committed,
                                   cudaStream_t stream) {
  if (rows > 0) {
    switch (dtype) {
      case kF16:
        DFLASH_LAUNCH(sample_kernel<__half>, (unsigned)rows, kSampleThreads, stream)(
            static_cast<const __half*>(logits), row_stride, vocab, draft_lens, row_offsets, num_requests, starts,
            seeds, temperature, top_k, top_p, sampled);
        break;
      case kBF16:
        DFLASH_LAUNCH(sample_kernel<__nv_bfloat16>, (unsigned)rows, kSampleThreads, stream)(
            static_cast<const __nv_bfloat16*>(logits), row_stride, vocab, draft_lens, row_offsets, num_requests,
            starts, seeds, temperature, top_k, top_p, sampled);
        break;
      case kF32:
        DFLASH_LAUNCH(sample_kernel<float>, (unsigned)rows, kSampleThreads, stream)(
            static_cast<const float*>(logits), row_stride, vocab, draft_lens, row_offsets, num_requests, starts,
            seeds, temperature, top_k, top_p, sampled);
        break;
      default:
        return cudaErrorInvalidValue;  // float64 logits: the glue refuses them
    }
  }
  return launch_accept(drafts, draft_lens, row_offsets, num_requests, k_max, sampled, rows, accepted, committed,
                       num_committed, stream);
}

cudaError_t launch_context_append(const void* k, const void* v, const void* k_norm_weight, const void* cos,
                                  const void* sin, const int64_t* slots, void* k_cache, void* v_cache,
                                  int64_t tokens, int64_t kv_heads, int64_t head_dim, int64_t num_slots,
                                  AppendDTypes dt, float eps, cudaStream_t stream) {
  const int64_t items = tokens * kv_heads;
  if (items > 0)
    DFLASH_LAUNCH(context_append_kernel, (unsigned)ceil_div(items, kAppendThreads / 32), kAppendThreads, stream)(
        k, v, k_norm_weight, cos, sin, slots, k_cache, v_cache, tokens, kv_heads, head_dim, num_slots, dt, eps);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace dflash
