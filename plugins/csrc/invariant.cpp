// Batch-invariant CPU kernels (linear, RMSNorm, SiLU*mul, paged attention) registered as torch ops
// dflash_trt::bi_*.
//
// Invariance contract: every output element is produced by one fixed sequence of IEEE fp32 operations that
// depends only on the inputs of that element (its row of x, the weights, its visible keys), never on how many
// rows share the call, where the row sits, how the work is split over threads, or which SIMD path runs.
//
//   linear    y[m,n] = tree_c( fma-chain_{k in chunk c, ascending}(x[m,k] * w[n,k]) ) (+ bias[n])
//             chunks: K split into k_splits equal contiguous ranges; tree = pairwise levels
//             ((c0+c1)+(c2+c3))+((c4+c5)+(c6+c7)). Each fma chain starts from +0.
//   W8A16     (int8 codes q or e4m3 bytes with per-column scales) the chains run over the codes' exact values
//             (q, or e4m3 / 256) and each chunk's partial is scaled once before the tree:
//             partial_c = fma-chain_{k in c}(x[m,k] * code[n,k]) * ws[n] (ws = scale, e4m3: scale * 256)
//   BF16 pairs (int16 panels of bf16 k-pairs) x is rounded to bf16 (nearest even) and the chain runs over the
//             chunk's k-pairs, the odd k before the even one: acc = fma(x[2q], w[2q], fma(x[2q+1], w[2q+1],
//             acc)), which is what AVX512-BF16's vdpbf16ps computes (the products of bf16 numbers are exact in
//             fp32; it flushes subnormal inputs and results, which the AVX-512 path's fmas do too and the
//             AVX2 / scalar paths do not, so the ISAs agree for every number above 2^-126; on AVX-512 the
//             fmas and vdpbf16ps give the same bits and either may run a tile: set_pairs).
//   W8A8      (int32 weight panels of int8 k-quads) x is quantised per row and chunk in shared code:
//             a = max|x| over the chunk, xq = clamp(rint(x * (127/a)), +-127), sx = a / 127; the chunk's
//             integer dot product sum_k xq*w is exact whatever the instruction (AMX tdpbusd, VNNI, pmaddwd,
//             scalar), then
//             partial_c = (float(isum) * sx) * w_scale[n], and the tree and bias as above.
//   rms_norm  ss = hsum16(lane l: fma-chain over h = l, l+16, ...(x_h*x_h)); r = 1/sqrtf(ss/H + eps);
//             y = w * to_xdtype(x * r)   (HF casting; bf16 rounding is round-to-nearest-even)
//   silu_mul  y = to_dtype(g / (1 + exp(-g))) * u, one vector formula for every element (masked tails)
//   attention score_j = hsum16(lane l: fma-chain over d = l, l+16, ...(q_d*k_jd)) * scale; with bf16 q and K
//             and D of 64/128/256/512, hsum16(lane l: chain over 32-dim slices s of (q*k)_{32s+2l+1} then
//             (q*k)_{32s+2l}) * scale (exact bf16 products: vdpbf16ps' steps);
//             m = max_j; p_j = exp(score_j - m); l = hsum16(lane l: sum of p_j, j = l, l+16, ... ascending);
//             o = (fma-chain over j ascending (p_j * v_j)) / l
//   hsum16(v) = (r2[0]+r2[1]) with r8[i]=v[i]+v[i+8], r4[i]=r8[i]+r8[i+4], r2[i]=r4[i]+r4[i+2]
//   exp: Cody-Waite range reduction + degree-6 polynomial (Cephes expf), the same ops on every path.
//
// The kernel body (below the #else) is compiled three times through a self-include: AVX-512, AVX2+FMA and
// portable scalar. They implement the same 16-lane algorithm op for op, so their results are bitwise equal;
// the best one the CPU supports is chosen at load time (DFLASH_BI_ISA=amx|avx512|avx2|scalar overrides).
// "amx" is the AVX-512 pass with W8A8 sums on AMX-INT8 tiles, exact like every other path.
//
// OpenMP splits work over output tiles (linear: panels of 32 columns and row ranges; norm/silu: rows;
// attention: items of up to 16 queries, the heads of one KV group over a block of rows); a reduction is never
// split across threads, and the workers run with the caller's MXCSR (flush-denormal / rounding mode).

#ifndef BI_KERNEL_PASS

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <omp.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "argmax_row.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace bi {

// F8: float8_e4m3fn weights, I8: int8 weights with a per-column scale (linear only)
// I8Q: int8 weights in k-quads (int32 [P][K/4][32], byte b of a lane = k 4q+b) for integer dot products (W8A8)
// BF16P: bf16 weights in k-pairs (int16 [P][K][32] = u32 [P][K/2][32], lane = lo: k 2q, hi: k 2q+1) for
// bf16 x bf16 dot products
enum DType : int { F32 = 0, BF16 = 1, F8 = 2, I8 = 3, I8Q = 4, BF16P = 5 };

struct LinParams {
  const float* x;   // [M, ldx] fp32, or null when xh holds the rows
  const uint16_t* xh;  // BF16P: [M, ldx] bf16 rows as given (already what the k-pair kernels multiply); I8Q:
                       // bf16 rows quantize_rows reads (widening is exact)
  int64_t ldx;
  int64_t xk0;      // column of x where the first chunk starts
  const void* w;    // packed panels: f32 [P][K][32], bf16 pairs [P][K][16] (u32 = hi:col j, lo:col j+16)
                    // or e4m3 / int8 bytes [P][K][32]
  int wt;
  const float* ws;  // F8: per-column scale * 256 [P * 32] (code value e4m3/256, exact), I8: per-column scale
                    // [P * 32] (code value q); a chunk's partial = (its chain over the code values) * ws
  int64_t K;        // packed K (panel length)
  int64_t wk0;      // k of the packed weights where the first chunk starts
  int64_t N;        // true output columns
  int64_t chunk_len;
  int nchunks;      // power of two <= 8
  const float* bias;  // [N] fp32 or null
  void* y;
  int yt;
  int64_t ldy;
  // I8Q only: x quantised per row and chunk (u8 = code + 128, [M][ldq], the chunks' columns from xk0) and the
  // per-row, per-chunk scales [M][nchunks]
  const uint8_t* xq;
  int64_t ldq;
  const float* xs;
  // I8Q: the same codes as signed bytes (code - 128, [M][ldq]), which the AVX-512 pass's tiles and VNNI kernel
  // multiply; its quantize_rows writes them beside xq
  uint8_t* xsq;
  bool quantize;  // I8Q: run_linear quantises x first, each thread into its own xq / xs / xsq (quantized_here)
};

struct NormParams {
  const void* x; int xt; int64_t ldx;
  const void* r; int64_t ldr;       // residual (same dtype as x) or null
  void* ro; int64_t ldro;           // x + residual written here (x dtype) when r != null
  const void* w; int wt;
  void* y; int yt; int64_t ldy;
  int64_t H;
  float eps;
};

struct SiluParams {
  const void* g; int64_t ldg;
  const void* u; int64_t ldu;
  void* y; int64_t ldy;
  int t;  // dtype of all three
  int64_t C;
};

struct AttnParams {
  const void* q;       // [T, H, D] contiguous, qt's dtype (bf16 widens exactly as it loads)
  int qt;
  int64_t T, H, KVH, D;
  const void* kc;      // [S, KVH, D]
  const void* vc;
  int ct;
  const int64_t* slots;
  const int64_t* q_start;
  const int64_t* q_len;
  const int64_t* kv_len;
  const int64_t* kv_off;
  const int32_t* items;  // 5 per item: sequence, first head, heads, first row, end row (rows local to it)
  int64_t max_kv;
  float scale;
  bool causal;
  void* out;           // [T, H, D]
  int ot;
};

struct Kernels {
  const char* name;
  void (*linear_tile)(const LinParams&, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
  void (*norm_rows)(const NormParams&, int64_t r0, int64_t r1);
  void (*silu_rows)(const SiluParams&, int64_t r0, int64_t r1);
  void (*attn_items)(const AttnParams&, int64_t i0, int64_t i1, float* scratch);
  void (*selftest_reduce)(const float* a, float* out);  // out[j] = hsum16(a[16j..16j+15]) via reduce16
  // W8A8: x's chunks per row as codes + 128 (q [M][chunks * chunk_len]) and scales (s [M][chunks])
  void (*quantize_rows)(const LinParams&, int64_t M, uint8_t* q, float* s);
  // the greedy head screen's passes. approx: a[m][v] += sum_j xo[m][j] wo[j][v] in fp32, in any order (the
  // screen's bound covers every order), for rows m < M and columns [v0, v1) of V, with each row's largest a
  // and |a| over those columns in mx[m], mabs[m]; wo float32, or bfloat16 where wbf. at_least: the indices of
  // a >= t, ascending, appended to out
  void (*approx)(const float* xo, int64_t M, int64_t n_out, const void* wo, bool wbf, int64_t V, int64_t v0,
                 int64_t v1, float* a, float* mx, float* mabs);
  void (*at_least)(const float* a, int64_t n, float t, std::vector<int64_t>& out);
  // 1 / sum_j exp(a_j - m): the softmax probability of a maximum m of the n floats
  float (*row_top_probability)(const void* a, int64_t n, bool bf, float m);
};

// the AVX2 W8A8 tile, for AVX-512 CPUs without VNNI
typedef void (*LinTileFn)(const LinParams&, int64_t, int64_t, int64_t, int64_t);
extern LinTileFn g_linq_avx2;
bool amx_active();  // the "amx" path runs: W8A8 integer sums on AMX-INT8 tiles
bool amx_bf16_active();  // and bf16 k-pair panels on AMX-BF16 tiles
bool pairs_on_fmas();  // bf16 k-pairs of several rows (and attention's pairs) on two fmas where vdpbf16ps is slow
bool pairs_row_on_fmas();  // and of one row

}  // namespace bi

// ---------------------------------------------------------------------------------------------------------
// three compilations of the kernel body

#define BI_KERNEL_PASS 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
namespace bi_avx512 {
#include __FILE__
}
#pragma GCC pop_options
#undef BI_KERNEL_PASS

#define BI_KERNEL_PASS 2
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace bi_avx2 {
#include __FILE__
}
#pragma GCC pop_options
#undef BI_KERNEL_PASS

#define BI_KERNEL_PASS 3
namespace bi_scalar {
#include __FILE__
}
#undef BI_KERNEL_PASS

// ---------------------------------------------------------------------------------------------------------
// dispatch + torch glue

namespace bi {

LinTileFn g_linq_avx2 = &bi_avx2::linear_tile_q;
static const Kernels* g_kernels = nullptr;
static const Kernels kAmxTable = [] {
  Kernels t = bi_avx512::kTable;
  t.name = "amx";
  return t;
}();
bool amx_active() { return g_kernels == &kAmxTable; }
bool amx_bf16_active() {
  static const bool has = [] {  // AMX-BF16 (CPUID 7.0 EDX bit 22) and vdpbf16ps for a chunk's last pairs
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u) && __builtin_cpu_supports("avx512bf16");
  }();
  return has && amx_active();
}

// Instructions per second of a loop of independent vdpbf16ps (dp) or vfmadd231ps, the best of five short runs
__attribute__((target("avx512f,avx512bf16"))) static double issue_rate(bool dp) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const __m512 x = _mm512_castsi512_ps(_mm512_set1_epi32(0x3f803f80)), y = x;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) {
#define BI_ISSUE(a)                                                   \
  if (dp) asm volatile("vdpbf16ps %2, %1, %0" : "+v"(a) : "v"(x), "v"(y)); \
  else asm volatile("vfmadd231ps %2, %1, %0" : "+v"(a) : "v"(x), "v"(y));
      BI_ISSUE(a0) BI_ISSUE(a1) BI_ISSUE(a2) BI_ISSUE(a3) BI_ISSUE(a4) BI_ISSUE(a5) BI_ISSUE(a6) BI_ISSUE(a7)
#undef BI_ISSUE
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 16000.0 / best;
}

// How bf16 k-pairs multiply on the AVX-512 path: kPairsDp (vdpbf16ps), kPairsFma (two fmas), kPairsMixed
// (vdpbf16ps for one row, whose tile streams its weights either way on fewer instructions; fmas for more rows and
// attention). All give the same bits (the fmas run with denormals flushed, as vdpbf16ps treats them), so the
// choice is speed alone. A k-pair of a row takes one vdpbf16ps or two fmas plus the widening of the weights, an
// 8-row tile's share of which makes it about 2.5 fmas: where vdpbf16ps issues at under 1 / 2.5 of the fma rate
// (Intel cores, where it is several uops), fmas pay from two rows on.
enum { kPairsUnset = -1, kPairsDp = 0, kPairsFma = 1, kPairsMixed = 2 };
static int g_pairs_mode = kPairsUnset;
static const char* const kPairsNames[] = {"dp", "fma", "mixed"};
static int pick_pairs_mode(const std::string& want) {
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512f")) return kPairsFma;
  for (int m = kPairsDp; m <= kPairsMixed; ++m)
    if (want == kPairsNames[m]) return m;
  TORCH_CHECK(want.empty() || want == "auto", "bi: unknown k-pair kernel '", want, "' (dp|fma|mixed|auto)");
  return issue_rate(false) > 2.5 * issue_rate(true) ? kPairsMixed : kPairsDp;
}
static int pairs_mode() {
  if (g_pairs_mode == kPairsUnset) {
    const char* e = std::getenv("DFLASH_BI_PAIRS");
    g_pairs_mode = pick_pairs_mode(e ? std::string(e) : std::string());
  }
  return g_pairs_mode;
}
bool pairs_on_fmas() { return pairs_mode() != kPairsDp; }
bool pairs_row_on_fmas() { return pairs_mode() == kPairsFma; }
static std::string bi_set_pairs(const std::string& mode) {
  if (!mode.empty()) g_pairs_mode = pick_pairs_mode(mode);
  return kPairsNames[pairs_mode()];
}

// AMX-TILE and AMX-INT8 in CPUID, and the kernel's permission to use tile data (Linux: asked once per process)
static bool amx_int8_ready() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;
    if (!__builtin_cpu_supports("avx512vnni")) return false;
    const long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ok;
}

static const Kernels* pick_kernels(const std::string& want) {
  __builtin_cpu_init();
  bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (want == "amx") {
    TORCH_CHECK(has512 && amx_int8_ready(), "bi: this CPU lacks AMX-INT8 (or the kernel refused tile data)");
    return &kAmxTable;
  }
  if (want == "avx512") {
    TORCH_CHECK(has512, "bi: this CPU lacks AVX-512 (F/BW/VL/DQ)");
    return &bi_avx512::kTable;
  }
  if (want == "avx2") {
    TORCH_CHECK(has2, "bi: this CPU lacks AVX2/FMA");
    return &bi_avx2::kTable;
  }
  if (want == "scalar") return &bi_scalar::kTable;
  TORCH_CHECK(want.empty() || want == "auto", "bi: unknown ISA '", want, "' (amx|avx512|avx2|scalar|auto)");
  if (has512 && amx_int8_ready()) return &kAmxTable;
  if (has512) return &bi_avx512::kTable;
  if (has2) return &bi_avx2::kTable;
  return &bi_scalar::kTable;
}

static const Kernels& K() {
  if (!g_kernels) {
    const char* e = std::getenv("DFLASH_BI_ISA");
    g_kernels = pick_kernels(e ? std::string(e) : std::string());
  }
  return *g_kernels;
}

static int dtype_code(const at::Tensor& t, const char* what) {
  if (t.scalar_type() == at::kFloat) return F32;
  if (t.scalar_type() == at::kBFloat16) return BF16;
  TORCH_CHECK(false, "bi: ", what, " must be float32 or bfloat16, got ", t.scalar_type());
}

static int nthreads() { return std::max(1, at::get_num_threads()); }

// Worker threads run with the caller's MXCSR (flush-to-zero / denormals-are-zero / rounding), so a thread
// that torch.set_flush_denormal never reached cannot compute a row differently.
struct CsrScope {
  unsigned saved;
  explicit CsrScope(unsigned want) : saved(_mm_getcsr()) { _mm_setcsr(want); }
  ~CsrScope() { _mm_setcsr(saved); }
};

static void balanced(int64_t n, int parts, int idx, int64_t& b, int64_t& e) {
  b = n * idx / parts;
  e = n * (idx + 1) / parts;
}

// ---- linear ----------------------------------------------------------------------------------------------

static LinParams quantized_here(const LinParams& p, int64_t M);

// work(pt, tid) for each tid < T: on the calling thread where T is 1, else on an OpenMP team whose threads take
// the tids in turn (the runtime may give fewer threads than asked: nested regions, dynamic teams, a second
// OpenMP runtime in the process; a tid's result does not depend on its thread). pt is p with its rows quantised
// into the running thread's own buffers (W8A8): a tile reads all rows' codes, one broadcast per row and quad in
// step with its dot products, and codes another core wrote would reach it line by line from that core's cache,
// which at a verify block's rows costs more than quantising the rows twice; nor is a barrier left.
// The threads for a linear of M rows and P panels: one below ~1e5 multiply-adds, where the fork/join costs more
// than a second thread saves; above it a decode row's weights stream faster on all (cold 576 x 576 at one row:
// bf16 35.6 -> 27.1 us, w8a8 21.8 -> 17.8 us)
static int linear_threads(const LinParams& p, int64_t M, int64_t P) {
  return double(M) * double(P * 32) * double(p.chunk_len * p.nchunks) < 1.0e5 ? 1 : nthreads();
}

// rows(p, idx, team) gives p with the x rows the running thread (idx of team) reads: p itself (same_rows), or rows
// the thread made itself (bi_norm_linear).
template <class F, class R>
static void run_tiles(const LinParams& p, int64_t M, int T, F&& work, R&& rows) {
  if (T == 1) {
    work(quantized_here(rows(p, 0, 1), M), 0);
    return;
  }
  const unsigned csr = _mm_getcsr();
#pragma omp parallel num_threads(T)
  {
    CsrScope cs(csr);
    const int team = omp_get_num_threads(), idx = omp_get_thread_num();
    const LinParams pt = quantized_here(rows(p, idx, team), M);
    for (int tid = idx; tid < T; tid += team) work(pt, tid);
  }
}
static const auto same_rows = [](const LinParams& p, int, int) { return p; };

template <class R>
static void run_linear(const LinParams& p, int64_t M, R&& rows) {
  const Kernels& k = K();
  const int64_t P = (p.N + 31) / 32;
  if (M == 0 || P == 0) return;
  if (p.chunk_len == 0) {  // K == 0: empty sums
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < p.N; ++n) {
        const float v = p.bias ? p.bias[n] : 0.0f;
        if (p.yt == BF16) {
          at::BFloat16 b(v);
          ((at::BFloat16*)p.y)[m * p.ldy + n] = b;
        } else {
          ((float*)p.y)[m * p.ldy + n] = v;
        }
      }
    return;
  }
  int T = linear_threads(p, M, P);
  int tn = (int)std::min<int64_t>(T, P);
  int tm = std::max(1, T / tn);
  if (tm > M) tm = (int)M;
  T = tn * tm;
  run_tiles(p, M, T, [&](const LinParams& pt, int tid) {
    int64_t m0, m1, p0, p1;
    balanced(M, tm, tid % tm, m0, m1);
    balanced(P, tn, tid / tm, p0, p1);
    if (m1 > m0 && p1 > p0) k.linear_tile(pt, m0, m1, p0, p1);
  }, rows);
}
static void run_linear(const LinParams& p, int64_t M) { run_linear(p, M, same_rows); }

// x as fp32 rows for the kernels: a float x as it is (made contiguous only where its rows are not), a bf16 x
// widened into a per-thread buffer (exact: bf16 -> fp32 is a shift), without an ATen allocation per call
static at::Tensor x_as_f32(const at::Tensor& x);
struct XRows {
  const float* x;
  const uint16_t* xh;  // or the bf16 rows as given (BF16P)
  int64_t ldx;
  at::Tensor keep;
};
// M bf16 rows of K (ld apart) as the kernels of a weight of kind wt read them: as they are for BF16P panels
// (rounding a bf16 to bf16 changes nothing) and for I8Q (the quantiser widens as it reads), else widened into buf
static XRows bf16_rows(const uint16_t* src, int64_t M, int64_t K, int64_t ld, int wt, std::vector<float>& buf) {
  if (wt == BF16P || wt == I8Q) return {nullptr, src, ld, at::Tensor()};
  if ((int64_t)buf.size() < M * K) buf.resize(M * K);
  // through local pointers: indexing a thread_local vector in the loop re-reads its address every element
  uint32_t* dst = (uint32_t*)buf.data();
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* s = src + m * ld;
    uint32_t* d = dst + m * K;
    for (int64_t k = 0; k < K; ++k) d[k] = (uint32_t)s[k] << 16;
  }
  return {buf.data(), nullptr, K, at::Tensor()};
}
// x's rows for a weight of kind wt
static XRows x_rows(const at::Tensor& x, int wt) {
  const int64_t M = x.size(0), K = x.size(1);
  if (x.scalar_type() == at::kBFloat16 && x.stride(1) == 1) {
    thread_local std::vector<float> buf;
    return bf16_rows((const uint16_t*)x.data_ptr(), M, K, M > 1 ? x.stride(0) : K, wt, buf);
  }
  at::Tensor xf = x_as_f32(x);
  return {xf.data_ptr<float>(), nullptr, M > 1 ? xf.stride(0) : K, xf};
}

static at::Tensor x_as_f32(const at::Tensor& x) {
  at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  if (xf.stride(1) != 1 || (xf.size(0) > 1 && xf.stride(0) < xf.size(1))) xf = xf.contiguous();
  return xf;
}

static int weight_code(const at::Tensor& packed) {
  if (packed.scalar_type() == at::kByte) return F8;
  if (packed.scalar_type() == at::kChar) return I8;
  if (packed.scalar_type() == at::kInt) return I8Q;
  if (packed.scalar_type() == at::kShort) return BF16P;
  return dtype_code(packed, "packed weight");
}

// K of a packed weight: its panel length, four k per int32 for W8A8 k-quads
static int64_t packed_k(const at::Tensor& packed) {
  return weight_code(packed) == I8Q ? packed.size(1) * 4 : packed.size(1);
}

// W8A8: x is quantised per row and chunk where run_linear runs its tiles (quantized_here)
static void quantize_x(LinParams& p) {
  const int64_t cl = p.chunk_len;
  TORCH_CHECK(cl % 4 == 0, "bi_linear: a W8A8 weight needs chunks of a multiple of 4 columns, got ", cl);
  p.ldq = cl * p.nchunks;
  p.quantize = true;
}

// p with its M rows quantised into the calling thread's own buffers (reused: no allocation per decode step) by
// the kernel table's quantize_rows, whose every ISA's version gives the same codes and scales; p as it is where
// it does not quantise
static LinParams quantized_here(const LinParams& p, int64_t M) {
  if (!p.quantize) return p;
  thread_local std::vector<uint8_t> q, f;
  thread_local std::vector<float> s;
  q.resize((size_t)(M * p.ldq));
  f.resize((size_t)(M * p.ldq));
  s.resize((size_t)(M * p.nchunks));
  LinParams pt = p;
  pt.xq = q.data();
  pt.xsq = f.data();
  pt.xs = s.data();
  K().quantize_rows(pt, M, q.data(), s.data());
  return pt;
}

// F8 / I8 panels need their per-column scales: returns a pointer to them, or null for f32/bf16
static const float* weight_scale(const at::Tensor& packed, const c10::optional<at::Tensor>& wscale) {
  const int wt = weight_code(packed);
  if (wt != F8 && wt != I8 && wt != I8Q) return nullptr;
  TORCH_CHECK(wscale.has_value() && wscale->defined() && wscale->scalar_type() == at::kFloat &&
                  wscale->is_contiguous() && wscale->numel() == packed.size(0) * 32,
              "bi: an ", wt == F8 ? "fp8" : (wt == I8 ? "int8" : "int8 W8A8"),
              " packed weight needs its float32 [P * 32] scale (use ",
              wt == F8 ? "pack_linear_fp8" : (wt == I8 ? "pack_linear_int8" : "pack_linear_w8a8"), ")");
  return wscale->data_ptr<float>();
}

static void check_packed(const at::Tensor& packed, int64_t n) {
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 32 && packed.is_contiguous(),
              "bi: packed weight must be a contiguous [P, K, 32] tensor (use pack_linear)");
  weight_code(packed);
  TORCH_CHECK(n > 0 && (n + 31) / 32 == packed.size(0), "bi: n=", n, " does not match packed panels ",
              packed.size(0));
}

// y = x W^T + bias's parameters for x of M rows of Kx columns in xo's dtype, with bi_linear's checks (op: the
// name in their messages), x's rows not set; bf keeps the fp32 bias alive, y is made here
static LinParams linear_params_rows_unset(const char* op, int64_t M, int64_t Kx, at::TensorOptions xo,
                                          const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias,
                                          int64_t k_splits, const c10::optional<at::Tensor>& wscale, at::Tensor& bf,
                                          at::Tensor& y) {
  TORCH_CHECK(packed.device().is_cpu(), op, ": CPU tensors only");
  check_packed(packed, n);
  const int64_t Kp = packed_k(packed);
  TORCH_CHECK(Kx == Kp, op, ": x has K=", Kx, " but the weight has K=", Kp);
  TORCH_CHECK(k_splits == 1 || k_splits == 2 || k_splits == 4 || k_splits == 8,
              op, ": k_splits must be 1, 2, 4 or 8");
  TORCH_CHECK(Kp % k_splits == 0, op, ": K=", Kp, " not divisible by k_splits=", k_splits);
  TORCH_CHECK(xo.dtype() == at::kFloat || xo.dtype() == at::kBFloat16, "bi: x must be float32 or bfloat16, got ",
              xo.dtype());
  const int yt = xo.dtype() == at::kFloat ? F32 : BF16;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, op, ": bias must have n elements");
    bf = bias->to(at::kFloat).contiguous();
  }
  y = at::empty({M, n}, xo);
  LinParams p{};
  p.xk0 = 0;
  p.w = packed.data_ptr();
  p.wt = weight_code(packed);
  p.ws = weight_scale(packed, wscale);
  p.K = Kp;
  p.wk0 = 0;
  p.N = n;
  p.chunk_len = Kp / k_splits;
  p.nchunks = (int)k_splits;
  TORCH_CHECK(p.wt != BF16P || p.chunk_len % 2 == 0, op, ": bf16 k-pair panels need chunks of an even "
              "number of columns, got ", p.chunk_len, " (pack with pack_linear(w, torch.bfloat16) instead)");
  p.bias = bf.defined() ? bf.data_ptr<float>() : nullptr;
  p.y = y.data_ptr();
  p.yt = yt;
  p.ldy = n;
  if (p.wt == I8Q) quantize_x(p);
  return p;
}

// linear_params_rows_unset for x itself, its rows set; xr keeps them alive
static LinParams linear_params(const char* op, const at::Tensor& x, const at::Tensor& packed, int64_t n,
                               const c10::optional<at::Tensor>& bias, int64_t k_splits,
                               const c10::optional<at::Tensor>& wscale, XRows& xr, at::Tensor& bf, at::Tensor& y) {
  TORCH_CHECK(x.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(x.dim() == 2, op, ": x must be [M, K]");
  LinParams p = linear_params_rows_unset(op, x.size(0), x.size(1), x.options(), packed, n, bias, k_splits, wscale,
                                         bf, y);
  xr = x_rows(x, p.wt);
  p.x = xr.x;
  p.xh = xr.xh;
  p.ldx = xr.ldx;
  return p;
}

static at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                            const c10::optional<at::Tensor>& bias, int64_t k_splits,
                            const c10::optional<at::Tensor>& wscale) {
  XRows xr;
  at::Tensor bf, y;
  const LinParams p = linear_params("bi_linear", x, packed, n, bias, k_splits, wscale, xr, bf, y);
  run_linear(p, x.size(0));
  return y;
}

// A fused gate|up weight (gate in columns [0, inter), up from up_col, a panel boundary past gate's last panel)
// and then SiLU(gate) * up: each thread computes the gate panels of its share of the columns, the up panels of
// the same columns and their SiLU * up, so the gate and up values stay in the core that made them and the SiLU
// needs no fork/join of its own. Every tile and every element is what bi_linear and bi_silu_mul compute.
template <class R>
static void run_linear_silu(const LinParams& p, int64_t M, int64_t inter, int64_t up_col, void* act, R&& rows) {
  const Kernels& k = K();
  const int64_t Pg = (inter + 31) / 32, Pu = up_col / 32;
  const int64_t es = p.yt == BF16 ? 2 : 4;
  SiluParams s{};
  s.g = p.y; s.ldg = p.ldy;
  s.u = (const char*)p.y + up_col * es; s.ldu = p.ldy;
  s.y = act; s.ldy = inter;
  s.t = p.yt;
  // thread t's columns [c0, c1): its gate panels [g0, g1), the up panels of the same columns, then the SiLU
  auto share = [&](const LinParams& pt, int64_t g0, int64_t g1) {
    k.linear_tile(pt, 0, M, g0, g1);
    k.linear_tile(pt, 0, M, Pu + g0, Pu + g1);
    const int64_t c0 = g0 * 32, c1 = std::min(g1 * 32, inter);
    SiluParams st = s;
    st.g = (const char*)s.g + c0 * es;
    st.u = (const char*)s.u + c0 * es;
    st.y = (char*)s.y + c0 * es;
    st.C = c1 - c0;
    k.silu_rows(st, 0, M);
  };
  const int T = (int)std::min<int64_t>(linear_threads(p, M, 2 * Pg), Pg);
  run_tiles(p, M, T, [&](const LinParams& pt, int tid) {
    int64_t g0, g1;
    balanced(Pg, T, tid, g0, g1);
    if (g1 > g0) share(pt, g0, g1);
  }, rows);
}

static at::Tensor bi_linear_silu(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t inter,
                                 int64_t up_col, const c10::optional<at::Tensor>& bias, int64_t k_splits,
                                 const c10::optional<at::Tensor>& wscale) {
  TORCH_CHECK(inter > 0 && up_col % 32 == 0 && up_col >= (inter + 31) / 32 * 32 && up_col + inter <= n,
              "bi_linear_silu: gate must be columns [0, inter) and up start at a panel boundary up_col past "
              "gate's panels, within n (got inter ", inter, ", up_col ", up_col, ", n ", n, ")");
  XRows xr;
  at::Tensor bf, y;
  const LinParams p = linear_params("bi_linear_silu", x, packed, n, bias, k_splits, wscale, xr, bf, y);
  TORCH_CHECK(p.chunk_len > 0, "bi_linear_silu: x must have columns");
  at::Tensor act = at::empty({x.size(0), inter}, x.options());
  run_linear_silu(p, x.size(0), inter, up_col, act.data_ptr(), same_rows);
  return act;
}

// linear(rms_norm(x + residual)) (SiLU(gate) * up of it where inter > 0, as bi_linear_silu) and x + residual,
// in one team: each thread norms every row into its own buffers and reads them for its tiles, so the normed rows
// never cross between the cores and the norm needs no fork/join of its own (a row's norm does not depend on who
// computes it, and every tile is what bi_linear computes on bi_rms_norm's output). x + residual is written by
// rows, each thread its share of them, and is empty where there is no residual. The output dtype is the norm's,
// promote(x, weight), as the op-by-op path's linear takes it.
static std::tuple<at::Tensor, at::Tensor> bi_norm_linear(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                         const at::Tensor& weight, double eps,
                                                         const at::Tensor& packed, int64_t n,
                                                         const c10::optional<at::Tensor>& bias, int64_t k_splits,
                                                         const c10::optional<at::Tensor>& wscale, int64_t inter,
                                                         int64_t up_col) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1 && weight.dim() == 1 &&
                  weight.size(0) == x.size(1),
              "bi_norm_linear: x must be CPU [M, H] rows of contiguous columns and weight [H]");
  const int xt = dtype_code(x, "x"), wt = dtype_code(weight, "weight");
  const int yt = xt == BF16 && wt == BF16 ? BF16 : F32;
  const int64_t M = x.size(0), H = x.size(1);
  const at::Tensor w = weight.contiguous();
  NormParams np{};
  np.x = x.data_ptr(); np.xt = xt; np.ldx = M > 1 ? x.stride(0) : H;
  np.w = w.data_ptr(); np.wt = wt;
  np.yt = yt; np.ldy = H;
  np.H = H;
  np.eps = (float)eps;
  at::Tensor x1 = at::empty({0}, x.options());
  if (residual.has_value() && residual->defined()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type() &&
                    residual->stride(1) == 1,
                "bi_norm_linear: residual must match x in shape and dtype, with contiguous columns");
    np.r = residual->data_ptr(); np.ldr = M > 1 ? residual->stride(0) : H;
    x1 = at::empty({M, H}, x.options());
  }
  at::Tensor bf, y;
  LinParams p = linear_params_rows_unset("bi_norm_linear", M, H, x.options().dtype(yt == BF16 ? at::kBFloat16
                                                                                             : at::kFloat),
                                         packed, n, bias, k_splits, wscale, bf, y);
  TORCH_CHECK(inter <= 0 || (up_col % 32 == 0 && up_col >= (inter + 31) / 32 * 32 && up_col + inter <= n),
              "bi_norm_linear: gate must be columns [0, inter) and up start at a panel boundary up_col past "
              "gate's panels, within n (got inter ", inter, ", up_col ", up_col, ", n ", n, ")");
  at::Tensor act = inter > 0 ? at::empty({M, inter}, y.options()) : at::Tensor();
  if (M == 0) return {inter > 0 ? act : y, x1};
  const Kernels& k = K();
  const size_t ye = yt == BF16 ? 2 : 4, xe = xt == BF16 ? 2 : 4;
  char* x1p = x1.numel() ? (char*)x1.data_ptr() : nullptr;
  // the running thread's normed rows (and its x + residual), as x_rows would give the normed tensor's
  auto rows = [&](const LinParams& q, int idx, int team) {
    thread_local std::vector<uint32_t> hb, sb;
    thread_local std::vector<float> wb;
    hb.resize((M * H * ye + 3) / 4);
    NormParams t = np;
    t.y = hb.data();
    if (np.r) {
      sb.resize((M * H * xe + 3) / 4);
      t.ro = sb.data();
      t.ldro = H;
    }
    k.norm_rows(t, 0, M);
    if (np.r) {
      int64_t r0, r1;
      balanced(M, team, idx, r0, r1);
      if (r1 > r0) std::memcpy(x1p + r0 * H * xe, (const char*)sb.data() + r0 * H * xe, (size_t)((r1 - r0) * H * xe));
    }
    const XRows r = yt == BF16 ? bf16_rows((const uint16_t*)hb.data(), M, H, H, q.wt, wb)
                               : XRows{(const float*)hb.data(), nullptr, H, at::Tensor()};
    LinParams o = q;
    o.x = r.x;
    o.xh = r.xh;
    o.ldx = r.ldx;
    return o;
  };
  if (inter <= 0) {
    run_linear(p, M, rows);
    return {y, x1};
  }
  run_linear_silu(p, M, inter, up_col, act.data_ptr(), rows);
  return {act, x1};
}

static at::Tensor bi_linear_partial(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t chunk_begin,
                                    int64_t chunk_end, int64_t k_splits,
                                    const c10::optional<at::Tensor>& wscale) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "bi_linear_partial: CPU tensors only");
  TORCH_CHECK(x.dim() == 2, "bi_linear_partial: x must be [M, K]");
  check_packed(packed, n);
  const int64_t Kp = packed_k(packed);
  TORCH_CHECK(k_splits == 1 || k_splits == 2 || k_splits == 4 || k_splits == 8,
              "bi_linear_partial: k_splits must be 1, 2, 4 or 8");
  TORCH_CHECK(Kp % k_splits == 0, "bi_linear_partial: K=", Kp, " not divisible by k_splits=", k_splits);
  const int64_t cnt = chunk_end - chunk_begin;
  TORCH_CHECK(chunk_begin >= 0 && chunk_end <= k_splits && cnt > 0 && (cnt & (cnt - 1)) == 0 &&
                  chunk_begin % cnt == 0,
              "bi_linear_partial: [chunk_begin, chunk_end) must be a power-of-two count of chunks aligned to "
              "its size");
  const int64_t cl = Kp / k_splits;
  int64_t xk0;
  if (x.size(1) == Kp) {
    xk0 = chunk_begin * cl;
  } else {
    TORCH_CHECK(x.size(1) == cnt * cl, "bi_linear_partial: x must have K=", Kp, " or exactly the ", cnt * cl,
                " columns of the chunks");
    xk0 = 0;
  }
  const XRows xr = x_rows(x, weight_code(packed));
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, n}, x.options().dtype(at::kFloat));
  LinParams p{};
  p.x = xr.x;
  p.xh = xr.xh;
  p.ldx = xr.ldx;
  p.xk0 = xk0;
  p.w = packed.data_ptr();
  p.wt = weight_code(packed);
  p.ws = weight_scale(packed, wscale);
  p.K = Kp;
  p.wk0 = chunk_begin * cl;
  p.N = n;
  p.chunk_len = cl;
  p.nchunks = (int)cnt;
  TORCH_CHECK(p.wt != BF16P || cl % 2 == 0, "bi_linear_partial: bf16 k-pair panels need chunks of an even "
              "number of columns, got ", cl);
  p.bias = nullptr;
  p.y = y.data_ptr();
  p.yt = F32;
  p.ldy = n;
  if (p.wt == I8Q) quantize_x(p);
  run_linear(p, M);
  return y;
}

// ---- rms norm ----------------------------------------------------------------------------------------------

static void run_norm(const NormParams& p, int64_t rows) {
  const Kernels& k = K();
  if (rows == 0) return;
  int T = nthreads();
  // from a few verify rows of a 576-wide model a second thread saves more than the fork/join costs
  if (rows < 2 || rows * p.H < 4096) T = 1;
  T = (int)std::min<int64_t>(T, rows);
  if (T == 1) {
    k.norm_rows(p, 0, rows);
    return;
  }
  const unsigned csr = _mm_getcsr();
#pragma omp parallel num_threads(T)
  {
    CsrScope cs(csr);
    int64_t r0, r1;
    balanced(rows, omp_get_num_threads(), omp_get_thread_num(), r0, r1);
    if (r1 > r0) k.norm_rows(p, r0, r1);
  }
}

static at::Tensor rows2d(const at::Tensor& x) {
  at::Tensor c = x.stride(-1) == 1 ? x : x.contiguous();
  if (c.dim() == 2) return c;
  c = c.contiguous();
  return c.view({-1, c.size(-1)});
}

static std::vector<at::Tensor> norm_impl(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                         const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu(), "bi_rms_norm: CPU tensors only");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              "bi_rms_norm: weight must be [H] with H = x.size(-1)");
  int xt = dtype_code(x, "x");
  int wt = dtype_code(weight, "weight");
  at::ScalarType yst = at::promote_types(x.scalar_type(), weight.scalar_type());
  at::Tensor x2 = rows2d(x.dim() == 1 ? x.view({1, -1}) : x);
  at::Tensor w = weight.contiguous();
  const int64_t rows = x2.size(0), H = x2.size(1);
  at::Tensor y = at::empty({rows, H}, x.options().dtype(yst));
  NormParams p{};
  p.x = x2.data_ptr(); p.xt = xt; p.ldx = rows > 1 ? x2.stride(0) : H;
  at::Tensor r2, ro;
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
                "bi_add_rms_norm: residual must match x in shape and dtype");
    r2 = rows2d(residual->dim() == 1 ? residual->view({1, -1}) : *residual);
    ro = at::empty({rows, H}, x.options());
    p.r = r2.data_ptr(); p.ldr = rows > 1 ? r2.stride(0) : H;
    p.ro = ro.data_ptr(); p.ldro = H;
  }
  p.w = w.data_ptr(); p.wt = wt;
  p.y = y.data_ptr(); p.yt = dtype_code(y, "out"); p.ldy = H;
  p.H = H;
  p.eps = (float)eps;
  run_norm(p, rows);
  std::vector<at::Tensor> out{y.view(x.sizes())};
  if (residual.has_value()) out.push_back(ro.view(x.sizes()));
  return out;
}

static at::Tensor bi_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return norm_impl(x, c10::nullopt, weight, eps)[0];
}

static std::tuple<at::Tensor, at::Tensor> bi_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                          const at::Tensor& weight, double eps) {
  auto v = norm_impl(x, residual, weight, eps);
  return {v[0], v[1]};
}

// ---- silu * mul ------------------------------------------------------------------------------------------

static at::Tensor bi_silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.device().is_cpu(), "bi_silu_mul: CPU tensors only");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "bi_silu_mul: gate and up must match in shape and dtype");
  int t = dtype_code(gate, "gate");
  at::Tensor g2 = rows2d(gate.dim() == 1 ? gate.view({1, -1}) : gate);
  at::Tensor u2 = rows2d(up.dim() == 1 ? up.view({1, -1}) : up);
  const int64_t rows = g2.size(0), C = g2.size(1);
  at::Tensor y = at::empty({rows, C}, gate.options());
  SiluParams p{};
  p.g = g2.data_ptr(); p.ldg = rows > 1 ? g2.stride(0) : C;
  p.u = u2.data_ptr(); p.ldu = rows > 1 ? u2.stride(0) : C;
  p.y = y.data_ptr(); p.ldy = C;
  p.t = t;
  p.C = C;
  const Kernels& k = K();
  if (rows > 0) {
    int T = nthreads();
    // from ~4 verify rows of a 1,536-wide MLP the exp work outweighs a fork/join
    if (rows * C < 4096) T = 1;
    T = (int)std::min<int64_t>(T, rows);
    if (T == 1) {
      k.silu_rows(p, 0, rows);
    } else {
      const unsigned csr = _mm_getcsr();
#pragma omp parallel num_threads(T)
      {
        CsrScope cs(csr);
        int64_t r0, r1;
        balanced(rows, omp_get_num_threads(), omp_get_thread_num(), r0, r1);
        if (r1 > r0) k.silu_rows(p, r0, r1);
      }
    }
  }
  return y.view(gate.sizes());
}

// ---- paged attention -------------------------------------------------------------------------------------

static at::Tensor bi_paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                     const at::Tensor& q_start, const at::Tensor& q_len, const at::Tensor& kv_len,
                                     const at::Tensor& kv_slots, const at::Tensor& kv_offsets, double scale,
                                     bool causal) {
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "bi_paged_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3, "bi_paged_attention: q must be [T, H, D]");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(-2);
  TORCH_CHECK(k_cache.size(-1) == D && v_cache.sizes() == k_cache.sizes(),
              "bi_paged_attention: caches must be [S, KVH, D] (or [blocks, block_size, KVH, D]) with q's D");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "bi_paged_attention: k/v caches differ in dtype");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "bi_paged_attention: H must be a multiple of KVH");
  TORCH_CHECK(D > 0 && D <= 512, "bi_paged_attention: head dim must be in 1..512");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "bi_paged_attention: caches must be contiguous");
  int ct = dtype_code(k_cache, "k_cache");
  int ot = dtype_code(q, "q");
  const at::Tensor qc = q.contiguous();
  auto as64 = [](const at::Tensor& t) { return t.to(at::kLong).contiguous(); };
  at::Tensor qs = as64(q_start), ql = as64(q_len), kl = as64(kv_len), ko = as64(kv_offsets), sl = as64(kv_slots);
  const int64_t B = qs.numel();
  TORCH_CHECK(ql.numel() == B && kl.numel() == B && ko.numel() == B,
              "bi_paged_attention: q_start, q_len, kv_len and kv_offsets must have one entry per sequence");
  const int64_t* qsp = qs.data_ptr<int64_t>();
  const int64_t* qlp = ql.data_ptr<int64_t>();
  const int64_t* klp = kl.data_ptr<int64_t>();
  const int64_t* kop = ko.data_ptr<int64_t>();
  const int64_t nslots = sl.numel();
  const int64_t S = k_cache.numel() / (KVH * D);
  int64_t max_kv = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(qlp[b] >= 0 && klp[b] >= qlp[b] && qsp[b] >= 0 && qsp[b] + qlp[b] <= T && kop[b] >= 0 &&
                    kop[b] + klp[b] <= nslots,
                "bi_paged_attention: bad sequence ", b, " (q_start ", qsp[b], ", q_len ", qlp[b], ", kv_len ",
                klp[b], ", kv_offset ", kop[b], ")");
    max_kv = std::max(max_kv, klp[b]);
  }
  {
    const int64_t* s = sl.data_ptr<int64_t>();
    for (int64_t i = 0; i < nslots; ++i)
      TORCH_CHECK(s[i] >= 0 && s[i] < S, "bi_paged_attention: kv slot ", s[i], " out of range [0, ", S, ")");
  }
  // items: (sequence, first head, heads, first row, end row): up to 16 query heads of one KV group, for rows
  // split as evenly as <= 16 queries an item allows (equal items keep the threads equally busy). A sequence's
  // items are adjacent, KV groups outer, rows inner: a group's row blocks read the same keys and values, which
  // are still in the cache of a thread that takes them one after the other.
  constexpr int64_t QMAX = 16;
  const int64_t G = H / KVH, HB = std::min(G, QMAX), RB_MAX = std::max<int64_t>(1, QMAX / HB);
  std::vector<int32_t> items;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n_row_blocks = std::max<int64_t>(1, (qlp[b] + RB_MAX - 1) / RB_MAX);
    const int64_t RB = (qlp[b] + n_row_blocks - 1) / n_row_blocks;
    for (int64_t g = 0; g < KVH; ++g)
      for (int64_t hh = 0; hh < G; hh += HB)
        for (int64_t r0 = 0; r0 < qlp[b]; r0 += RB) {
          items.push_back((int32_t)b);
          items.push_back((int32_t)(g * G + hh));
          items.push_back((int32_t)std::min(HB, G - hh));
          items.push_back((int32_t)r0);
          items.push_back((int32_t)std::min(qlp[b], r0 + RB));
        }
  }
  // every query writes its output row when the sequences tile the rows in order (as a packed batch does:
  // a sequence with rows has at least that many keys); otherwise rows no sequence owns stay zero
  bool tiled = true;
  for (int64_t b = 0, at_row = 0; b < B; at_row += qlp[b], ++b) {
    tiled = tiled && qsp[b] == at_row;
    if (b == B - 1) tiled = tiled && at_row + qlp[b] == T;
  }
  at::Tensor out = (tiled && B > 0) ? at::empty({T, H, D}, q.options()) : at::zeros({T, H, D}, q.options());
  AttnParams p{};
  p.q = qc.data_ptr();
  p.qt = ot;
  p.T = T; p.H = H; p.KVH = KVH; p.D = D;
  p.kc = k_cache.data_ptr(); p.vc = v_cache.data_ptr(); p.ct = ct;
  p.slots = sl.data_ptr<int64_t>();
  p.q_start = qsp; p.q_len = qlp; p.kv_len = klp; p.kv_off = kop;
  p.items = items.data();
  p.max_kv = max_kv;
  p.scale = (float)scale;
  p.causal = causal;
  p.out = out.data_ptr(); p.ot = ot;
  const int64_t n_items = (int64_t)items.size() / 5;
  if (n_items == 0) return out;
  const Kernels& k = K();
  const int64_t scr = QMAX * (((std::max<int64_t>(max_kv, 1) + 15) / 16) * 16 + 16);
  int Tn = nthreads();
  // below ~100 keys of a 576-wide decode row the fork/join costs what a second thread saves
  if (n_items < 2 || double(T) * double(max_kv) * double(H * D) < 6.0e4) Tn = 1;
  Tn = (int)std::min<int64_t>(Tn, n_items);
  // per calling thread, reused, and never read before written: zeroing it per call would cost about as much as
  // the rest of the op's serial part
  thread_local std::unique_ptr<float[]> scratch;
  thread_local size_t scratch_n = 0;
  if (scratch_n < (size_t)scr * Tn) {
    scratch_n = (size_t)scr * Tn;
    scratch.reset(new float[scratch_n]);
  }
  float* const sbase = scratch.get();
  if (Tn == 1) {
    k.attn_items(p, 0, n_items, sbase);
  } else {
    const unsigned csr = _mm_getcsr();
#pragma omp parallel num_threads(Tn)
    {
      CsrScope cs(csr);
      const int team = omp_get_num_threads(), idx = omp_get_thread_num();
      float* s = sbase + (size_t)scr * idx;
      if (B == 1 && n_items % team == 0) {
        // one sequence's items are equal work: consecutive shares keep a group's row blocks on one thread
        int64_t i0, i1;
        balanced(n_items, team, idx, i0, i1);
        k.attn_items(p, i0, i1, s);
      } else {
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < n_items; ++c) k.attn_items(p, c, c + 1, s);
      }
    }
  }
  return out;
}

// The paged attention kernel's arguments for a packed batch (runtime/attention.py AttentionBatch.build): per
// sequence s, q_lens[s] new rows whose keys are positions 0 .. kv_lens[s] - 1, its cache blocks the next
// ceil(kv_lens[s] / block_size) entries of `blocks`. Returns slot_mapping (each new row's slot), q_start,
// q_len, kv_len, kv_slots (every sequence's key slots, one after another) and kv_offsets. One op for what a
// dozen small tensor ops per sequence built.
static std::vector<at::Tensor> bi_attention_args(at::IntArrayRef q_lens, at::IntArrayRef kv_lens,
                                                 at::IntArrayRef blocks, int64_t block_size) {
  const int64_t S = (int64_t)q_lens.size();
  TORCH_CHECK((int64_t)kv_lens.size() == S && block_size > 0, "bi_attention_args: one kv_len per q_len, block_size > 0");
  int64_t T = 0, KV = 0, B = 0;
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(q_lens[s] >= 0 && q_lens[s] <= kv_lens[s], "bi_attention_args: sequence ", s, " has q_len ",
                q_lens[s], " and kv_len ", kv_lens[s]);
    T += q_lens[s];
    KV += kv_lens[s];
    B += (kv_lens[s] + block_size - 1) / block_size;
  }
  TORCH_CHECK((int64_t)blocks.size() == B, "bi_attention_args: ", blocks.size(), " blocks given, the lengths need ", B);
  const auto opt = at::TensorOptions().dtype(at::kLong);
  at::Tensor sm = at::empty({T}, opt), qs = at::empty({S}, opt), ql = at::empty({S}, opt), kl = at::empty({S}, opt);
  at::Tensor slots = at::empty({KV}, opt), offs = at::empty({S}, opt);
  int64_t *psm = sm.data_ptr<int64_t>(), *pslots = slots.data_ptr<int64_t>();
  int64_t t = 0, at_kv = 0, b0 = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q = q_lens[s], kv = kv_lens[s], first = kv - q;
    for (int64_t p = 0; p < kv; ++p) {
      const int64_t slot = blocks[b0 + p / block_size] * block_size + p % block_size;
      pslots[at_kv + p] = slot;
      if (p >= first) psm[t + p - first] = slot;
    }
    qs.data_ptr<int64_t>()[s] = t;
    ql.data_ptr<int64_t>()[s] = q;
    kl.data_ptr<int64_t>()[s] = kv;
    offs.data_ptr<int64_t>()[s] = at_kv;
    t += q;
    at_kv += kv;
    b0 += (kv + block_size - 1) / block_size;
  }
  return {sm, qs, ql, kl, slots, offs};
}

// ---- greedy head screen (runtime/greedy_head.py) ---------------------------------------------------------

// a <= b in float32 arithmetic: every figure below is rounded up so that the bound stays a bound
static inline double up(double v) { return v * (1.0 + 0x1p-40); }

// Per row m of the screen's pass: the bound's factors from x (what the head multiplies, fp32 [M, D]) with the
// outlier dimensions zeroed (xr) or alone (xo [M, n_out]), in double: c0 = |e| + 5.01 u sx|p| (e: what the
// W8A8 kernel's per-row, per-chunk codes p with scales sx miss of xr, the codes quantize_rows gives the kernel;
// 5.01 u sx|p|: its two roundings per chunk and the chunk tree), c1 = |xr|, c2 = gamma_{D+4} |x| +
// gamma_{n_out+1} |xo| (the full head's and the outlier product's fp32 sums).
// False, with nothing priced, where a row's |x| max_v |w_v| (w_max) reaches 2^100: every sum the screen and
// the full head form is at most that (Cauchy-Schwarz), and the bounds assume none comes near fp32's range.
static bool screen_coefficients(const float* xr, const float* x, const float* xo, int64_t M, int64_t D,
                                int64_t n_out, int chunks, double w_max, double* coef) {
  const double u = 0x1p-24;
  auto gamma = [u](double n) { return n * u / (1.0 - n * u); };
  LinParams p{};
  p.x = xr;
  p.ldx = D;
  p.chunk_len = D / chunks;
  p.nchunks = chunks;
  std::vector<uint8_t> q((size_t)(M * D));
  std::vector<float> sc((size_t)(M * chunks));
  for (int64_t m = 0; m < M; ++m) {
    double x2 = 0;
    for (int64_t k = 0; k < D; ++k) x2 += (double)x[m * D + k] * x[m * D + k];
    if (!(std::sqrt(x2) * w_max < 0x1p100)) return false;
    coef[3 * m + 2] = x2;  // |x|^2, until its row is priced below
  }
  K().quantize_rows(p, M, q.data(), sc.data());
  for (int64_t m = 0; m < M; ++m) {
    double e2 = 0, p2 = 0, r2 = 0, o2 = 0;
    const double x2 = coef[3 * m + 2];
    for (int64_t k = 0; k < D; ++k) {
      const double xv = xr[m * D + k];
      const double pd = ((double)q[m * D + k] - 128.0) * (double)sc[m * chunks + k / p.chunk_len];
      e2 += (xv - pd) * (xv - pd);
      p2 += pd * pd;
      r2 += xv * xv;
    }
    for (int64_t j = 0; j < n_out; ++j) o2 += (double)xo[m * n_out + j] * xo[m * n_out + j];
    coef[3 * m] = up(std::sqrt(up(e2))) + up(5.01 * u * std::sqrt(up(p2)));
    coef[3 * m + 1] = up(std::sqrt(up(r2)));
    coef[3 * m + 2] = up(gamma((double)D + 4) * std::sqrt(up(x2))) + up(gamma((double)n_out + 1) * std::sqrt(up(o2)));
  }
  return true;
}

// approx = rest + xo . wo[:, v] (the outlier dimensions' fp32 products, in any order: gamma_{n_out+1} covers
// them, and 4u |approx_v| the sum's own rounding); per row m, b_v = coef[m] . g[:, v] (non-negative terms, in
// double) + 4u |approx_v| + 1e-30 bounds |logit_v - approx_v|. Any approx_v - b_v is a lower bound on the row's
// largest logit: that of the largest approx_v is taken as lo. Returns, ascending, every v with
// approx_v + b_v >= lo - gap_rel |lo| - 1e-30 for some row: the only tokens whose logit can round to the row's
// maximum (none where a row's approx has no largest value). Only the approx_v within the largest b of that cut
// are priced one by one. rest: the screen's products [M, V], overwritten with approx. The threads split the
// columns for approx and its maxima (one pass), then the rows for the cut.
static at::Tensor bi_greedy_screen(const at::Tensor& rest, const at::Tensor& wo, const at::Tensor& xr,
                                   const at::Tensor& x, const at::Tensor& xo, const at::Tensor& g,
                                   const at::Tensor& gm, int64_t chunks, double gap_rel) {
  auto f32 = [](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2, "bi_greedy_screen: ", what,
                " must be a contiguous float32 matrix");
  };
  f32(rest, "rest"); f32(xr, "xr"); f32(x, "x"); f32(xo, "xo"); f32(g, "g");
  TORCH_CHECK(gm.scalar_type() == at::kFloat && gm.numel() == 3, "bi_greedy_screen: gm must be g's 3 row maxima");
  TORCH_CHECK((wo.scalar_type() == at::kFloat || wo.scalar_type() == at::kBFloat16) && wo.is_contiguous() &&
                  wo.dim() == 2,
              "bi_greedy_screen: wo must be a contiguous float32 or bfloat16 matrix");
  const int64_t M = rest.size(0), V = rest.size(1), D = x.size(1), n_out = xo.size(1);
  TORCH_CHECK(wo.size(0) == n_out && wo.size(1) == V && g.size(0) == 3 && g.size(1) == V &&
                  xr.sizes() == x.sizes() && x.size(0) == M && xo.size(0) == M && chunks > 0 && chunks <= 8 &&
                  D % chunks == 0 && V > 0,
              "bi_greedy_screen: shapes do not match");
  const float* gmax = gm.data_ptr<float>();
  std::vector<double> coef((size_t)(3 * M));
  if (!screen_coefficients(xr.data_ptr<float>(), x.data_ptr<float>(), xo.data_ptr<float>(), M, D, n_out,
                           (int)chunks, gmax[2], coef.data()))
    return at::empty({0}, at::kLong);  // a row near fp32's range: the caller's logits
  float* const ra = rest.data_ptr<float>();  // approx, in place
  const float* g0 = g.data_ptr<float>();
  const float *g1 = g0 + V, *g2 = g0 + 2 * V;
  const double ru = 4.0 * 0x1p-24;
  const Kernels& kt = K();
  const int Tn = M * V * n_out >= (1 << 16) ? std::min(nthreads(), 2) : 1;
  const unsigned csr = _mm_getcsr();
  std::vector<std::vector<int64_t>> row_ids((size_t)M);
  // per thread and row, the largest approx_v and |approx_v| over the thread's columns
  std::vector<float> part_hi((size_t)(Tn * M), -INFINITY), part_abs((size_t)(Tn * M), 0.0f);
  std::atomic<bool> lost{false};
#pragma omp parallel num_threads(Tn)
  {
    CsrScope cs(csr);
    const int nt = omp_get_num_threads(), me = omp_get_thread_num();
    int64_t v0, v1;
    balanced((V + 15) / 16, nt, me, v0, v1);
    if (v0 * 16 < V)
      kt.approx(xo.data_ptr<float>(), M, n_out, wo.data_ptr(), wo.scalar_type() == at::kBFloat16, V, v0 * 16,
                std::min(V, v1 * 16), ra,
                part_hi.data() + me * M, part_abs.data() + me * M);
#pragma omp barrier
    std::vector<int64_t> near;
#pragma omp for schedule(static, 1)
    for (int64_t m = 0; m < M; ++m) {
      const double c0 = coef[3 * m], c1 = coef[3 * m + 1], c2 = coef[3 * m + 2];
      const float* a = ra + m * V;
      float amax = -INFINITY, aabs = 0.0f;
      for (int t = 0; t < nt; ++t) {
        amax = std::max(amax, part_hi[t * M + m]);
        aabs = std::max(aabs, part_abs[t * M + m]);
      }
      near.clear();
      kt.at_least(a, V, amax, near);  // the first is the first index of the largest approx_v
      if (near.empty()) {  // no largest value (a NaN, which the check above rules out): the caller's logits
        lost = true;
        continue;
      }
      const int64_t best = near[0];
      auto bound = [&](int64_t v) {
        return c0 * g0[v] + c1 * g1[v] + c2 * g2[v] + ru * std::fabs((double)a[v]) + 1e-30;
      };
      const double lo = (double)a[best] - bound(best);
      const double cut = lo - gap_rel * std::fabs(lo) - 1e-30;
      const double bmax = c0 * gmax[0] + c1 * gmax[1] + c2 * gmax[2] + ru * aabs + 1e-30;
      // approx_v below cut - bmax cannot pass; the float threshold keeps a margin for its own rounding
      const double t = cut - bmax;
      near.clear();
      kt.at_least(a, V, (float)(t - std::fabs(t) * 0x1p-20 - 1e-30), near);
      for (const int64_t v : near)
        if ((double)a[v] + bound(v) >= cut) row_ids[m].push_back(v);
    }
  }
  if (lost) return at::empty({0}, at::kLong);
  std::vector<int64_t> ids;
  for (const auto& r : row_ids) ids.insert(ids.end(), r.begin(), r.end());
  std::sort(ids.begin(), ids.end());  // rows' candidates in one ascending list
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  at::Tensor res = at::empty({(int64_t)ids.size()}, at::kLong);
  if (!ids.empty()) std::memcpy(res.data_ptr<int64_t>(), ids.data(), ids.size() * sizeof(int64_t));
  return res;
}

// The head's panels for just the candidates' columns (column i: token id[i]), packed as the head's own panels
// (fp32, widened bf16 or bf16 k-pairs; check_packed's kinds) from rows, the head's weight row-major: fp32 rows
// go into bf16 panels rounded to nearest even, as the panels were packed (torch's conversion). A column's
// result under the head kernel depends on its own weights alone, so these logits are bitwise the full head's,
// read from nc rows of weights instead of every panel that holds a candidate.
static at::Tensor candidate_panels(const at::Tensor& head, const at::Tensor& rows, const int64_t* id, int64_t nc) {
  constexpr int64_t PANEL = 32;
  const int64_t K = rows.size(1), P = (nc + PANEL - 1) / PANEL;
  at::Tensor out = at::zeros({P, head.size(1), PANEL}, head.options());
  // panel by panel, k outer and its columns inner: the writes run in order, the candidates' rows are read as
  // streams side by side
  auto transpose = [&](auto* o, const auto* r, int64_t len, auto&& slot) {
    for (int64_t p0 = 0; p0 < nc; p0 += PANEL) {
      const int64_t n = std::min(PANEL, nc - p0);
      decltype(r) src[PANEL];
      for (int64_t c = 0; c < n; ++c) src[c] = r + id[p0 + c] * len;
      auto* d = o + (p0 / PANEL) * len * PANEL;
      for (int64_t k = 0; k < len; ++k)
        for (int64_t c = 0; c < n; ++c) d[k * PANEL + slot(c)] = src[c][k];
    }
  };
  const auto same = [](int64_t c) { return c; };
  if (head.scalar_type() != at::kFloat && rows.scalar_type() == at::kFloat) {  // bf16 panels of fp32 weights
    std::vector<int64_t> dense((size_t)nc);
    for (int64_t i = 0; i < nc; ++i) dense[i] = i;
    const at::Tensor picked = rows.index_select(0, at::tensor(std::vector<int64_t>(id, id + nc), at::kLong))
                                  .to(at::kBFloat16)
                                  .contiguous();
    return candidate_panels(head, picked, dense.data(), nc);
  }
  if (head.scalar_type() == at::kFloat) {
    transpose(out.data_ptr<float>(), rows.data_ptr<float>(), K, same);
  } else if (head.scalar_type() == at::kShort) {
    // k-pairs: u32 [P][K/2][32 columns], a lane's low half k = 2q and high half 2q + 1, which is how a row's
    // two bf16 at 2q, 2q + 1 read as one little-endian u32
    transpose((uint32_t*)out.data_ptr(), (const uint32_t*)rows.data_ptr(), K / 2, same);
  } else {  // widened bf16: per k, elements in the column order 16, 0, 17, 1, ..., 31, 15
    transpose((uint16_t*)out.data_ptr(), (const uint16_t*)rows.data_ptr(), K,
              [](int64_t c) { return c < 16 ? 2 * c + 1 : 2 * (c - 16); });
  }
  return out;
}

// The whole greedy screen of runtime/greedy_head.py in one op: x (the head's input rows, the head's dtype) ->
// each row's argmax token, exactly that of the full head (the screen's bound, then the candidates' logits from
// the head's own kernel on panels of just their columns: candidate_panels). rows: the head's weight row-major
// (float32, or bfloat16 for bf16 panels). pairs: the head is bf16 k-pair panels, whose kernel rounds x to
// bf16. An empty result: the caller computes the logits (x not finite or its sums near fp32's range, or more
// than max_candidates candidates). One op, not a dozen small ones:
// right after a pass that streamed every weight, each op's first touch of its code and data costs more than its
// work.
static at::Tensor bi_greedy_head(const at::Tensor& x, bool pairs, const at::Tensor& out_idx,
                                 const at::Tensor& screen, int64_t screen_n, const at::Tensor& screen_scale,
                                 int64_t chunks, const at::Tensor& wo, const at::Tensor& g, const at::Tensor& gm,
                                 double gap_rel, const at::Tensor& head, const at::Tensor& rows,
                                 int64_t max_candidates) {
  TORCH_CHECK(x.dim() == 2 && out_idx.scalar_type() == at::kLong, "bi_greedy_head: x must be [M, K], out_idx int64");
  const bool f32 = head.scalar_type() == at::kFloat;
  TORCH_CHECK((f32 || head.scalar_type() == at::kShort || head.scalar_type() == at::kBFloat16) && head.dim() == 3 &&
                  rows.dim() == 2 && rows.is_contiguous() &&
                  (rows.scalar_type() == at::kFloat || (!f32 && rows.scalar_type() == at::kBFloat16)) &&
                  rows.size(1) == x.size(1) && rows.size(0) <= head.size(0) * 32,
              "bi_greedy_head: rows must be the head's weight, [V, K] contiguous, float32 (bf16 panels: float32 "
              "or bfloat16)");
  const at::Tensor none = at::empty({0}, at::kLong);
  const at::Tensor xf = (pairs ? x.to(at::kBFloat16).to(at::kFloat) : x.to(at::kFloat)).contiguous();
  const float* xv = xf.data_ptr<float>();
  for (int64_t i = 0, n = xf.numel(); i < n; ++i)
    if (!std::isfinite(xv[i])) return none;
  at::Tensor xr = xf.clone();
  xr.index_fill_(1, out_idx, 0.0);
  const at::Tensor xo = xf.index_select(1, out_idx).contiguous();
  const at::Tensor rest = bi_linear(xr, screen, screen_n, c10::nullopt, chunks, screen_scale);
  const at::Tensor ids = bi_greedy_screen(rest, wo, xr, xf, xo, g, gm, chunks, gap_rel);
  const int64_t nc = ids.numel();
  if (nc == 0 || nc > max_candidates) return none;
  const int64_t* id = ids.data_ptr<int64_t>();  // ascending
  TORCH_CHECK(id[nc - 1] < rows.size(0), "bi_greedy_head: a candidate beyond the head's rows");
  const at::Tensor exact =
      bi_linear(x.contiguous(), candidate_panels(head, rows, id, nc), nc, c10::nullopt, 1, c10::nullopt)
          .to(at::kFloat)
          .contiguous();
  const int64_t M = x.size(0);
  const float* e = exact.data_ptr<float>();
  at::Tensor out = at::empty({M}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) {  // torch.argmax over the candidates in vocabulary order: NaN wins, first max
    int64_t best = 0;
    for (int64_t i = 1; i < nc; ++i) {
      const float b = e[m * nc + best], v = e[m * nc + i];
      if (!std::isnan(b) && (std::isnan(v) || v > b)) best = i;
    }
    o[m] = id[best];
  }
  return out;
}

// torch.argmax of n floats (bf16 when bf): the first NaN if there is one, else the first maximum (the verify's
// AVX-512 passes on the AVX-512 paths, a plain loop on the others and for a row that holds a NaN)
static int64_t row_argmax(const void* a, int64_t n, bool bf) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (&K() == &bi_avx512::kTable || amx_active()) {
    const int64_t j = bf ? dflash::argmax_row_avx512<true>(a, n) : dflash::argmax_row_avx512<false>(a, n);
    if (j >= 0) return j;
  }
#endif
  int64_t best = 0;
  float bv = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float x = bf ? (float)((const at::BFloat16*)a)[i] : ((const float*)a)[i];
    if (x != x) return i;
    if (x > bv || i == 0) best = i, bv = x;
  }
  return best;
}

// Each row's greedy token under a packed head: the logits from the head's own kernel (rounded to x's dtype, as
// linear() returns them), then torch.argmax's choice (the first NaN, else the first maximum), mapped through ids
// (a draft vocabulary's token ids) when ids is not empty; with confidence, also the token's softmax probability
// 1 / sum_j exp(l_j - l_max) (NaN where the row has a NaN). One op where a drafter's head took four to seven
// (linear, widening, argmax or max, exp, sum, id lookup): right after the target's pass streamed every weight,
// each op's first touch of its code and data costs more than its work.
static std::tuple<at::Tensor, at::Tensor> bi_head_argmax(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                                                         const c10::optional<at::Tensor>& wscale,
                                                         const at::Tensor& ids, bool confidence) {
  TORCH_CHECK(x.dim() == 2 && n > 0, "bi_head_argmax: x must be [M, K] and the head non-empty");
  TORCH_CHECK(ids.numel() == 0 || (ids.scalar_type() == at::kLong && ids.numel() >= n && ids.is_contiguous()),
              "bi_head_argmax: ids must be empty or n contiguous int64 token ids");
  const at::Tensor logits = bi_linear(x, packed, n, c10::nullopt, 1, wscale);
  const bool bf = logits.scalar_type() == at::kBFloat16;
  const int64_t M = logits.size(0), ld = logits.stride(0);
  at::Tensor out = at::empty({M}, at::kLong);
  at::Tensor conf = at::empty({confidence ? M : 0}, at::kFloat);
  int64_t* o = out.data_ptr<int64_t>();
  float* c = conf.data_ptr<float>();
  const int64_t* id = ids.numel() ? ids.data_ptr<int64_t>() : nullptr;
  const char* base = (const char*)logits.data_ptr();
  for (int64_t m = 0; m < M; ++m) {
    const void* row = base + m * ld * logits.element_size();
    const int64_t j = row_argmax(row, n, bf);
    o[m] = id ? id[j] : j;
    if (confidence) {
      const float best = bf ? static_cast<float>(((const at::BFloat16*)row)[j]) : ((const float*)row)[j];
      c[m] = best != best ? best : K().row_top_probability(row, n, bf, best);
    }
  }
  return {out, conf};
}

// ---- misc --------------------------------------------------------------------------------------------------

static std::string bi_set_isa(const std::string& isa) {
  if (!isa.empty()) g_kernels = pick_kernels(isa);
  return K().name;
}

static at::Tensor bi_selftest_reduce(const at::Tensor& a) {
  at::Tensor c = a.to(at::kFloat).contiguous();
  TORCH_CHECK(c.numel() == 256, "bi_selftest_reduce: 256 floats");
  at::Tensor out = at::empty({16}, c.options());
  K().selftest_reduce(c.data_ptr<float>(), out.data_ptr<float>());
  return out;
}

}  // namespace bi

TORCH_LIBRARY_FRAGMENT(dflash_trt, m) {
  m.def("bi_linear(Tensor x, Tensor packed, int n, Tensor? bias=None, int k_splits=1, Tensor? wscale=None) -> Tensor");
  m.def("bi_linear_silu(Tensor x, Tensor packed, int n, int inter, int up_col, Tensor? bias=None, int k_splits=1, "
        "Tensor? wscale=None) -> Tensor");
  m.def("bi_linear_partial(Tensor x, Tensor packed, int n, int chunk_begin, int chunk_end, int k_splits, "
        "Tensor? wscale=None) -> Tensor");
  m.def("bi_rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("bi_norm_linear(Tensor x, Tensor? residual, Tensor weight, float eps, Tensor packed, int n, Tensor? bias, "
        "int k_splits, Tensor? wscale, int inter, int up_col) -> (Tensor, Tensor)");
  m.def("bi_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("bi_silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("bi_paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_start, Tensor q_len, "
        "Tensor kv_len, Tensor kv_slots, Tensor kv_offsets, float scale, bool causal=True) -> Tensor");
  m.def("bi_set_isa(str isa) -> str", &bi::bi_set_isa);
  m.def("bi_set_pairs(str mode) -> str", &bi::bi_set_pairs);
  m.def("bi_selftest_reduce(Tensor a) -> Tensor");
  m.def("bi_attention_args(int[] q_lens, int[] kv_lens, int[] blocks, int block_size) -> Tensor[]",
        &bi::bi_attention_args);
  m.def("bi_greedy_head(Tensor x, bool pairs, Tensor out_idx, Tensor screen, int screen_n, Tensor screen_scale, "
        "int chunks, Tensor wo, Tensor g, Tensor gm, float gap_rel, Tensor head, Tensor rows, int max_candidates) -> Tensor");
  m.def("bi_head_argmax(Tensor x, Tensor packed, int n, Tensor? wscale, Tensor ids, bool confidence) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(dflash_trt, CPU, m) {
  m.impl("bi_linear", &bi::bi_linear);
  m.impl("bi_linear_silu", &bi::bi_linear_silu);
  m.impl("bi_norm_linear", &bi::bi_norm_linear);
  m.impl("bi_linear_partial", &bi::bi_linear_partial);
  m.impl("bi_rms_norm", &bi::bi_rms_norm);
  m.impl("bi_add_rms_norm", &bi::bi_add_rms_norm);
  m.impl("bi_silu_mul", &bi::bi_silu_mul);
  m.impl("bi_paged_attention", &bi::bi_paged_attention);
  m.impl("bi_selftest_reduce", &bi::bi_selftest_reduce);
  m.impl("bi_greedy_head", &bi::bi_greedy_head);
  m.impl("bi_head_argmax", &bi::bi_head_argmax);
}

#else  // ===================================== kernel body (one ISA per pass) =================================

using bi::AttnParams;
using bi::Kernels;
using bi::LinParams;
using bi::NormParams;
using bi::SiluParams;

#define BI_INLINE static inline __attribute__((always_inline))
// on every loop over a tile's accumulators (rows, panels, halves): GCC keeps an array of vector registers in
// registers only when each of its loops is unrolled in full early, before scalar replacement; one loop left
// rolled puts the whole array on the stack, stored and reloaded around the k loop and in the finish
#define BI_UNROLL _Pragma("GCC unroll 16")

BI_INLINE uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
BI_INLINE float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
// fp32 -> bf16 bits, round to nearest even, NaN -> 0x7FC0 (as torch does)
BI_INLINE uint16_t f2bf_s(float f) {
  if (f != f) return 0x7FC0;
  uint32_t u = f2u(f);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#if BI_KERNEL_PASS == 1  // ------------------------------------------------------------------- AVX-512
static const char* const kIsaName = "avx512";
enum { MR_MAX = 14 };
static inline int mr_max_for(int) { return MR_MAX; }
static inline int np_for(int mr) { return mr <= 3 ? 4 : (mr <= 7 ? 2 : 1); }

struct V16 { __m512 v; };
BI_INLINE __mmask16 mask16(int n) { return (__mmask16)((1u << n) - 1u); }
BI_INLINE V16 vzero() { return {_mm512_setzero_ps()}; }
BI_INLINE V16 vset1(float a) { return {_mm512_set1_ps(a)}; }
BI_INLINE V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
BI_INLINE V16 vload_n(const float* p, int n) { return {_mm512_maskz_loadu_ps(mask16(n), p)}; }
BI_INLINE void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
BI_INLINE void vstore_n(float* p, V16 a, int n) { _mm512_mask_storeu_ps(p, mask16(n), a.v); }
BI_INLINE V16 bf_widen(__m256i h) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))}; }
BI_INLINE V16 vload_bf(const uint16_t* p) { return bf_widen(_mm256_loadu_si256((const __m256i*)p)); }
BI_INLINE V16 vload_bf_n(const uint16_t* p, int n) { return bf_widen(_mm256_maskz_loadu_epi16(mask16(n), p)); }
// x's bits rounded to nearest even at bit 16 (NaN -> 0x7FC0 above), the low 16 bits left as they fall
BI_INLINE __m512i bf_round_high(__m512 x) {
  __m512i b = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC00000));
}
BI_INLINE __m512i bf_round_bits(__m512 x) {  // rounded fp32 bits with the low 16 bits cleared
  return _mm512_and_si512(bf_round_high(x), _mm512_set1_epi32((int)0xFFFF0000u));
}
BI_INLINE V16 vround_bf(V16 a) { return {_mm512_castsi512_ps(bf_round_bits(a.v))}; }
// the rounded high halves, gathered by one word permute (the low halves are dropped, so never cleared)
BI_INLINE __m256i bf_narrow(V16 a) {
  const __m512i odd = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27, 25, 23,
                                       21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd, bf_round_high(a.v)));
}
BI_INLINE void vstore_bf(uint16_t* p, V16 a) { _mm256_storeu_si256((__m256i*)p, bf_narrow(a)); }
BI_INLINE void vstore_bf_n(uint16_t* p, V16 a, int n) { _mm256_mask_storeu_epi16(p, mask16(n), bf_narrow(a)); }
BI_INLINE void vload_bfpair(const uint32_t* p, V16& c0, V16& c1) {
  __m512i w = _mm512_loadu_si512((const void*)p);
  c0.v = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
  c1.v = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// 32 e4m3 bytes -> their values / 256, exactly: the e4m3 bits shifted into an fp16 (exponent bias 15, not 7)
BI_INLINE void vload_f8x32(const uint8_t* p, V16& c0, V16& c1) {
  __m512i h = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
  h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(0x7F)), 7),
                      _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(0x80)), 8));
  c0.v = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  c1.v = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
// 32 int8 codes -> fp32, exactly
BI_INLINE void vload_i8x32(const uint8_t* p, V16& c0, V16& c1) {
  c0.v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  c1.v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16))));
}
BI_INLINE V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
BI_INLINE V16 vadd(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
BI_INLINE V16 vsub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
BI_INLINE V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
BI_INLINE V16 vdiv(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
BI_INLINE V16 vmax(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
BI_INLINE V16 vmin(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
BI_INLINE V16 vpow2i(V16 n) {  // n integral in [-126, 128]
  __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
BI_INLINE float hsum(V16 a) {
  __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
  __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
  __m128 r = _mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1));
  return _mm_cvtss_f32(r);
}
BI_INLINE float hmax(V16 a) { return _mm512_reduce_max_ps(a.v); }  // max is exact: order does not matter
// out lane j = hsum(a[j]) with the same tree as hsum, for 16 vectors at once (butterfly transpose-reduce)
BI_INLINE V16 reduce16(const V16* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i].v, a[2 * i + 1].v, 0x44),
                         _mm512_shuffle_f32x4(a[2 * i].v, a[2 * i + 1].v, 0xEE));
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  __m512 r = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  // lane 4q+s holds key 4s+q
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return {_mm512_permutexvar_ps(idx, r)};
}

#elif BI_KERNEL_PASS == 2  // ----------------------------------------------------------------- AVX2 + FMA
static const char* const kIsaName = "avx2";
// fp32, bf16 and 8-bit panels run tiles of several rows one 16-column half at a time (lin_kernel_half: 6 rows,
// 5 with int8 codes and their scales, 4 with e4m3's widening constants too); bf16 k-pairs keep all 32 columns
// in registers, which 16 ymm registers allow for 3 rows
enum { MR_MAX = 6 };
static inline int mr_max_for(int wt) {
  return wt == bi::F32 || wt == bi::BF16 ? MR_MAX : wt == bi::I8 ? 5 : wt == bi::F8 ? 4 : 3;
}
static inline int np_for(int mr) { return mr == 1 ? 2 : 1; }

struct V16 { __m256 lo, hi; };
BI_INLINE __m256i mask8(int n) {  // lanes < n set
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
BI_INLINE V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
BI_INLINE V16 vset1(float a) { __m256 s = _mm256_set1_ps(a); return {s, s}; }
BI_INLINE V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
BI_INLINE V16 vload_n(const float* p, int n) {
  return {_mm256_maskload_ps(p, mask8(n)), _mm256_maskload_ps(p + 8, mask8(n - 8))};
}
BI_INLINE void vstore(float* p, V16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
BI_INLINE void vstore_n(float* p, V16 a, int n) {
  _mm256_maskstore_ps(p, mask8(n), a.lo);
  _mm256_maskstore_ps(p + 8, mask8(n - 8), a.hi);
}
BI_INLINE V16 vload_bf(const uint16_t* p) {
  __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16);
  __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 8))), 16);
  return {_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)};
}
BI_INLINE V16 vload_bf_n(const uint16_t* p, int n) {
  alignas(32) uint16_t t[16] = {0};
  for (int i = 0; i < n; ++i) t[i] = p[i];
  return vload_bf(t);
}
BI_INLINE __m256i bf_round_bits8(__m256 x) {
  __m256i b = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), nan);
}
BI_INLINE V16 vround_bf(V16 a) {
  return {_mm256_castsi256_ps(bf_round_bits8(a.lo)), _mm256_castsi256_ps(bf_round_bits8(a.hi))};
}
BI_INLINE __m256i bf_narrow(V16 a) {
  __m256i lo = _mm256_srli_epi32(bf_round_bits8(a.lo), 16), hi = _mm256_srli_epi32(bf_round_bits8(a.hi), 16);
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
}
BI_INLINE void vstore_bf(uint16_t* p, V16 a) { _mm256_storeu_si256((__m256i*)p, bf_narrow(a)); }
BI_INLINE void vstore_bf_n(uint16_t* p, V16 a, int n) {
  alignas(32) uint16_t t[16];
  _mm256_store_si256((__m256i*)t, bf_narrow(a));
  for (int i = 0; i < n; ++i) p[i] = t[i];
}
BI_INLINE void vload_bfpair(const uint32_t* p, V16& c0, V16& c1) {
  __m256i w0 = _mm256_loadu_si256((const __m256i*)p), w1 = _mm256_loadu_si256((const __m256i*)(p + 8));
  const __m256i m = _mm256_set1_epi32((int)0xFFFF0000u);
  c0.lo = _mm256_castsi256_ps(_mm256_and_si256(w0, m));
  c0.hi = _mm256_castsi256_ps(_mm256_and_si256(w1, m));
  c1.lo = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
  c1.hi = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
}
BI_INLINE V16 f8_half16(const uint8_t* p) {  // 16 e4m3 bytes -> values / 256 (see the AVX-512 path)
  __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p));
  h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7),
                      _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
BI_INLINE void vload_f8x32(const uint8_t* p, V16& c0, V16& c1) {
  c0 = f8_half16(p);
  c1 = f8_half16(p + 16);
}
BI_INLINE __m256 i8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
BI_INLINE void vload_i8x32(const uint8_t* p, V16& c0, V16& c1) {  // 32 int8 codes -> fp32, exactly
  c0 = {i8x8(p), i8x8(p + 8)};
  c1 = {i8x8(p + 16), i8x8(p + 24)};
}
BI_INLINE V16 vfma(V16 a, V16 b, V16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
BI_INLINE V16 vadd(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
BI_INLINE V16 vsub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
BI_INLINE V16 vmul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
BI_INLINE V16 vdiv(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
BI_INLINE V16 vmax(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
BI_INLINE V16 vmin(V16 a, V16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
BI_INLINE __m256 pow2i8(__m256 n) {
  __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
BI_INLINE V16 vpow2i(V16 n) { return {pow2i8(n.lo), pow2i8(n.hi)}; }
BI_INLINE float hsum(V16 a) {
  __m256 r8 = _mm256_add_ps(a.lo, a.hi);
  __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
  __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
  __m128 r = _mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1));
  return _mm_cvtss_f32(r);
}
BI_INLINE float hmax(V16 a) {
  alignas(32) float t[16];
  _mm256_store_ps(t, a.lo);
  _mm256_store_ps(t + 8, a.hi);
  float m = t[0];
  for (int i = 1; i < 16; ++i) m = t[i] > m ? t[i] : m;
  return m;
}
// out lane j = hsum(a[j]) with the same tree as hsum, 8 vectors per ymm (transpose-reduce)
BI_INLINE __m256 reduce8(const V16* a) {
  __m256 r8[8], u[4], v[2];
  for (int j = 0; j < 8; ++j) r8[j] = _mm256_add_ps(a[j].lo, a[j].hi);         // lanes i, i+8
  for (int j = 0; j < 4; ++j)                                                    // lanes i, i+4: [j | j+4]
    u[j] = _mm256_add_ps(_mm256_permute2f128_ps(r8[j], r8[j + 4], 0x20),
                         _mm256_permute2f128_ps(r8[j], r8[j + 4], 0x31));
  for (int j = 0; j < 2; ++j)                                                    // lanes i, i+2: [2j, 2j+1 | ..]
    v[j] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44),
                         _mm256_shuffle_ps(u[2 * j], u[2 * j + 1], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], 0x88), _mm256_shuffle_ps(v[0], v[1], 0xDD));  // lanes 0, 1
}
BI_INLINE V16 reduce16(const V16* a) { return {reduce8(a), reduce8(a + 8)}; }

#else  // ---------------------------------------------------------------------------------------- portable
static const char* const kIsaName = "scalar";
enum { MR_MAX = 4 };
static inline int mr_max_for(int) { return MR_MAX; }
static inline int np_for(int) { return 1; }

struct V16 { float v[16]; };
BI_INLINE V16 vzero() { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = 0.0f; return r; }
BI_INLINE V16 vset1(float a) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a; return r; }
BI_INLINE V16 vload(const float* p) { V16 r; std::memcpy(r.v, p, 64); return r; }
BI_INLINE V16 vload_n(const float* p, int n) { V16 r = vzero(); for (int i = 0; i < n; ++i) r.v[i] = p[i]; return r; }
BI_INLINE void vstore(float* p, V16 a) { std::memcpy(p, a.v, 64); }
BI_INLINE void vstore_n(float* p, V16 a, int n) { for (int i = 0; i < n; ++i) p[i] = a.v[i]; }
BI_INLINE V16 vload_bf(const uint16_t* p) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = u2f((uint32_t)p[i] << 16); return r; }
BI_INLINE V16 vload_bf_n(const uint16_t* p, int n) {
  V16 r = vzero();
  for (int i = 0; i < n; ++i) r.v[i] = u2f((uint32_t)p[i] << 16);
  return r;
}
BI_INLINE V16 vround_bf(V16 a) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = u2f((uint32_t)f2bf_s(a.v[i]) << 16); return r; }
BI_INLINE void vstore_bf(uint16_t* p, V16 a) { for (int i = 0; i < 16; ++i) p[i] = f2bf_s(a.v[i]); }
BI_INLINE void vstore_bf_n(uint16_t* p, V16 a, int n) { for (int i = 0; i < n; ++i) p[i] = f2bf_s(a.v[i]); }
BI_INLINE void vload_bfpair(const uint32_t* p, V16& c0, V16& c1) {
  for (int i = 0; i < 16; ++i) {
    c0.v[i] = u2f(p[i] & 0xFFFF0000u);
    c1.v[i] = u2f(p[i] << 16);
  }
}
BI_INLINE float f8_div256(uint8_t x) {  // e4m3 value / 256, exactly as the fp16 trick of the SIMD paths gives it
  const int e = (x >> 3) & 0xF, m = x & 7;
  const float v = e ? std::ldexp(1.0f + (float)m / 8.0f, e - 15) : std::ldexp((float)m / 8.0f, -14);
  return (x & 0x80) ? -v : v;
}
BI_INLINE void vload_f8x32(const uint8_t* p, V16& c0, V16& c1) {
  for (int i = 0; i < 16; ++i) {
    c0.v[i] = f8_div256(p[i]);
    c1.v[i] = f8_div256(p[16 + i]);
  }
}
BI_INLINE void vload_i8x32(const uint8_t* p, V16& c0, V16& c1) {
  for (int i = 0; i < 16; ++i) {
    c0.v[i] = (float)(int8_t)p[i];
    c1.v[i] = (float)(int8_t)p[16 + i];
  }
}
BI_INLINE V16 vfma(V16 a, V16 b, V16 c) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return r; }
BI_INLINE V16 vadd(V16 a, V16 b) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] + b.v[i]; return r; }
BI_INLINE V16 vsub(V16 a, V16 b) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] - b.v[i]; return r; }
BI_INLINE V16 vmul(V16 a, V16 b) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] * b.v[i]; return r; }
BI_INLINE V16 vdiv(V16 a, V16 b) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] / b.v[i]; return r; }
// x86 maxps/minps semantics: (a > b ? a : b), (a < b ? a : b)
BI_INLINE V16 vmax(V16 a, V16 b) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return r; }
BI_INLINE V16 vmin(V16 a, V16 b) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i]; return r; }
BI_INLINE V16 vpow2i(V16 n) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = u2f((uint32_t)((int32_t)n.v[i] + 127) << 23);
  return r;
}
BI_INLINE float hsum(V16 a) {
  float r8[8], r4[4], r2[2];
  for (int i = 0; i < 8; ++i) r8[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) r4[i] = r8[i] + r8[i + 4];
  for (int i = 0; i < 2; ++i) r2[i] = r4[i] + r4[i + 2];
  return r2[0] + r2[1];
}
BI_INLINE float hmax(V16 a) { float m = a.v[0]; for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m; return m; }
BI_INLINE V16 reduce16(const V16* a) { V16 r; for (int j = 0; j < 16; ++j) r.v[j] = hsum(a[j]); return r; }
#endif

// ------------------------------------------------------------------------------- shared 16-lane algorithms

// e^x / 2^fx for fx = x / ln2 rounded to an integer: Cody-Waite reduction by ln2 and the Cephes expf polynomial
BI_INLINE V16 exp_reduced(V16 x, V16 fx) {
  V16 r = vfma(fx, vset1(-0.693359375f), x);
  r = vfma(fx, vset1(2.12194440e-4f), r);
  V16 p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), r);
  return vadd(p, vset1(1.0f));
}

// exp(x) = exp_reduced * 2^fx; |rel err| ~ 2 ulp.
BI_INLINE V16 vexp(V16 x) {
  x = vmin(vmax(x, vset1(-87.3f)), vset1(88.7f));
  const V16 magic = vset1(12582912.0f);  // 1.5 * 2^23: adding and subtracting rounds to nearest even
  V16 fx = vsub(vadd(vmul(x, vset1(1.44269504088896341f)), magic), magic);
  return vmul(exp_reduced(x, fx), vpow2i(fx));
}

// vexp where x <= 0 or NaN (a softmax's s - max): no upper clamp, and on AVX-512 the rounding and the power of two
// in one instruction each (roundscale: the magic shift's nearest-even integer; scalef: p * 2^fx, the product
// vpow2i's multiply rounds, fx in [-126, 0]), so every bit is vexp's
#if BI_KERNEL_PASS == 1
BI_INLINE V16 vexp_nonpos(V16 x) {
  x = vmax(x, vset1(-87.3f));
  const V16 fx = {_mm512_roundscale_ps(_mm512_mul_ps(x.v, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
  return {_mm512_scalef_ps(exp_reduced(x, fx).v, fx.v)};
}
#else
BI_INLINE V16 vexp_nonpos(V16 x) { return vexp(x); }
#endif

// Row block t of nt balanced blocks of rows = nt * base + extra: the blocks of base rows first, the last `extra`
// of base + 1. The AMX passes shape their tiles for the largest block, so each smaller one also multiplies the
// first row of the block after it (sums nobody reads); with the larger blocks last, no tile reads past the rows.
// Returns the block's rows; r: its first row, counted from the first block's.
BI_INLINE int row_block(int64_t t, int64_t nt, int base, int extra, int64_t& r) {
  r = t * base + std::max<int64_t>(0, t - (nt - extra));
  return base + (t >= nt - extra ? 1 : 0);
}

// ---- W8A8 integer dot products ------------------------------------------------------------------------
// linq_kernel: the exact int32 sums of one chunk, out[(m * NP + j) * 32 + col] = sum_k (xq[m][k] - 128) * w[k]
// for MR rows and NP panels; xq: row 0 at the chunk's first column (rows ldq apart); w: panel 0 at the chunk's
// first quad (panels pstride int32 apart). Integer sums are exact, so how they are formed never shows.
// xc: per row, 128 * sum_k (xq[m][k] - 128) over the call's quads, where the caller has it (a row's chunk is the
// same for every panel), or nullptr; only the VNNI kernel, whose products carry that term, reads it. The VNNI
// kernel takes its rows' codes flipped to xq - 128 (signed bytes: LinParams.xsq) and always with xc.
typedef void (*LinqFn)(const uint8_t*, int64_t, const int32_t*, int64_t, int64_t, int32_t*, const int32_t*);
#ifndef BI_PF_FAR
// 128-byte k-steps of a weight panel (16 KiB) fetched ahead into L2 by tiles of 2+ rows, besides the near L1
// prefetch. The near one alone runs about one DRAM latency ahead, so a compute-bound tile of several rows waits
// on memory between its dot products; at a tile's pace 16 KiB covers that latency, and lines asked for farther
// ahead only wait longer in L2 and in the memory queues. A one-row tile is a pure stream the hardware
// prefetchers serve, where the extra prefetches only take issue slots and fill buffers.
#define BI_PF_FAR 128
#endif
#if BI_KERNEL_PASS == 1
enum { MRQ = 12, NPQ = 1 };
#ifndef BI_PF_QUADS
#define BI_PF_QUADS 16  // weight quads (128 B each) fetched ahead: at many rows the dot products alone keep the core busy
#endif
BI_INLINE V16 vcvt_i32(const int32_t* p) { return {_mm512_cvtepi32_ps(_mm512_loadu_si512((const void*)p))}; }
#pragma GCC push_options
#pragma GCC target("avx512vnni")
// The operands swap roles here: the weight bytes, flipped to w + 128, are the unsigned operand and the codes,
// flipped to xq - 128, the signed broadcast, so sum (w + 128)(xq - 128) = the sum + 128 * sum (xq - 128): one
// row sum per row and chunk (linear_tile_q makes it once for all panels) instead of a sum_k w per quad beside
// the rows' products (which also left GCC spilling the accumulators: 0.6x the rate at 8 rows).
BI_INLINE int32_t xs_sum(const uint8_t* x, int64_t n) {  // sum of (x[k] - 128), k < n
  const __m512i z = _mm512_setzero_si512();
  __m512i s = z;
  int64_t k = 0;
  for (; k + 64 <= n; k += 64) s = _mm512_add_epi64(s, _mm512_sad_epu8(_mm512_loadu_si512((const void*)(x + k)), z));
  if (k < n) s = _mm512_add_epi64(s, _mm512_sad_epu8(_mm512_maskz_loadu_epi8(_bzhi_u64(~0ull, (unsigned)(n - k)), x + k), z));
  return (int32_t)(_mm512_reduce_add_epi64(s) - 128 * n);
}
static int32_t xs_corr(const uint8_t* x, int64_t n) { return (int32_t)((uint32_t)xs_sum(x, n) << 7); }
// acc + the dot products of u's unsigned byte quads and the signed quad at s, broadcast by the load itself (a
// broadcast from a general register competes with the dot products for their vector pipes). As asm, the
// accumulator stays in its register: GCC copies the intrinsic's tied operand through other registers.
BI_INLINE __m512i dpbusd_bcst(__m512i acc, __m512i u, const uint8_t* s) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t*)s));
  return acc;
}
template <int MR, int NP>
static void linq_kernel(const uint8_t* xs, int64_t ldq, const int32_t* w, int64_t pstride, int64_t nq,
                        int32_t* out, const int32_t* xc) {
  __m512i acc[MR][NP][2];
  BI_UNROLL for (int j = 0; j < NP; ++j)
    BI_UNROLL for (int h = 0; h < 2; ++h)
      BI_UNROLL for (int m = 0; m < MR; ++m) acc[m][j][h] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  for (int64_t q = 0; q < nq; ++q) {
    __m512i b[NP][2];
    BI_UNROLL for (int j = 0; j < NP; ++j)
      BI_UNROLL for (int h = 0; h < 2; ++h) {
        b[j][h] = _mm512_xor_si512(_mm512_loadu_si512((const void*)(w + j * pstride + q * 32 + 16 * h)), flip);
        _mm_prefetch((const char*)(w + j * pstride + (q + BI_PF_QUADS) * 32 + 16 * h), _MM_HINT_T0);
        if (MR > 1) _mm_prefetch((const char*)(w + j * pstride + (q + BI_PF_FAR) * 32 + 16 * h), _MM_HINT_T1);
      }
    BI_UNROLL for (int m = 0; m < MR; ++m)
      BI_UNROLL for (int j = 0; j < NP; ++j)
        BI_UNROLL for (int h = 0; h < 2; ++h) acc[m][j][h] = dpbusd_bcst(acc[m][j][h], b[j][h], xs + m * ldq + 4 * q);
  }
  BI_UNROLL for (int m = 0; m < MR; ++m) {
    // exact mod 2^32, and the true sum fits int32
    const __m512i c = _mm512_set1_epi32(xc[m]);
    BI_UNROLL for (int j = 0; j < NP; ++j)
      BI_UNROLL for (int h = 0; h < 2; ++h)
        _mm512_storeu_si512((void*)(out + (m * NP + j) * 32 + 16 * h), _mm512_sub_epi32(acc[m][j][h], c));
  }
}
#pragma GCC pop_options

// AMX-INT8: the same exact sums for up to 16 rows and one panel, 16 quads (64 k) per tdpbssd on the codes as
// signed bytes (xq - 128, the VNNI kernel's flipped rows) and the weights as they are. Tiles: 0/1 the sums of
// columns 0-15/16-31, 2 x, 3/4 the weight halves (panel rows are 128 B apart).
struct alignas(64) AmxConfig {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")
// tiles 0-2 of mr rows (the sums and x), 3/4 of 16 (the weights)
static void amx_configure(int mr) {
  AmxConfig c{};
  c.palette = 1;
  const int rows[5] = {mr, mr, mr, 16, 16};
  for (int t = 0; t < 5; ++t) {
    c.rows[t] = (uint8_t)rows[t];
    c.colsb[t] = 64;
  }
  // the whole 64-byte struct as the operand: GCC 12's _tile_loadconfig names only its first 8 bytes, so the
  // compiler may drop the stores of the rest
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
}
// out[m * 32 + col] = sum over nq quads (a multiple of 16) of xs * w, xs the signed codes, for the rows
// amx_configure set
static void linq_amx(const uint8_t* xs, int64_t lds, const int32_t* w, int64_t nq, int32_t* out) {
  __asm__ volatile("" : : : "memory");  // and the tiles load what the caller has written
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t q = 0; q < nq; q += 16) {
    // tile loads do not start the hardware prefetcher's streams as vector loads do: ask for the next step's
    // weights (16 quad rows of 128 B; past the chunk's end that is the next panel's start)
    for (int l = 0; l < 32; ++l) _mm_prefetch((const char*)(w + (q + 16) * 32 + 16 * l), _MM_HINT_T0);
    _tile_loadd(2, xs + 4 * q, lds);
    _tile_loadd(3, w + q * 32, 128);
    _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_dpbssd(0, 2, 3);
    _tile_dpbssd(1, 2, 4);
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  __asm__ volatile("" : : : "memory");  // GCC's tile intrinsics name no memory: the stores above must be seen
}
#pragma GCC pop_options
// one chunk's sums for mr rows: the whole 16-quad steps on tiles, the quads after them on VNNI (fk); xs the
// rows' signed codes, ldq apart; xc the VNNI quads' correction terms per row (the caller's, as they are the same
// for every panel)
static void linq_tiles(const uint8_t* xs, int64_t ldq, const int32_t* w, int64_t pstride, int64_t nq, int mr,
                       LinqFn fk, int32_t* out, const int32_t* xc) {
  const int64_t nt = nq / 16 * 16;
  alignas(64) int32_t rest[MRQ * 32];
  linq_amx(xs, ldq, w, nt, out);
  if (nq == nt) return;
  fk(xs + 4 * nt, ldq, w + nt * 32, pstride, nq - nt, rest, xc);
  for (int m = 0; m < mr; ++m)
    for (int j = 0; j < 32; ++j) out[m * 32 + j] += rest[m * 32 + j];  // exact: the true sums fit int32
}
#elif BI_KERNEL_PASS == 2
enum { MRQ = 2, NPQ = 1 };
BI_INLINE V16 vcvt_i32(const int32_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)p)),
          _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)(p + 8)))};
}
// pmaddwd on 16-bit widened codes: lanes come out as columns 0,1,4,5 | 2,3,6,7 of each 8, put back at the end
template <int MR, int NP>
static void linq_kernel(const uint8_t* xq, int64_t ldq, const int32_t* w, int64_t pstride, int64_t nq,
                        int32_t* out, const int32_t*) {
  __m256i acc[MR][4];
  BI_UNROLL for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 4; ++g) acc[m][g] = _mm256_setzero_si256();
  const __m256i c128 = _mm256_set1_epi16(128);
  for (int64_t q = 0; q < nq; ++q) {
    __m256i a[MR];
    BI_UNROLL for (int m = 0; m < MR; ++m) {
      int32_t quad;
      std::memcpy(&quad, xq + m * ldq + 4 * q, 4);
      a[m] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_set1_epi32(quad)), c128);
    }
    for (int g = 0; g < 4; ++g) {
      const __m256i wb = _mm256_loadu_si256((const __m256i*)(w + q * 32 + 8 * g));
      const __m256i wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(wb));
      const __m256i wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(wb, 1));
      BI_UNROLL for (int m = 0; m < MR; ++m)
        acc[m][g] = _mm256_add_epi32(acc[m][g], _mm256_hadd_epi32(_mm256_madd_epi16(wl, a[m]),
                                                                  _mm256_madd_epi16(wh, a[m])));
    }
  }
  const __m256i idx = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  BI_UNROLL for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 4; ++g)
      _mm256_storeu_si256((__m256i*)(out + m * NP * 32 + 8 * g), _mm256_permutevar8x32_epi32(acc[m][g], idx));
  (void)pstride;
}
#else
enum { MRQ = 2, NPQ = 1 };
BI_INLINE V16 vcvt_i32(const int32_t* p) { V16 r; for (int i = 0; i < 16; ++i) r.v[i] = (float)p[i]; return r; }
template <int MR, int NP>
static void linq_kernel(const uint8_t* xq, int64_t ldq, const int32_t* w, int64_t pstride, int64_t nq,
                        int32_t* out, const int32_t*) {
  BI_UNROLL for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NP * 32; ++j) {
      int32_t acc = 0;
      const int8_t* wc = (const int8_t*)(w + (j / 32) * pstride + j % 32);
      for (int64_t q = 0; q < nq; ++q)
        for (int b = 0; b < 4; ++b) acc += ((int32_t)xq[m * ldq + 4 * q + b] - 128) * (int32_t)wc[q * 128 + b];
      out[m * NP * 32 + j] = acc;
    }
}
#endif

template <bool BF>
BI_INLINE V16 ld(const void* base, int64_t i) {
  if (BF) return vload_bf((const uint16_t*)base + i);
  return vload((const float*)base + i);
}
template <bool BF>
BI_INLINE V16 ld_n(const void* base, int64_t i, int n) {
  if (n == 16) return ld<BF>(base, i);
  if (BF) return vload_bf_n((const uint16_t*)base + i, n);
  return vload_n((const float*)base + i, n);
}
template <bool BF>
BI_INLINE void st_n(void* base, int64_t i, V16 a, int n) {
  if (BF) {
    if (n == 16) vstore_bf((uint16_t*)base + i, a); else vstore_bf_n((uint16_t*)base + i, a, n);
  } else {
    if (n == 16) vstore((float*)base + i, a); else vstore_n((float*)base + i, a, n);
  }
}

// n floats rounded to bf16 (nearest even), as the k-pair kernels multiply x
static void round_row_bf16(const float* src, int64_t n, uint16_t* d) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) vstore_bf(d + k, vload(src + k));
  if (k < n) vstore_bf_n(d + k, vload_n(src + k, (int)(n - k)), (int)(n - k));
}

// One output vector: its sum + bias, stored at (row, col) in y's dtype.
BI_INLINE void out_store(const LinParams& p, V16 o, const V16& bias, int64_t row, int64_t col, int nv) {
  if (p.bias) o = vadd(o, bias);
  if (p.yt == bi::BF16)
    st_n<true>(p.y, row * p.ldy + col, o, nv);
  else
    st_n<false>(p.y, row * p.ldy + col, o, nv);
}

// One output vector from its chunks' partials t[0..nch): the pairwise tree, + bias, stored at (row, col).
BI_INLINE void tree_store(const LinParams& p, V16* t, int nch, const V16& bias, int64_t row, int64_t col, int nv) {
  // level st adds chunk c+st into chunk c (c multiple of 2 st); the chunk counts bi_linear allows are spelled out
  // so the sums stay in registers (a loop over a runtime count keeps them on the stack)
  V16 o;
  switch (nch) {
    case 1: o = t[0]; break;
    case 2: o = vadd(t[0], t[1]); break;
    case 4: o = vadd(vadd(t[0], t[1]), vadd(t[2], t[3])); break;
    case 8: o = vadd(vadd(vadd(t[0], t[1]), vadd(t[2], t[3])), vadd(vadd(t[4], t[5]), vadd(t[6], t[7]))); break;
    default:
      for (int st = 1; st < nch; st *= 2)
        for (int c = 0; c + st < nch; c += 2 * st) t[c] = vadd(t[c], t[c + st]);
      o = t[0];
  }
  out_store(p, o, bias, row, col, nv);
}

// ---- linear microkernel: MR rows x NP panels of 32 columns ----------------------------------------------
// A tile's chains over one chunk are in acc. Not done: the partial goes to acc_out ([MR][NP * 32] fp32) for
// the tree. Done (the call's last chunk): the earlier chunks' partials (acc_out - c * chunk_stride, ...) and
// this one meet in the tree, then + bias, into y.
template <int MR, int NP>
BI_INLINE void lin_finish(const LinParams& p, V16 (&acc)[MR][NP][2], float* acc_out, int64_t chunk_stride, bool done,
                          int64_t m0, int64_t pn0) {
  if (!done) {
    BI_UNROLL for (int m = 0; m < MR; ++m)
      BI_UNROLL for (int j = 0; j < NP; ++j)
        BI_UNROLL for (int h = 0; h < 2; ++h) vstore(acc_out + (m * NP + j) * 32 + 16 * h, acc[m][j][h]);
    return;
  }
  const int nch = p.nchunks;
  BI_UNROLL for (int j = 0; j < NP; ++j)
    BI_UNROLL for (int h = 0; h < 2; ++h) {
      const int64_t col = (pn0 + j) * 32 + 16 * h;
      const int64_t rem = p.N - col;
      if (rem <= 0) continue;
      const int nv = rem >= 16 ? 16 : (int)rem;
      V16 bias = vzero();
      if (p.bias) bias = ld_n<false>(p.bias, col, nv);
      BI_UNROLL for (int m = 0; m < MR; ++m) {
        if (nch == 1) {  // the tree of one chunk: its sum, straight from the register
          out_store(p, acc[m][j][h], bias, m0 + m, col, nv);
          continue;
        }
        // this is chunk nch-1; chunk c's partial sits at acc_out - (nch-1-c) * chunk_stride
        const float* base = acc_out - (nch - 1) * chunk_stride + (m * NP + j) * 32 + 16 * h;
        V16 t[8];
        for (int c = 0; c < nch - 1; ++c) t[c] = vload(base + c * chunk_stride);
        t[nch - 1] = acc[m][j][h];
        tree_store(p, t, nch, bias, m0 + m, col, nv);
      }
    }
}

// 8-bit panels: a chunk's partials, chains over the codes' exact values, times their column's scale (one
// rounding), before the tree
template <int MR, int NP>
BI_INLINE void lin_scale(const LinParams& p, V16 (&acc)[MR][NP][2], int64_t pn0) {
  BI_UNROLL for (int j = 0; j < NP; ++j)
    BI_UNROLL for (int h = 0; h < 2; ++h) {
      const V16 s = vload(p.ws + (pn0 + j) * 32 + 16 * h);
      BI_UNROLL for (int m = 0; m < MR; ++m) acc[m][j][h] = vmul(acc[m][j][h], s);
    }
}

// Denormals flushed in and out (DAZ | FTZ) while a two-fma k-pair chain runs on the AVX-512 pass: vdpbf16ps
// ignores MXCSR and always flushes, so with it the two kernels give the same bits and either may run any tile
struct PairFlush {
#if BI_KERNEL_PASS == 1
  unsigned saved;
  explicit PairFlush(bool on) : saved(_mm_getcsr()) {
    if (on) _mm_setcsr(saved | 0x8040u);
  }
  ~PairFlush() { _mm_setcsr(saved); }
#else
  explicit PairFlush(bool) {}
#endif
};

// Runs the fma chains of an MR x (32 NP) tile over one chunk (`len` consecutive k, chains from +0).
// xv: the tile's x packed k-major at the chunk's first k (fp32 xc[k * MR + m]; for BF16P bf16 k-pairs, the
// pair q of row m at xh[2 (q * MR + m)], even k first, but fp32 with each pair's odd k first on the AVX-512
// pass); w: panel pn0 at that k.
BI_INLINE uint32_t x_pair(const uint16_t* xh, int64_t i) {
  uint32_t u;
  std::memcpy(&u, xh + 2 * i, 4);
  return u;
}

#ifndef BI_PF_PAIRS
#define BI_PF_PAIRS 32  // k-pairs of a BF16P panel (128 B each) fetched ahead
#endif
#ifndef BI_PF_MIN_ROWS
// BF16P tiles prefetch their weights only from this many rows up. A tile of few rows is a pure stream that the
// hardware prefetchers can serve best (explicit prefetches of several panel streams can cost a core a good part
// of its read bandwidth); with many rows the dot products keep the core busy and the prefetches pay.
#define BI_PF_MIN_ROWS 4
#endif
// the BF16P panel's k-pair q + BI_PF_PAIRS into L1, for tiles of MR rows (both halves of its 32 columns), and
// k-pair q + BI_PF_FAR into L2 for tiles of several rows
template <int MR>
BI_INLINE void prefetch_pairs(const uint32_t* wp, int64_t q) {
  if (MR >= BI_PF_MIN_ROWS) {
    _mm_prefetch((const char*)(wp + (q + BI_PF_PAIRS) * 32), _MM_HINT_T0);
    _mm_prefetch((const char*)(wp + (q + BI_PF_PAIRS) * 32 + 16), _MM_HINT_T0);
  }
  if (MR > 1) {
    _mm_prefetch((const char*)(wp + (q + BI_PF_FAR) * 32), _MM_HINT_T1);
    _mm_prefetch((const char*)(wp + (q + BI_PF_FAR) * 32 + 16), _MM_HINT_T1);
  }
}

template <int MR, int NP, int WK>
static void lin_kernel(const LinParams& p, const void* xv, const void* w, int64_t panel_stride, int64_t len,
                       float* acc_out, int64_t chunk_stride, bool done, int64_t m0, int64_t pn0) {
  const float* xc = (const float*)xv;
  V16 acc[MR][NP][2];
  BI_UNROLL for (int m = 0; m < MR; ++m)
    BI_UNROLL for (int j = 0; j < NP; ++j)
      BI_UNROLL for (int h = 0; h < 2; ++h)
        acc[m][j][h] = vzero();
  if (WK == bi::F8 || WK == bi::I8) {  // the chains run over the codes' values; lin_scale scales the partials
    const uint8_t* wp[NP];
    BI_UNROLL for (int j = 0; j < NP; ++j) wp[j] = (const uint8_t*)w + j * panel_stride;
#pragma GCC unroll 2
    for (int64_t k = 0; k < len; ++k) {
      V16 b[NP][2];
      BI_UNROLL for (int j = 0; j < NP; ++j) {
        if (WK == bi::F8) vload_f8x32(wp[j] + k * 32, b[j][0], b[j][1]);
        else vload_i8x32(wp[j] + k * 32, b[j][0], b[j][1]);
        if (k % 2 == 0) _mm_prefetch((const char*)(wp[j] + (k + 32) * 32), _MM_HINT_T0);
      }
      BI_UNROLL for (int m = 0; m < MR; ++m) {
        V16 a = vset1(xc[k * MR + m]);
        BI_UNROLL for (int j = 0; j < NP; ++j) {
          acc[m][j][0] = vfma(a, b[j][0], acc[m][j][0]);
          acc[m][j][1] = vfma(a, b[j][1], acc[m][j][1]);
        }
      }
    }
  } else if (WK == bi::BF16P) {
    // the odd k's fma before the even one's, as vdpbf16ps orders them (lin_kernel_dp). x on the AVX-512 pass: fp32,
    // k-major with each pair's odd k first (linear_tile), xc[2q MR + m] row m's k = 2q + 1, xc[(2q + 1) MR + m] its
    // k = 2q, broadcast from memory; on the others bf16 pairs, widened here
    const PairFlush flush(true);
    const uint16_t* xh = (const uint16_t*)xv;
    const uint32_t* wp[NP];
    BI_UNROLL for (int j = 0; j < NP; ++j) wp[j] = (const uint32_t*)w + j * panel_stride;
#pragma GCC unroll 2
    for (int64_t q = 0; q < len / 2; ++q) {
      V16 bo[NP][2], be[NP][2];
      BI_UNROLL for (int j = 0; j < NP; ++j) {
        vload_bfpair(wp[j] + q * 32, bo[j][0], be[j][0]);
        vload_bfpair(wp[j] + q * 32 + 16, bo[j][1], be[j][1]);
        prefetch_pairs<MR>(wp[j], q);
      }
      BI_UNROLL for (int m = 0; m < MR; ++m) {
        V16 ao, ae;
        if (BI_KERNEL_PASS == 1) {
          ao = vset1(xc[2 * q * MR + m]);
          ae = vset1(xc[(2 * q + 1) * MR + m]);
        } else {
          const uint32_t u = x_pair(xh, q * MR + m);
          ao = vset1(u2f(u & 0xFFFF0000u));
          ae = vset1(u2f(u << 16));
        }
        BI_UNROLL for (int j = 0; j < NP; ++j)
          BI_UNROLL for (int h = 0; h < 2; ++h) acc[m][j][h] = vfma(ae, be[j][h], vfma(ao, bo[j][h], acc[m][j][h]));
      }
    }
  } else if (WK == bi::BF16) {
    const uint32_t* wp[NP];
    BI_UNROLL for (int j = 0; j < NP; ++j) wp[j] = (const uint32_t*)w + j * panel_stride;
#pragma GCC unroll 4
    for (int64_t k = 0; k < len; ++k) {
      V16 b[NP][2];
      BI_UNROLL for (int j = 0; j < NP; ++j) {
        vload_bfpair(wp[j] + k * 16, b[j][0], b[j][1]);
        _mm_prefetch((const char*)(wp[j] + (k + 16) * 16), _MM_HINT_T0);  // one line per k, 1 KiB ahead
        if (MR > 1) _mm_prefetch((const char*)(wp[j] + (k + 2 * BI_PF_FAR) * 16), _MM_HINT_T1);  // and into L2
      }
      BI_UNROLL for (int m = 0; m < MR; ++m) {
        V16 a = vset1(xc[k * MR + m]);
        BI_UNROLL for (int j = 0; j < NP; ++j) {
          acc[m][j][0] = vfma(a, b[j][0], acc[m][j][0]);
          acc[m][j][1] = vfma(a, b[j][1], acc[m][j][1]);
        }
      }
    }
  } else {
    const float* wp[NP];
    BI_UNROLL for (int j = 0; j < NP; ++j) wp[j] = (const float*)w + j * panel_stride;
#pragma GCC unroll 4
    for (int64_t k = 0; k < len; ++k) {
      V16 b[NP][2];
      BI_UNROLL for (int j = 0; j < NP; ++j) {
        b[j][0] = vload(wp[j] + k * 32);
        b[j][1] = vload(wp[j] + k * 32 + 16);
        _mm_prefetch((const char*)(wp[j] + (k + 8) * 32), _MM_HINT_T0);
        _mm_prefetch((const char*)(wp[j] + (k + 8) * 32 + 16), _MM_HINT_T0);
      }
      BI_UNROLL for (int m = 0; m < MR; ++m) {
        V16 a = vset1(xc[k * MR + m]);
        BI_UNROLL for (int j = 0; j < NP; ++j) {
          acc[m][j][0] = vfma(a, b[j][0], acc[m][j][0]);
          acc[m][j][1] = vfma(a, b[j][1], acc[m][j][1]);
        }
      }
    }
  }
  if (WK == bi::F8 || WK == bi::I8) lin_scale<MR, NP>(p, acc, pn0);
  lin_finish<MR, NP>(p, acc, acc_out, chunk_stride, done, m0, pn0);
}

typedef void (*LinKernelFn)(const LinParams&, const void*, const void*, int64_t, int64_t, float*, int64_t, bool,
                            int64_t, int64_t);

#if BI_KERNEL_PASS == 1
#pragma GCC push_options
#pragma GCC target("avx512bf16")
// BF16P where the CPU has AVX512-BF16: one vdpbf16ps is lin_kernel's two fmas of a k-pair (odd k first, the
// products exact), at one instruction per 32 multiply-adds
template <int MR, int NP>
static void lin_kernel_dp(const LinParams& p, const void* xv, const void* w, int64_t panel_stride, int64_t len,
                          float* acc_out, int64_t chunk_stride, bool done, int64_t m0, int64_t pn0) {
  V16 acc[MR][NP][2];
  BI_UNROLL for (int m = 0; m < MR; ++m)
    BI_UNROLL for (int j = 0; j < NP; ++j)
      BI_UNROLL for (int h = 0; h < 2; ++h) acc[m][j][h] = vzero();
  const uint16_t* xh = (const uint16_t*)xv;
  const uint32_t* wp[NP];
  BI_UNROLL for (int j = 0; j < NP; ++j) wp[j] = (const uint32_t*)w + j * panel_stride;
#pragma GCC unroll 2
  for (int64_t q = 0; q < len / 2; ++q) {
    __m512bh b[NP][2];
    BI_UNROLL for (int j = 0; j < NP; ++j) {
      b[j][0] = (__m512bh)_mm512_loadu_si512((const void*)(wp[j] + q * 32));
      b[j][1] = (__m512bh)_mm512_loadu_si512((const void*)(wp[j] + q * 32 + 16));
      prefetch_pairs<MR>(wp[j], q);
    }
    BI_UNROLL for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)x_pair(xh, q * MR + m));
      BI_UNROLL for (int j = 0; j < NP; ++j)
        BI_UNROLL for (int h = 0; h < 2; ++h) acc[m][j][h].v = _mm512_dpbf16_ps(acc[m][j][h].v, a, b[j][h]);
    }
  }
  lin_finish<MR, NP>(p, acc, acc_out, chunk_stride, done, m0, pn0);
}
#pragma GCC pop_options
static bool cpu_dpbf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
// whether a BF16P tile of mr rows runs on vdpbf16ps (lin_kernel_dp) rather than lin_kernel's two fmas, and a bf16
// model's attention (its items hold several queries) on vdpbf16ps rather than its chains' two fmas
static bool pairs_dp(int mr) { return cpu_dpbf16() && !(mr == 1 ? bi::pairs_row_on_fmas() : bi::pairs_on_fmas()); }
static bool attn_pairs_dp() { return cpu_dpbf16() && !bi::pairs_on_fmas(); }
#endif

#if BI_KERNEL_PASS == 2
// fp32 / bf16 / 8-bit panels on AVX2: the 2 x 16 columns of a panel as two passes over a block of k, each with
// one 16-column half's accumulators (2 MR), its two widened weight vectors (and an 8-bit panel's two scale
// vectors) and a broadcast in 16 registers, so a weight is loaded (and widened) once per MR rows; the second
// half's lines come from L1. The chains, and so the bits, are lin_kernel's.
template <int MR, int WK>
static void lin_kernel_half(const LinParams& p, const void* xv, const void* w, int64_t panel_stride, int64_t len,
                            float* acc_out, int64_t chunk_stride, bool done, int64_t m0, int64_t pn0) {
  (void)panel_stride;
  constexpr int64_t KB = 64;
  const float* xc = (const float*)xv;
  const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
  V16 acc[MR][1][2];
  BI_UNROLL for (int m = 0; m < MR; ++m) acc[m][0][0] = acc[m][0][1] = vzero();
  constexpr bool bytes = WK == bi::F8 || WK == bi::I8;
  for (int64_t k0 = 0; k0 < len; k0 += KB) {
    const int64_t k1 = std::min(len, k0 + KB);
    for (int g = 0; g < 2; ++g) {
      // F32: half g is columns 16g..16g+15 (acc[.][0][g]); BF16: u32 lanes 8g..8g+7 hold columns 8g.. (high
      // halves, acc[.][0][0]) and 16+8g.. (low halves, acc[.][0][1]), the .lo (g = 0) or .hi (g = 1) vectors
      __m256* r0[MR];
      __m256* r1[MR];
      for (int m = 0; m < MR; ++m) {
        if (WK != bi::BF16) { r0[m] = &acc[m][0][g].lo; r1[m] = &acc[m][0][g].hi; }
        else { r0[m] = g ? &acc[m][0][0].hi : &acc[m][0][0].lo; r1[m] = g ? &acc[m][0][1].hi : &acc[m][0][1].lo; }
      }
      __m256 a0[MR], a1[MR];
      for (int m = 0; m < MR; ++m) { a0[m] = *r0[m]; a1[m] = *r1[m]; }
#pragma GCC unroll 2
      for (int64_t k = k0; k < k1; ++k) {
        __m256 w0, w1;
        if (WK == bi::F32) {
          const float* q = (const float*)w + k * 32 + 16 * g;
          w0 = _mm256_loadu_ps(q);
          w1 = _mm256_loadu_ps(q + 8);
          if (g == 0) {
            _mm_prefetch((const char*)((const float*)w + (k + 8) * 32), _MM_HINT_T0);
            _mm_prefetch((const char*)((const float*)w + (k + 8) * 32 + 16), _MM_HINT_T0);
          }
        } else if (bytes) {  // the codes' values (lin_scale scales the partials)
          const uint8_t* q = (const uint8_t*)w + k * 32 + 16 * g;
          V16 c;
          if (WK == bi::F8) c = f8_half16(q);
          else c = {i8x8(q), i8x8(q + 8)};
          w0 = c.lo;
          w1 = c.hi;
          if (g == 0 && k % 2 == 0) _mm_prefetch((const char*)((const uint8_t*)w + (k + 32) * 32), _MM_HINT_T0);
        } else {
          const __m256i u = _mm256_loadu_si256((const __m256i*)((const uint32_t*)w + k * 16 + 8 * g));
          w0 = _mm256_castsi256_ps(_mm256_and_si256(u, hi16));
          w1 = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
          if (g == 0) _mm_prefetch((const char*)((const uint32_t*)w + (k + 16) * 16), _MM_HINT_T0);
        }
        for (int m = 0; m < MR; ++m) {
          const __m256 a = _mm256_broadcast_ss(xc + k * MR + m);
          a0[m] = _mm256_fmadd_ps(a, w0, a0[m]);
          a1[m] = _mm256_fmadd_ps(a, w1, a1[m]);
        }
      }
      for (int m = 0; m < MR; ++m) { *r0[m] = a0[m]; *r1[m] = a1[m]; }
    }
  }
  if (bytes) lin_scale<MR, 1>(p, acc, pn0);
  lin_finish<MR, 1>(p, acc, acc_out, chunk_stride, done, m0, pn0);
}
#endif

template <int MR, int WK>
static LinKernelFn lin_pick_np(int np) {
#if BI_KERNEL_PASS == 1
  if (WK == bi::BF16P && pairs_dp(MR)) {
    if (np >= 4 && MR * 4 * 2 <= 2 * MR_MAX) return &lin_kernel_dp<MR, 4>;
    if (np >= 2 && MR * 2 * 2 <= 2 * MR_MAX) return &lin_kernel_dp<MR, 2>;
    return &lin_kernel_dp<MR, 1>;
  }
#endif
#if BI_KERNEL_PASS == 2
  // from 3 rows (6 chains of FMAs in flight); 2 rows fit lin_kernel in registers with 8
  if (WK != bi::BF16P && MR > 2) return &lin_kernel_half<MR, WK>;  // np_for(MR) == 1
#endif
  if (np >= 4 && MR * 4 * 2 <= 2 * MR_MAX) return &lin_kernel<MR, 4, WK>;
  if (np >= 2 && MR * 2 * 2 <= 2 * MR_MAX) return &lin_kernel<MR, 2, WK>;
  return &lin_kernel<MR, 1, WK>;
}

template <int WK>
static LinKernelFn lin_pick(int mr, int np) {
  switch (mr) {
    case 1: return lin_pick_np<1, WK>(np);
    case 2: return lin_pick_np<2, WK>(np);
    case 3: return lin_pick_np<3, WK>(np);
    case 4: return lin_pick_np<4, WK>(np);
#if BI_KERNEL_PASS != 3
    case 5: return lin_pick_np<5, WK>(np);
    case 6: return lin_pick_np<6, WK>(np);
#endif
#if BI_KERNEL_PASS == 1
    case 7: return lin_pick_np<7, WK>(np);
    case 8: return lin_pick_np<8, WK>(np);
    case 9: return lin_pick_np<9, WK>(np);
    case 10: return lin_pick_np<10, WK>(np);
    case 11: return lin_pick_np<11, WK>(np);
    case 12: return lin_pick_np<12, WK>(np);
    case 13: return lin_pick_np<13, WK>(np);
    case 14: return lin_pick_np<14, WK>(np);
#endif
    default: return nullptr;
  }
}

static int np_of(int mr, int want) {
  // the NP a kernel instantiation really has (mirrors lin_pick_np)
  if (want >= 4 && mr * 4 * 2 <= 2 * MR_MAX) return 4;
  if (want >= 2 && mr * 2 * 2 <= 2 * MR_MAX) return 2;
  return 1;
}

static void linear_tile_q(const LinParams& p, int64_t m0, int64_t m1, int64_t pn0, int64_t pn1);

#if BI_KERNEL_PASS == 1
// d[q * 8 + m] = rows[m][q] for q < nq: 8 rows of bf16 k-pairs interleaved as an 8-row tile reads them, 16
// pairs of every row at a time by three rounds of two-source permutes, where an element-wise copy takes a load
// and a store per pair
static void interleave_pairs8(const uint32_t* const* rows, int64_t nq, uint32_t* d) {
  // round r merges two vectors of [q][g] (g rows each) into two of [q][2g]: element e of the output holding
  // q's from q0 on is, with j = e / (2g) and s = e % (2g), row s of q0 + j, from the first source where s < g
  auto index = [](int g, int q0) {
    alignas(64) int32_t ix[16];
    for (int e = 0; e < 16; ++e) {
      const int j = e / (2 * g) + q0, s = e % (2 * g);
      ix[e] = s < g ? j * g + s : 16 + j * g + s - g;
    }
    return _mm512_load_si512((const void*)ix);
  };
  static const __m512i i1[2] = {index(1, 0), index(1, 8)}, i2[2] = {index(2, 0), index(2, 4)},
                       i3[2] = {index(4, 0), index(4, 2)};
  int64_t q = 0;
  for (; q + 16 <= nq; q += 16) {
    __m512i r[8], a[8], b[8];
    for (int m = 0; m < 8; ++m) r[m] = _mm512_loadu_si512((const void*)(rows[m] + q));
    for (int i = 0; i < 4; ++i)  // a[i][h]: q's 8h.. of rows 2i, 2i+1
      for (int h = 0; h < 2; ++h) a[2 * i + h] = _mm512_permutex2var_epi32(r[2 * i], i1[h], r[2 * i + 1]);
    for (int i = 0; i < 2; ++i)  // b[i][h][k]: q's 8h + 4k.. of rows 4i..4i+3
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 2; ++k)
          b[4 * i + 2 * h + k] = _mm512_permutex2var_epi32(a[4 * i + h], i2[k], a[4 * i + 2 + h]);
    for (int hk = 0; hk < 4; ++hk)  // q's 4 hk + 2 l.. of all 8 rows
      for (int l = 0; l < 2; ++l)
        _mm512_storeu_si512((void*)(d + (q + 4 * hk + 2 * l) * 8),
                            _mm512_permutex2var_epi32(b[hk], i3[l], b[4 + hk]));
  }
  for (; q < nq; ++q)
    for (int m = 0; m < 8; ++m) std::memcpy(d + q * 8 + m, rows[m] + q, 4);
}

// 8 rows of bf16 k-pairs as an 8-row tile of lin_kernel's two fmas reads them: fp32, k-major, each pair's odd k
// first (d[2q 8 + m] = row m's k = 2q + 1, d[(2q + 1) 8 + m] its k = 2q), from interleave_pairs8's order
static void split_pairs8(const uint32_t* const* rows, int64_t nq, float* d) {
  thread_local std::vector<uint32_t> il;
  if ((int64_t)il.size() < nq * 8) il.resize(nq * 8);
  interleave_pairs8(rows, nq, il.data());
  const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
  int64_t q = 0;
  for (; q + 2 <= nq; q += 2) {  // pairs q and q + 1 of the 8 rows
    const __m512i v = _mm512_loadu_si512((const void*)(il.data() + q * 8));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    _mm512_storeu_ps(d + q * 16, _mm512_shuffle_f32x4(odd, even, 0x44));
    _mm512_storeu_ps(d + q * 16 + 16, _mm512_shuffle_f32x4(odd, even, 0xEE));
  }
  for (; q < nq; ++q)
    for (int m = 0; m < 8; ++m) {
      d[2 * q * 8 + m] = u2f(il[q * 8 + m] & 0xFFFF0000u);
      d[(2 * q + 1) * 8 + m] = u2f(il[q * 8 + m] << 16);
    }
}

// one row's the same way: d[2q] = k 2q + 1, d[2q + 1] = k 2q (each pair's halves swapped, then widened)
static void split_pairs1(const uint32_t* row, int64_t nq, float* d) {
  int64_t q = 0;
  for (; q + 16 <= nq; q += 16) {
    const __m512i v = _mm512_rol_epi32(_mm512_loadu_si512((const void*)(row + q)), 16);
    _mm512_storeu_si512((void*)(d + 2 * q), _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
    _mm512_storeu_si512((void*)(d + 2 * q + 16),
                        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
  }
  for (; q < nq; ++q) {
    d[2 * q] = u2f(row[q] & 0xFFFF0000u);
    d[2 * q + 1] = u2f(row[q] << 16);
  }
}
#endif

#if BI_KERNEL_PASS == 1
// BF16P on AMX-BF16 tiles (the amx path, where the CPU has AMX-BF16), at every row count: per panel and chunk,
// 16 k-pairs of up to 16 rows per tdpbf16ps, the chunk's k-pairs after its last whole 16 continuing the tile's
// sums on vdpbf16ps, then the tree. tdpbf16ps rounds its sums in an order of its own (it matches no chain another
// CPU runs), so a bf16 model's bits here are this path's; each row's result still depends on that row alone (not
// on the rows beside it, their count, or the threads), which is what DFlash = AR needs. Tiles 0/1 hold the sums
// of columns 0-15 / 16-31, 2 the x rows, 3/4 the weights.
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512bf16")
static void pairs_amx(const uint16_t* x, int64_t ldxb, const uint32_t* w, int64_t nt, float* out) {
  __asm__ volatile("" : : : "memory");  // and the tiles load what the caller has written
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t q = 0; q < nt; q += 16) {
    // tile loads do not start the hardware prefetcher's streams: ask for the next step's 16 pairs (2 KiB)
    for (int l = 0; l < 32; ++l) _mm_prefetch((const char*)(w + (q + 16) * 32 + 16 * l), _MM_HINT_T0);
    _tile_loadd(3, w + q * 32, 128);
    _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_loadd(2, x + 2 * q, ldxb);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  __asm__ volatile("" : : : "memory");  // GCC's tile intrinsics name no memory: the stores above must be seen
}
// the pairs [q0, q1) of mr rows (x at pair 0, rows ldx apart) added to the sums in out ([mr][32]) on vdpbf16ps
static void pairs_rest(const uint16_t* x, int64_t ldx, int mr, const uint32_t* w, int64_t q0, int64_t q1,
                       float* out) {
  for (int m = 0; m < mr; ++m) {
    __m512 a0 = _mm512_loadu_ps(out + m * 32), a1 = _mm512_loadu_ps(out + m * 32 + 16);
    for (int64_t q = q0; q < q1; ++q) {
      uint32_t xp;
      std::memcpy(&xp, x + m * ldx + 2 * q, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)xp);
      a0 = _mm512_dpbf16_ps(a0, a, (__m512bh)_mm512_loadu_si512((const void*)(w + q * 32)));
      a1 = _mm512_dpbf16_ps(a1, a, (__m512bh)_mm512_loadu_si512((const void*)(w + q * 32 + 16)));
    }
    _mm512_storeu_ps(out + m * 32, a0);
    _mm512_storeu_ps(out + m * 32 + 16, a1);
  }
}
#pragma GCC pop_options

static void linear_tile_amx_pairs(const LinParams& p, int64_t m0, int64_t m1, int64_t pn0, int64_t pn1) {
  const int64_t cl = p.chunk_len, nq = cl / 2, nt = nq / 16 * 16;
  const int nch = p.nchunks;
  const int64_t kx = cl * nch;
  // x as bf16 rows: a bf16 x as given, a float x rounded (nearest even) into a per-thread buffer
  const uint16_t* xr;
  int64_t ldx;
  thread_local std::vector<uint16_t> hbuf;
  if (p.xh) {
    xr = p.xh + m0 * p.ldx + p.xk0;
    ldx = p.ldx;
  } else {
    if ((int64_t)hbuf.size() < (m1 - m0) * kx) hbuf.resize((m1 - m0) * kx);
    for (int64_t m = m0; m < m1; ++m) round_row_bf16(p.x + m * p.ldx + p.xk0, kx, hbuf.data() + (m - m0) * kx);
    xr = hbuf.data();
    ldx = kx;
  }
  // balanced blocks of <= 16 rows (row_block), all on the same tiles, shaped for the largest (blocks of two sizes
  // on tiles of their own, alternating between them, run markedly slower)
  const int64_t rows = m1 - m0, nb = (rows + 15) / 16;
  const int base = (int)(rows / nb), extra = (int)(rows % nb);
  amx_configure(base + (extra ? 1 : 0));
  alignas(64) float part[8][16 * 32];
  const uint32_t* w0 = (const uint32_t*)p.w + p.wk0 / 2 * 32;
  const int64_t pstride = p.K / 2 * 32;
  for (int64_t g = pn0; g < pn1; ++g) {
    const uint32_t* wg = w0 + g * pstride;
    for (int64_t b = 0; b < nb; ++b) {
      int64_t r;
      const int mr = row_block(b, nb, base, extra, r);
      const uint16_t* xb = xr + r * ldx;
      for (int c = 0; c < nch; ++c) {
        const uint32_t* wc = wg + c * nq * 32;
        pairs_amx(xb + c * cl, ldx * 2, wc, nt, part[c]);
        if (nt < nq) pairs_rest(xb + c * cl, ldx, mr, wc, nt, nq, part[c]);
      }
      for (int h = 0; h < 2; ++h) {
        const int64_t col = g * 32 + 16 * h, rem = p.N - col;
        if (rem <= 0) continue;
        const int nv = rem >= 16 ? 16 : (int)rem;
        const V16 bias = p.bias ? ld_n<false>(p.bias, col, nv) : vzero();
        for (int m = 0; m < mr; ++m) {
          V16 t[8];
          for (int c = 0; c < nch; ++c) t[c] = vload(part[c] + m * 32 + 16 * h);
          tree_store(p, t, nch, bias, m0 + r + m, col, nv);
        }
      }
    }
  }
}
#endif

static void linear_tile(const LinParams& p, int64_t m0, int64_t m1, int64_t pn0, int64_t pn1) {
#if BI_KERNEL_PASS == 1
  if (p.wt == bi::BF16P && bi::amx_bf16_active()) return linear_tile_amx_pairs(p, m0, m1, pn0, pn1);
#endif
  if (p.wt == bi::I8Q) return linear_tile_q(p, m0, m1, pn0, pn1);
  // rows in cache blocks (x block ~ 768 KiB), each block in balanced tiles of <= mr_max_for(wt) rows; per group of
  // NP panels (which stays in L2), every tile of the block runs its chunks' chains, the last one the tree.
  // (k blocks keeping a weight slice in L1 across the tiles measured no faster here.)
  const int64_t cl = p.chunk_len;
  const int nch = p.nchunks;
  const int64_t kx = cl * nch;
  int64_t mb = (768 * 1024) / (4 * std::max<int64_t>(kx, 1));
  const int mrmax = mr_max_for(p.wt);
  mb = std::max<int64_t>(mrmax, (mb / mrmax) * mrmax);
  // bytes of one k of a panel: 32 floats, 16 u32 bf16 pairs, or 32 e4m3 / int8 bytes; the kernels' panel
  // stride is in elements of their pointer type (4 bytes, 4 bytes, 1 byte)
  const bool bytes = p.wt == bi::F8 || p.wt == bi::I8;
  const bool pairs = p.wt == bi::BF16P;
  const int64_t kbytes = p.wt == bi::F32 ? 128 : (p.wt == bi::BF16 || pairs ? 64 : 32);
  const int64_t pstride = p.K * (bytes ? 32 : kbytes / 4);
  // a tile's x as fp32 (lin_kernel's k-pairs on the AVX-512 pass) or as bf16 pairs; bytes of one k of its rows
  auto split = [&](int mr) {
#if BI_KERNEL_PASS == 1
    return pairs && !pairs_dp(mr);
#else
    (void)mr;
    return false;
#endif
  };
  auto xsize = [&](int mr) -> int64_t { return pairs && !split(mr) ? 2 : 4; };
  thread_local std::vector<float> xbuf, abuf;
  thread_local std::vector<uint16_t> hbuf, hrow;
  for (int64_t b0 = m0; b0 < m1; b0 += mb) {
    const int64_t rows = std::min(mb, m1 - b0);
    const int64_t nt = (rows + mrmax - 1) / mrmax;
    const int base = (int)(rows / nt), extra = (int)(rows % nt);
    int npw = np_for(extra ? base + 1 : base);
#if BI_KERNEL_PASS == 2
    // 8-bit panels keep their widened codes in registers too: 16 ymm registers hold the accumulators of one
    // panel, not two (with two, accumulator chains spill through the stack; measured slower for one row as
    // well). Which panels share a call never changes a result.
    if (bytes) npw = 1;
#endif
    // pack the block's tiles k-major (a 1-row fp32 tile is its own packing)
    const void* xt0 = p.x ? p.x + b0 * p.ldx + p.xk0 : nullptr;
    if (pairs) {  // x rounded to bf16 (nearest even): k-pairs of each row interleaved over the tile's rows, or split
      if ((int64_t)hbuf.size() < 2 * rows * kx) hbuf.resize(2 * rows * kx);
      if ((int64_t)hrow.size() < kx) hrow.resize(kx);
      uint16_t* d = hbuf.data();
      int64_t r = b0;
      for (int64_t t = 0; t < nt; ++t) {
        const int mr = base + (t < extra ? 1 : 0);
        if (split(mr)) {
          float* ds = (float*)d;
          auto row = [&](int m) {
            if (p.xh) return p.xh + (r + m) * p.ldx + p.xk0;
            round_row_bf16(p.x + (r + m) * p.ldx + p.xk0, kx, hrow.data());
            return (const uint16_t*)hrow.data();
          };
#if BI_KERNEL_PASS == 1
          if (mr == 8 && p.xh) {
            const uint32_t* rows8[8];
            for (int m = 0; m < 8; ++m) rows8[m] = (const uint32_t*)row(m);
            split_pairs8(rows8, kx / 2, ds);
          } else if (mr == 1) {
            split_pairs1((const uint32_t*)row(0), kx / 2, ds);
          } else
#endif
            for (int m = 0; m < mr; ++m) {
              const uint16_t* h = row(m);
              for (int64_t q = 0; q < kx / 2; ++q) {
                ds[2 * q * mr + m] = u2f(uint32_t(h[2 * q + 1]) << 16);
                ds[(2 * q + 1) * mr + m] = u2f(uint32_t(h[2 * q]) << 16);
              }
            }
          d += 2 * mr * kx;
          r += mr;
          continue;
        }
#if BI_KERNEL_PASS == 1
        if (mr == 8 && p.xh) {  // a verify block's rows, as they are
          const uint32_t* rows8[8];
          for (int m = 0; m < 8; ++m) rows8[m] = (const uint32_t*)(p.xh + (r + m) * p.ldx + p.xk0);
          interleave_pairs8(rows8, kx / 2, (uint32_t*)d);
          d += mr * kx;
          r += mr;
          continue;
        }
#endif
        for (int m = 0; m < mr; ++m) {
          const uint16_t* h;
          if (p.xh) {
            h = p.xh + (r + m) * p.ldx + p.xk0;
            if (mr == 1) std::memcpy(d, h, kx * 2);
          } else {
            uint16_t* hw = mr == 1 ? d : hrow.data();
            round_row_bf16(p.x + (r + m) * p.ldx + p.xk0, kx, hw);
            h = hw;
          }
          if (mr > 1)
            for (int64_t q = 0; q < kx / 2; ++q) std::memcpy(d + 2 * (q * mr + m), h + 2 * q, 4);
        }
        d += mr * kx;
        r += mr;
      }
      xt0 = hbuf.data();
    } else if (rows > 1) {
      if ((int64_t)xbuf.size() < rows * kx) xbuf.resize(rows * kx);
      float* d = xbuf.data();
      int64_t r = b0;
      for (int64_t t = 0; t < nt; ++t) {
        const int mr = base + (t < extra ? 1 : 0);
        const float* src = p.x + r * p.ldx + p.xk0;
        for (int64_t k = 0; k < kx; ++k)
          for (int m = 0; m < mr; ++m) d[k * mr + m] = src[m * p.ldx + k];
        d += mr * kx;
        r += mr;
      }
      xt0 = xbuf.data();
    }
    // chunk partials of one tile: [chunk][MR_MAX][4 * 32]
    const int64_t cstride = MR_MAX * 4 * 32;
    if ((int64_t)abuf.size() < nch * cstride) abuf.resize(nch * cstride);
    for (int64_t g = pn0; g < pn1;) {
      int np = np_of(extra ? base + 1 : base, (int)std::min<int64_t>(npw, pn1 - g));
      np = std::min(np, np_of(base, np));
      auto pick = [&](int mr) {
        switch (p.wt) {
          case bi::F8: return lin_pick<bi::F8>(mr, np);
          case bi::I8: return lin_pick<bi::I8>(mr, np);
          case bi::BF16: return lin_pick<bi::BF16>(mr, np);
          case bi::BF16P: return lin_pick<bi::BF16P>(mr, np);
          default: return lin_pick<bi::F32>(mr, np);
        }
      };
      LinKernelFn fk[2] = {pick(base), pick(base + 1)};
      const char* wg = (const char*)p.w + g * p.K * kbytes;
      const char* xt = (const char*)xt0;
      int64_t r = b0;
      for (int64_t t = 0; t < nt; ++t) {
        const int mr = base + (t < extra ? 1 : 0);
        for (int c = 0; c < nch; ++c) {
          const int64_t kw = p.wk0 + c * cl;  // k within the packed weight
          fk[t < extra ? 1 : 0](p, xt + c * cl * mr * xsize(mr), wg + kw * kbytes, pstride, cl,
                                abuf.data() + c * cstride, cstride, c == nch - 1, r, g);
        }
        xt += mr * kx * xsize(mr);
        r += mr;
      }
      g += np;
    }
  }
}

// W8A8: tiles of <= MRQ rows x NPQ panels; per chunk the exact integer sums, then per output element
// (float(isum) * sx[row][chunk]) * w_scale, the tree over chunks and the bias. Any tiling gives the same sums.
template <int NP>
static LinqFn linq_pick(int mr) {
  switch (mr) {
#define BI_LINQ_CASE(R) case R: if (R <= MRQ) return &linq_kernel<(R <= MRQ ? R : 1), NP>; break;
    BI_LINQ_CASE(1) BI_LINQ_CASE(2) BI_LINQ_CASE(3) BI_LINQ_CASE(4) BI_LINQ_CASE(5) BI_LINQ_CASE(6)
    BI_LINQ_CASE(7) BI_LINQ_CASE(8) BI_LINQ_CASE(9) BI_LINQ_CASE(10) BI_LINQ_CASE(11) BI_LINQ_CASE(12)
#undef BI_LINQ_CASE
    default: break;
  }
  return nullptr;
}

// W8A8 output of panel g for rows r .. r + mr - 1 from the chunks' exact sums (ib: [chunk][row][32], chunks cs
// apart): per chunk float(sum) * row scale * column scale, the pairwise tree over chunks, + bias. NCH: the
// chunk count as a constant, or 0 for p.nchunks
template <int NCH>
BI_INLINE void linq_epilogue(const LinParams& p, const int32_t* ib, int64_t cs, int64_t g, int64_t r, int mr) {
  const int nch = NCH ? NCH : p.nchunks;
  for (int h = 0; h < 2; ++h) {
    const int64_t col = g * 32 + 16 * h;
    const int64_t rem = p.N - col;
    if (rem <= 0) continue;
    const int nv = rem >= 16 ? 16 : (int)rem;
    const V16 sw = vload(p.ws + col);
    V16 bias = vzero();
    if (p.bias) bias = ld_n<false>(p.bias, col, nv);
    for (int m = 0; m < mr; ++m) {
      V16 t[NCH ? NCH : 8];
      BI_UNROLL for (int c = 0; c < nch; ++c)
        t[c] = vmul(vmul(vcvt_i32(ib + c * cs + m * 32 + 16 * h), vset1(p.xs[(r + m) * nch + c])), sw);
      tree_store(p, t, nch, bias, r + m, col, nv);
    }
  }
}

static void linear_tile_q(const LinParams& p, int64_t m0, int64_t m1, int64_t pn0, int64_t pn1) {
#if BI_KERNEL_PASS == 1
  static const bool vnni = __builtin_cpu_supports("avx512vnni");
  if (!vnni) return bi::g_linq_avx2(p, m0, m1, pn0, pn1);
  const bool amx = bi::amx_active();
#else
  const bool amx = false;
#endif
  const int64_t cl = p.chunk_len, nq = cl / 4;
  const int nch = p.nchunks;
  const int64_t pstride = (p.K / 4) * 32;  // int32 per panel
  const int64_t cs = (int64_t)(BI_KERNEL_PASS == 1 ? 16 : MRQ) * NPQ * 32;  // AMX tiles: up to 16 rows
  thread_local std::vector<int32_t> ib;
  if ((int64_t)ib.size() < nch * cs) ib.resize(nch * cs);
  int32_t* const ibp = ib.data();  // hoisted: a thread_local's address is a call away
  const int32_t* w0 = (const int32_t*)p.w;
  const int64_t rows = m1 - m0;
  // AMX tiles pay from 8 rows (a verify block) on, where a chunk is whole 16-quad steps or several of them (a few
  // quads past one step cost more on VNNI beside it than the step saves: the greedy head's screen, chunks of 18
  // quads)
  const bool amx_chunks = amx && (nq % 16 == 0 || nq >= 64);
  // balanced tiles of <= MRQ rows (32 rows: 11 + 11 + 10, not 12 + 12 + 8); of <= 16 on AMX tiles where no quads
  // run on VNNI beside them (its kernels take at most MRQ rows)
  const int64_t rmax = amx_chunks && nq % 16 == 0 && rows >= 8 ? 16 : MRQ;
  const int64_t nt = (rows + rmax - 1) / rmax;
  const int base = (int)(rows / nt), extra = (int)(rows % nt);
  const LinqFn fk_base = linq_pick<NPQ>(base), fk_extra = extra ? linq_pick<NPQ>(base + 1) : nullptr;
  const uint8_t* xrows = p.xq + m0 * p.ldq;  // row m0's codes (the VNNI kernel's: flipped, below)
  // one panel of one tile: the chunks' exact sums, then per output element the scales and the tree over chunks
  auto run = [&](int64_t g, int64_t r, int mr, LinqFn fk, bool tiles, const int32_t* xc) {
    for (int c = 0; c < nch; ++c) {
      const uint8_t* xk = xrows + (r - m0) * p.ldq + c * cl;
      const int32_t* wc = w0 + g * pstride + ((p.wk0 + c * cl) / 4) * 32;
#if BI_KERNEL_PASS == 1
      if (tiles) {
        linq_tiles(xk, p.ldq, wc, pstride, nq, mr, fk, ibp + c * cs, xc ? xc + c * MRQ : nullptr);
        continue;
      }
#else
      (void)tiles;
#endif
      fk(xk, p.ldq, wc, pstride, nq, ibp + c * cs, xc ? xc + c * rows : nullptr);
    }
    switch (nch) {  // the chunk counts bi_linear allows, as constants: the partials stay in registers
      case 1: return linq_epilogue<1>(p, ibp, cs, g, r, mr);
      case 2: return linq_epilogue<2>(p, ibp, cs, g, r, mr);
      case 4: return linq_epilogue<4>(p, ibp, cs, g, r, mr);
      case 8: return linq_epilogue<8>(p, ibp, cs, g, r, mr);
      default: return linq_epilogue<0>(p, ibp, cs, g, r, mr);
    }
  };
  // The rows' codes as signed bytes (the VNNI kernel's broadcast operand, the AMX tiles' x: quantize_rows wrote
  // them) and, for VNNI, their correction terms, once per row and chunk for all panels ([chunk][row])
  const int32_t* xc = nullptr;
#if BI_KERNEL_PASS == 1
  thread_local std::vector<int32_t> xcb;
  xrows = p.xsq + m0 * p.ldq;
#endif
  if (amx_chunks && base >= 8) {
    // every row block (row_block) runs on a panel before the next panel (which so stays in cache for all of
    // them), on one tile shape, the largest block's
#if BI_KERNEL_PASS == 1
    amx_configure(base + (extra ? 1 : 0));  // per call: other code (oneDNN) may have loaded its own tiles
    // the correction terms of the quads after the last whole 16-quad step, once per block and chunk for all
    // panels ([block][chunk][row])
    const int64_t tail = nq % 16, q0 = nq - tail;
    thread_local std::vector<int32_t> tcb;
    if (tail) {
      if ((int64_t)tcb.size() < nt * 8 * MRQ) tcb.resize(nt * 8 * MRQ);
      for (int64_t t = 0; t < nt; ++t) {
        int64_t r;
        const int mr = row_block(t, nt, base, extra, r);
        for (int c = 0; c < nch; ++c)
          for (int m = 0; m < mr; ++m)
            tcb[(t * 8 + c) * MRQ + m] = xs_corr(p.xq + (m0 + r + m) * p.ldq + c * cl + 4 * q0, 4 * tail);
      }
    }
#endif
    for (int64_t g = pn0; g < pn1; ++g)
      for (int64_t t = 0; t < nt; ++t) {
        int64_t r;
        const int mr = row_block(t, nt, base, extra, r);
#if BI_KERNEL_PASS == 1
        run(g, m0 + r, mr, mr > base ? fk_extra : fk_base, true, tail ? tcb.data() + t * 8 * MRQ : nullptr);
#else
        run(g, m0 + r, mr, mr > base ? fk_extra : fk_base, true, nullptr);
#endif
      }
    return;
  }
#if BI_KERNEL_PASS == 1
  if ((int64_t)xcb.size() < nch * rows) xcb.resize(nch * rows);
  for (int c = 0; c < nch; ++c)
    for (int64_t m = 0; m < rows; ++m) xcb[c * rows + m] = xs_corr(p.xq + (m0 + m) * p.ldq + c * cl, cl);
  xc = xcb.data();
#endif
  // every tile of rows runs on a panel before the next panel, which so stays in cache for all of them (tiles
  // outermost re-read the weights from memory once per 12 rows)
  for (int64_t g = pn0; g < pn1; ++g)  // one panel per call (NPQ == 1)
    for (int64_t t = 0, r = m0; t < nt; ++t) {
      const int mr = base + (t < extra ? 1 : 0);
      run(g, r, mr, t < extra ? fk_extra : fk_base, false, xc ? xc + (r - m0) : nullptr);
      r += mr;
    }
}

// ---- RMSNorm -------------------------------------------------------------------------------------------

template <bool XBF, bool WBF, bool YBF, bool RES>
static void norm_rows_t(const NormParams& p, int64_t r0, int64_t r1) {
  const int64_t H = p.H;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t xo = row * p.ldx;
    V16 acc = vzero();
    for (int64_t h = 0; h < H; h += 16) {
      const int n = H - h >= 16 ? 16 : (int)(H - h);
      V16 v = ld_n<XBF>(p.x, xo + h, n);
      if (RES) {
        v = vadd(v, ld_n<XBF>(p.r, row * p.ldr + h, n));
        if (XBF) v = vround_bf(v);
        st_n<XBF>(p.ro, row * p.ldro + h, v, n);
      }
      acc = vfma(v, v, acc);
    }
    const float ss = hsum(acc);
    const float rinv = 1.0f / std::sqrt(ss / (float)H + p.eps);
    const V16 rv = vset1(rinv);
    const void* src = RES ? (const void*)p.ro : p.x;
    const int64_t so = RES ? row * p.ldro : xo;
    for (int64_t h = 0; h < H; h += 16) {
      const int n = H - h >= 16 ? 16 : (int)(H - h);
      V16 t = vmul(ld_n<XBF>(src, so + h, n), rv);
      if (XBF) t = vround_bf(t);
      V16 o = vmul(ld_n<WBF>(p.w, h, n), t);
      st_n<YBF>(p.y, row * p.ldy + h, o, n);
    }
  }
}

static void norm_rows(const NormParams& p, int64_t r0, int64_t r1) {
  const int code = (p.xt << 3) | (p.wt << 2) | (p.yt << 1) | (p.r ? 1 : 0);
#define BI_NORM_CASE(XB, WB, YB, R) \
  case (XB << 3) | (WB << 2) | (YB << 1) | R: return norm_rows_t<XB, WB, YB, R>(p, r0, r1);
  switch (code) {
    BI_NORM_CASE(0, 0, 0, 0) BI_NORM_CASE(0, 0, 0, 1)
    BI_NORM_CASE(1, 1, 1, 0) BI_NORM_CASE(1, 1, 1, 1)
    BI_NORM_CASE(0, 1, 0, 0) BI_NORM_CASE(0, 1, 0, 1)
    BI_NORM_CASE(1, 0, 0, 0) BI_NORM_CASE(1, 0, 0, 1)
    default: break;
  }
#undef BI_NORM_CASE
}

// ---- SiLU(gate) * up -----------------------------------------------------------------------------------

BI_INLINE V16 silu(V16 g) { return vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))); }

#if BI_KERNEL_PASS == 1
// A bf16 gate has 2^16 values: SiLU of each, rounded to bf16, computed once by silu() itself (so every bit is
// the arithmetic's), is a 128 KiB table that one gather reads for 16 lanes in place of the exp and the divide.
// One entry of padding: the gather reads 32 bits at each entry.
static const uint16_t* silu_bf16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536 + 2);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int i = 0; i < 65536; i += 16) {
      const __m512i bits = _mm512_add_epi32(lanes, _mm512_set1_epi32(i));
      const V16 g = {_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16))};
      _mm256_storeu_si256((__m256i*)(t.data() + i), bf_narrow(silu(g)));
    }
    return t;
  }();
  return table.data();
}
#endif

template <bool BF>
static void silu_rows_t(const SiluParams& p, int64_t r0, int64_t r1) {
#if BI_KERNEL_PASS == 1
  const uint16_t* table = BF ? silu_bf16_table() : nullptr;
#endif
  for (int64_t row = r0; row < r1; ++row) {
    for (int64_t c = 0; c < p.C; c += 16) {
      const int n = p.C - c >= 16 ? 16 : (int)(p.C - c);
      V16 u = ld_n<BF>(p.u, row * p.ldu + c, n);
      V16 s;
#if BI_KERNEL_PASS == 1
      if (BF) {
        const uint16_t* gb = (const uint16_t*)p.g + row * p.ldg + c;
        const __m512i gi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask16(n), gb));
        s.v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_i32gather_epi32(gi, (const void*)table, 2), 16));
      } else
#endif
      {
        s = silu(ld_n<BF>(p.g, row * p.ldg + c, n));
        if (BF) s = vround_bf(s);
      }
      st_n<BF>(p.y, row * p.ldy + c, vmul(s, u), n);
    }
  }
}

static void silu_rows(const SiluParams& p, int64_t r0, int64_t r1) {
  if (p.t == bi::BF16) silu_rows_t<true>(p, r0, r1); else silu_rows_t<false>(p, r0, r1);
}

// ---- paged attention: one item = some rows of one sequence for the query heads of one KV group ---------------
// Query q of an item is row r0 + q / nh of its sequence, head h0 + q % nh. All of an item's queries read the
// same K/V rows, so they share every key and value load (and its widening from bf16). A query's arithmetic does
// not depend on its item or its neighbours: a score is one fma chain over the D slices in order, then hsum16
// (a bf16 model's: att_scores_keys); the softmax and the PV sum run over keys in ascending order (a bf16
// model's over key pairs: att_pv_pairs). Grouping therefore changes no bit.
// NDV: 16-lane slices of D. FULL: D == 16 * NDV (plain loads); otherwise the slices are masked (lanes past D
// load as 0 and add nothing). Which (NDV, FULL) runs is a function of D alone.

enum { ATT_Q = 16 };  // queries per item

#if BI_KERNEL_PASS == 1
// 32 zmm registers: queries' slices stay in registers, and PV covers all of D in one pass
template <int NDV>
struct AttQS { enum { v = NDV <= 4 ? 4 : (NDV <= 8 ? 2 : 1) }; };
template <int NDV>
struct AttQB { enum { v = NDV <= 3 ? 8 : (NDV == 4 ? 6 : (NDV <= 6 ? 4 : (NDV <= 8 ? 3 : 1))) }; };
template <int NDV>
struct AttNS { enum { v = NDV }; };
// a bf16 model's pair chains: PV 6 queries' 4 accumulators beside 4 interleaved V vectors; scores with keys in
// lanes 2 blocks of 16 keys for 8 queries
struct AttPairs { enum { pv_queries = 6, key_blocks = 2, score_queries = 8 }; };
#elif BI_KERNEL_PASS == 2
// 16 ymm registers: a score keeps one widened key slice and one accumulator per query (the query slices are
// fma memory operands); PV runs one 16-lane slice of D at a time for 4 queries (8 accumulators)
template <int NDV>
struct AttQS { enum { v = 4 }; };
template <int NDV>
struct AttQB { enum { v = 4 }; };
template <int NDV>
struct AttNS { enum { v = 1 }; };
struct AttPairs { enum { pv_queries = 1, key_blocks = 1, score_queries = 2 }; };
#else
template <int NDV>
struct AttQS { enum { v = 1 }; };
template <int NDV>
struct AttQB { enum { v = 1 }; };
template <int NDV>
struct AttNS { enum { v = NDV }; };
struct AttPairs { enum { pv_queries = 1, key_blocks = 1, score_queries = 1 }; };
#endif

template <bool CBF, bool FULL>
BI_INLINE V16 ldk(const void* base, int64_t off, int n) {
  if (FULL) return ld<CBF>(base, off);
  return ld_n<CBF>(base, off, n);
}

// scores of QS queries against nb (<= 16) keys: lane j of row q = hsum16(fma chain over D slices) * scale
template <int NDV, bool FULL, int QS, bool CBF>
static void att_scores(const AttnParams& p, const int* dn, const int64_t* koff, int nb, const int64_t* qoff,
                       float* const* sc, int64_t j0, V16 scale) {
  V16 qv[QS][NDV];
  BI_UNROLL for (int q = 0; q < QS; ++q)
    BI_UNROLL for (int dv = 0; dv < NDV; ++dv)
      qv[q][dv] = p.qt == bi::BF16 ? ldk<true, FULL>(p.q, qoff[q] + dv * 16, dn[dv])
                                   : ldk<false, FULL>(p.q, qoff[q] + dv * 16, dn[dv]);
  V16 a[QS][16];
  for (int jj = 0; jj < 16; ++jj) {
    V16 acc[QS];
    BI_UNROLL for (int q = 0; q < QS; ++q) acc[q] = vzero();
    if (jj < nb) {
      BI_UNROLL for (int dv = 0; dv < NDV; ++dv) {
        const V16 kv = ldk<CBF, FULL>(p.kc, koff[jj] + dv * 16, dn[dv]);
        BI_UNROLL for (int q = 0; q < QS; ++q) acc[q] = vfma(qv[q][dv], kv, acc[q]);
      }
    }
    BI_UNROLL for (int q = 0; q < QS; ++q) a[q][jj] = acc[q];
  }
  for (int q = 0; q < QS; ++q) vstore(sc[q] + j0, vmul(reduce16(a[q]), scale));  // rows have room past the end
}

// A bf16 model's scores (bf16 queries, bf16 keys, D of 64, 128, 256 or 512) from k-pairs, keys in lanes: a
// block of 16 keys' rows transposed to kt[s] (lane l: key l's pair s, dims 2s and 2s + 1, as one u32), and a
// score is one chain over the pairs s in order, adding the odd dim's product, then the even one's (each product
// of two bf16 is exact in fp32, so each step is one rounding: what vdpbf16ps computes, one instruction per 16
// keys' pair), then * scale. No reduction across lanes, and a block's transposition serves every query of the
// item. The chain differs from att_scores' (it pairs dims and runs over all of D), so which one runs is a
// function of the dtypes and D alone, the same for every row of every batch. Lanes of keys past the item's last
// are zero (their scores are never read). NS: pairs per key (D / 2).
template <int NS>
static void keys_transposed(const uint16_t* kc, const int64_t* koff, int nb, uint32_t (*kt)[16]) {
#if BI_KERNEL_PASS == 1
  for (int c = 0; c < NS / 16; ++c) {  // 16 keys x 16 pairs: a 16 x 16 transpose of u32
    __m512i r[16], t[16];
    BI_UNROLL for (int i = 0; i < 16; ++i)
      r[i] = i < nb ? _mm512_loadu_si512((const void*)(kc + koff[i] + 32 * c)) : _mm512_setzero_si512();
    BI_UNROLL for (int i = 0; i < 8; ++i) {  // per 128-bit lane: rows 2i, 2i + 1 interleaved
      t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    BI_UNROLL for (int i = 0; i < 4; ++i) {  // r[4i + c'] lane L: column 4L + c' of rows 4i..4i + 3
      r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    BI_UNROLL for (int cc = 0; cc < 4; ++cc) {  // a 4 x 4 transpose of 128-bit lanes
      const __m512i v0 = _mm512_shuffle_i32x4(r[cc], r[4 + cc], 0x44);
      const __m512i v1 = _mm512_shuffle_i32x4(r[cc], r[4 + cc], 0xEE);
      const __m512i v2 = _mm512_shuffle_i32x4(r[8 + cc], r[12 + cc], 0x44);
      const __m512i v3 = _mm512_shuffle_i32x4(r[8 + cc], r[12 + cc], 0xEE);
      uint32_t(*o)[16] = kt + 16 * c + cc;
      _mm512_store_si512((void*)o[0], _mm512_shuffle_i32x4(v0, v2, 0x88));
      _mm512_store_si512((void*)o[4], _mm512_shuffle_i32x4(v0, v2, 0xDD));
      _mm512_store_si512((void*)o[8], _mm512_shuffle_i32x4(v1, v3, 0x88));
      _mm512_store_si512((void*)o[12], _mm512_shuffle_i32x4(v1, v3, 0xDD));
    }
  }
#else
  for (int s = 0; s < NS; ++s)
    for (int l = 0; l < 16; ++l) {
      uint32_t u = 0;
      if (l < nb) std::memcpy(&u, kc + koff[l] + 2 * s, 4);
      kt[s][l] = u;
    }
#endif
}

#if BI_KERNEL_PASS == 1
#pragma GCC push_options
#pragma GCC target("avx512bf16")  // for dp_pairs; the two-fma chain (DP false) uses AVX-512F alone
// acc + the 16 lanes' k-pairs of a . those of b (their raw bits), the odd element first (vdpbf16ps)
BI_INLINE V16 dp_pairs(V16 acc, V16 a, V16 b) {
  return {_mm512_dpbf16_ps(acc.v, (__m512bh)_mm512_castps_si512(a.v), (__m512bh)_mm512_castps_si512(b.v))};
}
#else
BI_INLINE V16 dp_pairs(V16 acc, V16, V16) { return acc; }  // DP runs on pass 1 only
#endif
// scores of QS queries against KB transposed blocks of 16 keys (kt[b]), stored at sc[q] + j0 + 16 b. DP:
// vdpbf16ps (its one difference: subnormals flushed), else its two fmas
template <int QS, int KB, int NS, bool DP>
static void scores_from_keys(const AttnParams& p, const int64_t* qoff, float* const* sc, int64_t j0,
                             const uint32_t (*const* kt)[16], V16 scale) {
  const uint16_t* qb = (const uint16_t*)p.q;
  V16 acc[QS][KB];
  BI_UNROLL for (int q = 0; q < QS; ++q)
    BI_UNROLL for (int b = 0; b < KB; ++b) acc[q][b] = vzero();
  {
    const PairFlush flush(!DP);
    for (int s = 0; s < NS; ++s) {
      V16 ko[KB], ke[KB];  // DP: ko holds the raw pairs
      BI_UNROLL for (int b = 0; b < KB; ++b) {
        if constexpr (DP) ko[b] = vload((const float*)kt[b][s]);
        else vload_bfpair(kt[b][s], ko[b], ke[b]);
      }
      BI_UNROLL for (int q = 0; q < QS; ++q) {
        if constexpr (DP) {
          uint32_t u;
          std::memcpy(&u, qb + qoff[q] + 2 * s, 4);
          const V16 qq = vset1(u2f(u));
          BI_UNROLL for (int b = 0; b < KB; ++b) acc[q][b] = dp_pairs(acc[q][b], qq, ko[b]);
        } else {
          const V16 qo = vset1(u2f((uint32_t)qb[qoff[q] + 2 * s + 1] << 16));
          const V16 qe = vset1(u2f((uint32_t)qb[qoff[q] + 2 * s] << 16));
          BI_UNROLL for (int b = 0; b < KB; ++b) acc[q][b] = vfma(qe, ke[b], vfma(qo, ko[b], acc[q][b]));
        }
      }
    }
  }
  BI_UNROLL for (int q = 0; q < QS; ++q)
    BI_UNROLL for (int b = 0; b < KB; ++b) vstore(sc[q] + j0 + 16 * b, vmul(acc[q][b], scale));
}
#if BI_KERNEL_PASS == 1
#pragma GCC pop_options
#endif

// every query's scores of an item, keys in lanes: KB blocks of 16 keys transposed at a time, then QS queries at
// a time over them (rows of the scratch have room for a last pass past nk_max: their stride is a multiple of 16
// plus 16)
template <int NS>
static void att_scores_keys(const AttnParams& p, const int64_t* koff, int64_t nk_max, const int64_t* qoff,
                            float* const* sc, int nq, V16 scale) {
  constexpr int KB = AttPairs::key_blocks;
  alignas(64) uint32_t kt[KB][NS][16];
  const uint32_t (*blocks[KB])[16];
  for (int b = 0; b < KB; ++b) blocks[b] = kt[b];
  const uint16_t* kc = (const uint16_t*)p.kc;
  for (int64_t j0 = 0; j0 < nk_max; j0 += 16 * KB) {
    for (int b = 0; b < KB; ++b) {
      const int64_t jb = j0 + 16 * b;
      keys_transposed<NS>(kc, koff + jb, (int)std::max<int64_t>(0, std::min<int64_t>(16, nk_max - jb)), kt[b]);
    }
    for (int q0 = 0; q0 < nq;)
      q0 += widest_upto<AttPairs::score_queries>(nq - q0, [&](auto w) {
        constexpr int W = decltype(w)::value;
#if BI_KERNEL_PASS == 1
        if (attn_pairs_dp()) return scores_from_keys<W, KB, NS, true>(p, qoff + q0, sc + q0, j0, blocks, scale);
#endif
        scores_from_keys<W, KB, NS, false>(p, qoff + q0, sc + q0, j0, blocks, scale);
      });
  }
}

// run(std::integral_constant<int, W>) for the widest W <= N that fits n (>= 1) queries; returns W
template <int N, class F>
BI_INLINE int widest_upto(int n, F&& run) {
  if constexpr (N > 1) {
    if (n < N) return widest_upto<N - 1>(n, run);
  }
  run(std::integral_constant<int, N>{});
  return N;
}

// PV for exactly QB queries on the NS slices of D from dv0: o_q = sum_{j < nk_q} p_qj v_j over j ascending,
// then / l_q
template <int NDV, bool FULL, int QB, int NS, bool CBF>
static void att_pv(const AttnParams& p, const int* dn, int dv0, const int64_t* voff, const int64_t* nk,
                   float* const* sc, const float* l, const int64_t* orow) {
  V16 o[QB][NS];
  BI_UNROLL for (int q = 0; q < QB; ++q)
    BI_UNROLL for (int s = 0; s < NS; ++s) o[q][s] = vzero();
  int64_t jmin = nk[0], jmax = nk[0];
  BI_UNROLL for (int q = 1; q < QB; ++q) { jmin = std::min(jmin, nk[q]); jmax = std::max(jmax, nk[q]); }
  const float* s[QB];
  BI_UNROLL for (int q = 0; q < QB; ++q) s[q] = sc[q];
  for (int64_t j = 0; j < jmin; ++j) {
    V16 v[NS];
    BI_UNROLL for (int d = 0; d < NS; ++d) v[d] = ldk<CBF, FULL>(p.vc, voff[j] + (dv0 + d) * 16, dn[dv0 + d]);
    BI_UNROLL for (int q = 0; q < QB; ++q) {
      const V16 pj = vset1(s[q][j]);
      BI_UNROLL for (int d = 0; d < NS; ++d) o[q][d] = vfma(pj, v[d], o[q][d]);
    }
  }
  for (int64_t j = jmin; j < jmax; ++j) {  // causal triangle: not every query sees key j
    V16 v[NS];
    BI_UNROLL for (int d = 0; d < NS; ++d) v[d] = ldk<CBF, FULL>(p.vc, voff[j] + (dv0 + d) * 16, dn[dv0 + d]);
    BI_UNROLL for (int q = 0; q < QB; ++q) {
      if (j < nk[q]) {
        const V16 pj = vset1(s[q][j]);
        BI_UNROLL for (int d = 0; d < NS; ++d) o[q][d] = vfma(pj, v[d], o[q][d]);
      }
    }
  }
  BI_UNROLL for (int q = 0; q < QB; ++q) {
    if (nk[q] <= 0) continue;
    const V16 lv = vset1(l[q]);
    BI_UNROLL for (int d = 0; d < NS; ++d) {
      const V16 r = vdiv(o[q][d], lv);
      if (p.ot == bi::BF16) st_n<true>(p.out, orow[q] + (dv0 + d) * 16, r, dn[dv0 + d]);
      else st_n<false>(p.out, orow[q] + (dv0 + d) * 16, r, dn[dv0 + d]);
    }
  }
}

// o / l of QB queries' 64 dims from slice dv0, stored in the output's dtype (queries with no key: untouched)
template <int QB>
BI_INLINE void pv_store(const AttnParams& p, const V16 (*o)[4], int dv0, const float* l, const int64_t* orow,
                        const int64_t* nk) {
  BI_UNROLL for (int q = 0; q < QB; ++q) {
    if (nk[q] <= 0) continue;
    const V16 lv = vset1(l[q]);
    BI_UNROLL for (int d = 0; d < 4; ++d) {
      const V16 r = vdiv(o[q][d], lv);
      if (p.ot == bi::BF16) st_n<true>(p.out, orow[q] + (dv0 + d) * 16, r, 16);
      else st_n<false>(p.out, orow[q] + (dv0 + d) * 16, r, 16);
    }
  }
}

// A bf16 model's PV (bf16 V, D a multiple of 64; att_scores_keys' condition) from key pairs: the softmax
// numerators rounded to bf16 (pb: each query's, zero past its last key, to the item's even end), and per pair of
// keys j, j + 1 one step per lane adding p_{j+1} v_{j+1}, then p_j v_j (products of two bf16 are exact in fp32,
// so each add is one rounding: vdpbf16ps on V's rows interleaved by key, one instruction per 32 multiply-adds
// where fp32 numerators take two fmas and the widening of each row). Over 64 dims from slice dv0, QB queries;
// keys past the item's last (nk_max) add nothing. A query's zeros add exactly nothing (the sum starts at +0 and
// a sum of p v with p >= 0 never becomes -0), so its bits do not depend on the item's other queries.
template <int QB>
static void att_pv_pairs(const AttnParams& p, int dv0, const int64_t* voff, int64_t jend, int64_t nk_max,
                         const uint16_t* const* pb, const float* l, const int64_t* orow, const int64_t* nk) {
  const uint16_t* vb = (const uint16_t*)p.vc;
  V16 o[QB][4];
  BI_UNROLL for (int q = 0; q < QB; ++q)
    BI_UNROLL for (int d = 0; d < 4; ++d) o[q][d] = vzero();
  {
    const PairFlush flush(true);
    for (int64_t j = 0; j < jend; j += 2) {
      const bool odd = j + 1 < nk_max;
      V16 ve[4], vo[4];
      BI_UNROLL for (int d = 0; d < 4; ++d) {
        ve[d] = vload_bf(vb + voff[j] + (dv0 + d) * 16);
        vo[d] = odd ? vload_bf(vb + voff[j + 1] + (dv0 + d) * 16) : vzero();
      }
      BI_UNROLL for (int q = 0; q < QB; ++q) {
        const V16 pe = vset1(u2f((uint32_t)pb[q][j] << 16)), po = vset1(u2f((uint32_t)pb[q][j + 1] << 16));
        BI_UNROLL for (int d = 0; d < 4; ++d) o[q][d] = vfma(pe, ve[d], vfma(po, vo[d], o[q][d]));
      }
    }
  }
  pv_store<QB>(p, o, dv0, l, orow, nk);
}
#if BI_KERNEL_PASS == 1
#pragma GCC push_options
#pragma GCC target("avx512bf16")
// Two keys' 64 dims from slice dv0 interleaved into k-pairs (word 2i: key j, 2i + 1: key j + 1), 16 dims per
// vector, by one two-source permute per 16 dims; a key at or past nk_max is zeros, not a cache row
BI_INLINE void key_pairs(const uint16_t* vb, const int64_t* voff, int64_t j, int64_t nk_max, int dv0,
                         __m512i out[4]) {
  alignas(64) static const uint16_t kLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512((const void*)kLo);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  __m512i e0 = _mm512_setzero_si512(), e1 = e0, o0 = e0, o1 = e0;
  if (j < nk_max) {
    const uint16_t* ve = vb + voff[j] + dv0 * 16;
    e0 = _mm512_loadu_si512((const void*)ve);
    e1 = _mm512_loadu_si512((const void*)(ve + 32));
  }
  if (j + 1 < nk_max) {
    const uint16_t* vo = vb + voff[j + 1] + dv0 * 16;
    o0 = _mm512_loadu_si512((const void*)vo);
    o1 = _mm512_loadu_si512((const void*)(vo + 32));
  }
  out[0] = _mm512_permutex2var_epi16(e0, lo, o0);
  out[1] = _mm512_permutex2var_epi16(e0, hi, o0);
  out[2] = _mm512_permutex2var_epi16(e1, lo, o1);
  out[3] = _mm512_permutex2var_epi16(e1, hi, o1);
}
// att_pv_pairs with vdpbf16ps on key_pairs
template <int QB>
static void att_pv_pairs_dp(const AttnParams& p, int dv0, const int64_t* voff, int64_t jend, int64_t nk_max,
                            const uint16_t* const* pb, const float* l, const int64_t* orow, const int64_t* nk) {
  const uint16_t* vb = (const uint16_t*)p.vc;
  V16 o[QB][4];
  BI_UNROLL for (int q = 0; q < QB; ++q)
    BI_UNROLL for (int d = 0; d < 4; ++d) o[q][d] = vzero();
  for (int64_t j = 0; j < jend; j += 2) {
    __m512i kp[4];
    key_pairs(vb, voff, j, nk_max, dv0, kp);
    const __m512bh v[4] = {(__m512bh)kp[0], (__m512bh)kp[1], (__m512bh)kp[2], (__m512bh)kp[3]};
    BI_UNROLL for (int q = 0; q < QB; ++q) {
      uint32_t u;
      std::memcpy(&u, pb[q] + j, 4);
      const __m512bh pp = (__m512bh)_mm512_set1_epi32((int)u);
      BI_UNROLL for (int d = 0; d < 4; ++d) o[q][d].v = _mm512_dpbf16_ps(o[q][d].v, pp, v[d]);
    }
  }
  pv_store<QB>(p, o, dv0, l, orow, nk);
}
#pragma GCC pop_options
#endif

#if BI_KERNEL_PASS == 1
// A bf16 model's scores and PV on AMX-BF16 tiles (the amx path, where the CPU has AMX-BF16), at every query
// count: an item's queries (<= 16) are the rows of the A tiles, 16 keys' k-pairs (keys_transposed) or 16 key
// pairs of V (two keys' rows interleaved by dim) the B tiles, 16 pairs per tdpbf16ps. tdpbf16ps rounds in an
// order of its own, so these bits are this path's; a query's row of a tile depends on that row alone, steps of
// 32 keys start at key 0 whatever the item, and the keys past a query's last add exact zeros (its numerators are
// zero there, the values past the item's last key are zeroed here, never read from the cache), so a query's bits
// do not depend on its item, its neighbours or the thread: what DFlash = AR needs.
// Tiles: 0/1 two blocks of scores or 0-3 four 16-dim slices of PV sums (nq rows), 4 the queries' or numerators'
// step (nq rows), 5/6 the keys' or values' step (16 rows).
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512bf16")
static void amx_configure_attention(int nq) {
  AmxConfig c{};
  c.palette = 1;
  const int rows[8] = {nq, nq, nq, nq, nq, 16, 16, 1};
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = (uint8_t)rows[t];
    c.colsb[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(c));  // the whole struct (see amx_configure)
}

// raw scores (before * scale) of nq queries, their bf16 rows packed D = 2 * NS apart in qp, against keys
// 0 .. nk_max - 1, 32 at a time, stored at s0 + j (query rows ld floats apart), to the next multiple of 32
template <int NS>
static void att_scores_amx(const AttnParams& p, const int64_t* koff, int64_t nk_max, const uint16_t* qp, float* s0,
                           int64_t ld) {
  alignas(64) uint32_t kt[2][NS][16];
  const uint16_t* kc = (const uint16_t*)p.kc;
  for (int64_t j0 = 0; j0 < nk_max; j0 += 32) {
    for (int b = 0; b < 2; ++b) {
      const int64_t jb = j0 + 16 * b;
      keys_transposed<NS>(kc, koff + jb, (int)std::max<int64_t>(0, std::min<int64_t>(16, nk_max - jb)), kt[b]);
    }
    __asm__ volatile("" : : : "memory");  // and the tiles load what was written
    _tile_zero(0);
    _tile_zero(1);
    for (int s = 0; s < NS; s += 16) {
      _tile_loadd(4, qp + 2 * s, 4 * NS);
      _tile_loadd(5, kt[0][s], 64);
      _tile_loadd(6, kt[1][s], 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
    }
    _tile_stored(0, s0 + j0, ld * 4);
    _tile_stored(1, s0 + j0 + 16, ld * 4);
    __asm__ volatile("" : : : "memory");  // GCC's tile intrinsics name no memory: the stores must be seen
  }
}

// o_q = sum_j p_qj v_j / l_q for nq queries: numerators p (bf16, zero from each query's last key to jend, a
// multiple of 32) at pb0, query rows ldp bytes apart; 64 dims (4 slices from dv0) per pass
static void att_pv_amx(const AttnParams& p, int dv0, const int64_t* voff, int64_t jend, int64_t nk_max,
                       const uint16_t* pb0, int64_t ldp, int nq, const float* l, const int64_t* orow,
                       const int64_t* nk) {
  const uint16_t* vb = (const uint16_t*)p.vc;
  alignas(64) uint32_t vt[4][16][16];  // per 16-dim slice: 16 key pairs x 16 dims x (even key, odd key)
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t j0 = 0; j0 < jend; j0 += 32) {
    for (int k = 0; k < 16; ++k) {
      __m512i kp[4];
      key_pairs(vb, voff, j0 + 2 * k, nk_max, dv0, kp);
      for (int d = 0; d < 4; ++d) _mm512_store_si512((void*)vt[d][k], kp[d]);
    }
    __asm__ volatile("" : : : "memory");
    _tile_loadd(4, pb0 + j0, ldp);
    _tile_loadd(5, vt[0], 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, vt[1], 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, vt[2], 64);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(6, vt[3], 64);
    _tile_dpbf16ps(3, 4, 6);
  }
  alignas(64) float o[4][ATT_Q][16];
  _tile_stored(0, o[0], 64);
  _tile_stored(1, o[1], 64);
  _tile_stored(2, o[2], 64);
  _tile_stored(3, o[3], 64);
  __asm__ volatile("" : : : "memory");
  for (int q = 0; q < nq; ++q) {
    if (nk[q] <= 0) continue;
    const V16 lv = vset1(l[q]);
    for (int d = 0; d < 4; ++d) {
      const V16 r = vdiv(vload(o[d][q]), lv);
      if (p.ot == bi::BF16) st_n<true>(p.out, orow[q] + (dv0 + d) * 16, r, 16);
      else st_n<false>(p.out, orow[q] + (dv0 + d) * 16, r, 16);
    }
  }
}
#pragma GCC pop_options
#endif

template <int NDV, bool FULL, bool CBF>
static void attn_item(const AttnParams& p, const int32_t* it, float* scratch, int64_t sc_stride) {
  const int64_t b = it[0], h0 = it[1], nh = it[2], r0 = it[3], r1 = it[4];
  const int64_t D = p.D;
  const int64_t L = p.kv_len[b], ql = p.q_len[b];
  const int64_t g = h0 / (p.H / p.KVH);
  const int64_t cs = p.KVH * D;
  const int64_t* slots = p.slots + p.kv_off[b];
  const int nq = (int)((r1 - r0) * nh);
  int dn[NDV];
  for (int dv = 0; dv < NDV; ++dv) dn[dv] = (int)std::max<int64_t>(0, std::min<int64_t>(16, D - dv * 16));
  int64_t nk[ATT_Q], qoff[ATT_Q];
  float* sc[ATT_Q];
  float lsum[ATT_Q];
  int64_t nk_max = 0;
  for (int q = 0; q < nq; ++q) {
    const int64_t i = r0 + q / nh, h = h0 + q % nh;
    nk[q] = p.causal ? (L - ql + i + 1) : L;
    qoff[q] = ((p.q_start[b] + i) * p.H + h) * D;
    sc[q] = scratch + q * sc_stride;
    nk_max = std::max(nk_max, nk[q]);
  }
  thread_local std::vector<int64_t> koff_v;
  if ((int64_t)koff_v.size() < nk_max + 16) koff_v.resize(nk_max + 16);
  int64_t* koff = koff_v.data();
  for (int64_t j = 0; j < nk_max; ++j) koff[j] = slots[j] * cs + g * D;  // same row offset for K and V
  // scores: per block of 16 keys, every query of the item (the block's keys stay in L1), QS queries at a time
  // sharing each key load. Lanes past a query's last visible key hold scores of keys it cannot see (or 0);
  // they never reach its softmax.
  const V16 scale = vset1(p.scale);
  constexpr int QS = AttQS<NDV>::v;
  // D of 64, 128, 256 or 512: every pass instantiates exactly NDV = D / 16 for those, so every pass takes the
  // same chain (a D of 32 runs as NDV 2 on some passes and as a masked 4 on the scalar one)
  const bool pairs = CBF && NDV % 4 == 0 && p.D == 16 * NDV && p.qt == bi::BF16;
#if BI_KERNEL_PASS == 1
  const bool tiles = pairs && bi::amx_bf16_active();
#else
  constexpr bool tiles = false;
#endif
  bool keys_done = false;
  if constexpr (CBF && NDV % 4 == 0) {
#if BI_KERNEL_PASS == 1
    if (tiles) {
      alignas(64) uint16_t qp[ATT_Q * 16 * NDV];  // the queries' rows, packed for the A tiles
      for (int q = 0; q < nq; ++q) std::memcpy(qp + q * 16 * NDV, (const uint16_t*)p.q + qoff[q], 32 * NDV);
      amx_configure_attention(nq);
      att_scores_amx<8 * NDV>(p, koff, nk_max, qp, sc[0], sc_stride);  // unscaled: the softmax scales them
      keys_done = true;
    }
#endif
    if (pairs && !tiles) {
      att_scores_keys<8 * NDV>(p, koff, nk_max, qoff, sc, nq, scale);
      keys_done = true;
    }
  }
  for (int64_t j0 = 0; j0 < nk_max && !keys_done; j0 += 16) {
    const int nb = (int)std::min<int64_t>(16, nk_max - j0);
    for (int q0 = 0; q0 < nq;)
      q0 += widest_upto<QS>(nq - q0, [&](auto w) {
        att_scores<NDV, FULL, decltype(w)::value, CBF>(p, dn, koff + j0, nb, qoff + q0, sc + q0, j0, scale);
      });
  }
  // softmax numerators and their sums, per query; for PV from key pairs the numerators rounded to bf16, over
  // the row's first bytes (a block's bf16 land on floats already read), zero from the last key to the item's
  // even end (on tiles: to its last step of 32 keys)
  const int64_t jend = tiles ? (nk_max + 31) / 32 * 32 : (nk_max + 1) / 2 * 2;
  const uint16_t* pb[ATT_Q];
  for (int q = 0; q < nq; ++q) {
    const int64_t n = nk[q];
    float* s = sc[q];
    uint16_t* sb = (uint16_t*)s;
    pb[q] = sb;
    if (n <= 0) {
      lsum[q] = 0.0f;
      if (pairs) std::memset(sb, 0, (size_t)jend * 2);
      continue;
    }
    // the tiles' raw products times the scale here, as they are read (the same product the other paths form)
    auto score = [&](V16 v) { return tiles ? vmul(v, scale) : v; };
    int64_t j0 = 0;
    V16 mx = vset1(-INFINITY);
    for (; j0 + 16 <= n; j0 += 16) mx = vmax(mx, score(vload(s + j0)));
    float m = hmax(mx);
    for (; j0 < n; ++j0) {
      const float v = tiles ? s[j0] * p.scale : s[j0];
      m = v > m ? v : m;  // max is exact whatever the order
    }
    const V16 mv = vset1(m);
    V16 acc = vzero();
    for (j0 = 0; j0 < n; j0 += 16) {
      const int nb = (int)std::min<int64_t>(16, n - j0);
      V16 e = vexp_nonpos(vsub(score(ld_n<false>(s, j0, nb)), mv));
      if (nb < 16) {  // zero the lanes past the last key
        alignas(64) float t[16];
        vstore_n(t, e, nb);
        e = vload_n(t, nb);
      }
      if (pairs) st_n<true>(sb, j0, e, nb);
      else st_n<false>(s, j0, e, nb);
      acc = vadd(acc, e);
    }
    lsum[q] = hsum(acc);
    if (pairs && n < jend) std::memset(sb + n, 0, (size_t)(jend - n) * 2);
  }
  if constexpr (CBF && NDV % 4 == 0) {
#if BI_KERNEL_PASS == 1
    if (tiles) {
      for (int dv0 = 0; dv0 < NDV; dv0 += 4)
        att_pv_amx(p, dv0, koff, jend, nk_max, pb[0], sc_stride * 4, nq, lsum, qoff, nk);
      return;
    }
#endif
    if (pairs) {
      for (int dv0 = 0; dv0 < NDV; dv0 += 4)
        for (int q0 = 0; q0 < nq;)
          q0 += widest_upto<AttPairs::pv_queries>(nq - q0, [&](auto w) {
            constexpr int W = decltype(w)::value;
#if BI_KERNEL_PASS == 1
            if (attn_pairs_dp())
              return att_pv_pairs_dp<W>(p, dv0, koff, jend, nk_max, pb + q0, lsum + q0, qoff + q0, nk + q0);
#endif
            att_pv_pairs<W>(p, dv0, koff, jend, nk_max, pb + q0, lsum + q0, qoff + q0, nk + q0);
          });
      return;
    }
  }
  // PV, QB queries at a time (their accumulators stay in registers), NS slices of D per pass; slices wholly
  // past D are skipped
  constexpr int QB = AttQB<NDV>::v, NS = AttNS<NDV>::v;
  for (int dv0 = 0; dv0 < NDV && dn[dv0] > 0; dv0 += NS)
    for (int q0 = 0; q0 < nq;)
      q0 += widest_upto<QB>(nq - q0, [&](auto w) {
        att_pv<NDV, FULL, decltype(w)::value, NS, CBF>(p, dn, dv0, koff, nk + q0, sc + q0, lsum + q0, qoff + q0);
      });
}

template <int NDV, bool FULL>
static void attn_range(const AttnParams& p, int64_t i0, int64_t i1, float* sc) {
  const int64_t stride = ((std::max<int64_t>(p.max_kv, 1) + 15) / 16) * 16 + 16;
  for (int64_t it = i0; it < i1; ++it) {
    if (p.ct == bi::BF16) attn_item<NDV, FULL, true>(p, p.items + 5 * it, sc, stride);
    else attn_item<NDV, FULL, false>(p, p.items + 5 * it, sc, stride);
  }
}

static void attn_items(const AttnParams& p, int64_t i0, int64_t i1, float* sc) {
  // Slices of D past its end are zero and add exactly nothing (an fma chain from +0 never holds -0), so a
  // rounded-up masked instantiation gives the same bits as an exact one: the fallbacks keep code small.
#if BI_KERNEL_PASS != 3
  if (p.D % 16 == 0) {
    switch (p.D / 16) {
      case 2: return attn_range<2, true>(p, i0, i1, sc);
      case 4: return attn_range<4, true>(p, i0, i1, sc);
      case 8: return attn_range<8, true>(p, i0, i1, sc);
#if BI_KERNEL_PASS == 1
      case 16: return attn_range<16, true>(p, i0, i1, sc);
#endif
      default: break;
    }
  }
#endif
  const int64_t ndv = (p.D + 15) / 16;
  if (ndv <= 4) return attn_range<4, false>(p, i0, i1, sc);
  if (ndv <= 8) return attn_range<8, false>(p, i0, i1, sc);
  if (ndv <= 16) return attn_range<16, false>(p, i0, i1, sc);
  return attn_range<32, false>(p, i0, i1, sc);
}

static void selftest_reduce(const float* a, float* out) {
  V16 v[16];
  for (int j = 0; j < 16; ++j) v[j] = vload(a + 16 * j);
  vstore(out, reduce16(v));
}

// W8A8 activations: per row and chunk a = max|x| (exact in any order), codes rint(x * (127 / a)) by the
// 1.5 * 2^23 shift (|x * inv| <= 127, so exact, nearest even), clamped to +-127, stored + 128; scale a / 127
// bf16 rows (xh) are widened as they are read (exact)
static void quantize_rows(const LinParams& p, int64_t M, uint8_t* q, float* s) {
  const int64_t cl = p.chunk_len, kx = cl * p.nchunks;
#if BI_KERNEL_PASS != 1
  thread_local std::vector<float> wide;  // bf16 rows: one chunk widened, while it is in L1
  if (p.xh && (int64_t)wide.size() < cl) wide.resize(cl);
#endif
  for (int64_t m = 0; m < M; ++m)
    for (int c = 0; c < p.nchunks; ++c) {
      uint8_t* d = q + m * kx + c * cl;
#if BI_KERNEL_PASS == 1
      uint8_t* f = p.xsq ? p.xsq + m * p.ldq + c * cl : nullptr;
      const float* x = p.xh ? nullptr : p.x + m * p.ldx + p.xk0 + c * cl;
      const uint16_t* xb = p.xh ? p.xh + m * p.ldx + p.xk0 + c * cl : nullptr;
      auto load = [x, xb](int64_t k, __mmask16 mk) {
        return xb ? bf_widen(_mm256_maskz_loadu_epi16(mk, xb + k)).v : _mm512_maskz_loadu_ps(mk, x + k);
      };
      __m512 amax = _mm512_setzero_ps();
      int64_t k = 0;
      for (; k + 16 <= cl; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load(k, (__mmask16)0xFFFF)));
      const __mmask16 tail = mask16((int)(cl - k));
      if (k < cl) amax = _mm512_max_ps(amax, _mm512_abs_ps(load(k, tail)));
      const float a = _mm512_reduce_max_ps(amax);
      const float inv = a > 0.0f && std::isfinite(a) ? 127.0f / a : 0.0f;
      // |x * inv| <= 127 (up to rounding), so cvtps2dq's nearest-even conversion is the rint and the clamp the
      // other ISAs' pass forms with the magic-number shift (a NaN lane: the integer indefinite, stored as 128)
      const __m512 vinv = _mm512_set1_ps(inv);
      const __m128i flip = _mm_set1_epi8((char)0x80);
      for (k = 0; k < cl; k += 16) {
        const __mmask16 mk = k + 16 <= cl ? (__mmask16)0xFFFF : tail;
        const __m128i sc = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(load(k, mk), vinv)));
        const __m128i uc = _mm_xor_si128(sc, flip);  // the stored code: the signed one + 128
        if (mk == (__mmask16)0xFFFF) {
          _mm_storeu_si128((__m128i*)(d + k), uc);
          if (f) _mm_storeu_si128((__m128i*)(f + k), sc);
        } else {
          _mm_mask_storeu_epi8(d + k, mk, uc);
          if (f) _mm_mask_storeu_epi8(f + k, mk, sc);
        }
      }
#else
      const float* x;
      if (p.xh) {
        const uint16_t* h = p.xh + m * p.ldx + p.xk0 + c * cl;
        float* w = wide.data();
        for (int64_t k = 0; k < cl; ++k) w[k] = u2f((uint32_t)h[k] << 16);
        x = w;
      } else {
        x = p.x + m * p.ldx + p.xk0 + c * cl;
      }
      // SSE2 (every x86-64 CPU); cl % 4 == 0
      const __m128 sign = _mm_set1_ps(-0.0f);
      __m128 amax = _mm_setzero_ps();
      for (int64_t k = 0; k < cl; k += 4) amax = _mm_max_ps(amax, _mm_andnot_ps(sign, _mm_loadu_ps(x + k)));
      alignas(16) float am[4];
      _mm_store_ps(am, amax);
      const float a = std::max(std::max(am[0], am[1]), std::max(am[2], am[3]));
      const float inv = a > 0.0f && std::isfinite(a) ? 127.0f / a : 0.0f;
      const __m128 vinv = _mm_set1_ps(inv), shift = _mm_set1_ps(12582912.0f);
      const __m128 hi = _mm_set1_ps(127.0f), lo = _mm_set1_ps(-127.0f);
      for (int64_t k = 0; k < cl; k += 4) {
        __m128 v = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(_mm_loadu_ps(x + k), vinv), shift), shift);
        v = _mm_min_ps(hi, _mm_max_ps(lo, v));
        __m128i i = _mm_add_epi32(_mm_cvttps_epi32(v), _mm_set1_epi32(128));
        i = _mm_packs_epi32(i, i);
        i = _mm_packus_epi16(i, i);
        const int32_t four = _mm_cvtsi128_si32(i);
        std::memcpy(d + k, &four, 4);
      }
#endif
      s[m * p.nchunks + c] = inv > 0.0f ? a / 127.0f : 0.0f;
    }
}

static void at_least(const float* a, int64_t n, float t, std::vector<int64_t>& out) {
  int64_t v = 0;
#if BI_KERNEL_PASS == 1
  const __m512 tv = _mm512_set1_ps(t);
  for (; v + 16 <= n; v += 16)
    for (unsigned k = _mm512_cmp_ps_mask(_mm512_loadu_ps(a + v), tv, _CMP_GE_OQ); k; k &= k - 1)
      out.push_back(v + __builtin_ctz(k));
#endif
  for (; v < n; ++v)
    if (a[v] >= t) out.push_back(v);
}

template <bool BF>
static float row_top_probability_t(const void* a, int64_t n, float m) {
  const V16 mv = vset1(m);
  V16 acc = vzero();
  for (int64_t j = 0; j < n; j += 16) {
    const int nb = (int)std::min<int64_t>(16, n - j);
    V16 e = vexp(vsub(ld_n<BF>(a, j, nb), mv));
    if (nb < 16) {  // the lanes past the end: exp(0 - m), zeroed through a masked round trip
      float tmp[16];
      vstore_n(tmp, e, nb);
      e = vload_n(tmp, nb);
    }
    acc = vadd(acc, e);
  }
  return 1.0f / hsum(acc);
}

static float row_top_probability(const void* a, int64_t n, bool bf, float m) {
  return bf ? row_top_probability_t<true>(a, n, m) : row_top_probability_t<false>(a, n, m);
}

// MG rows' approximations over columns [v0, v1) (Kernels::approx): the rows share each weight load, and up to 4
// rows take two chains each (even and odd j) so that the FMAs do not wait on each other (more rows are chains
// enough). One pass: the column block is still in registers when its maxima are taken.
template <int MG, bool WBF>
static void approx_rows(const float* xo, int64_t n_out, const void* wo, int64_t V, int64_t v0, int64_t v1, float* a,
                        float* mx, float* mabs) {
  constexpr int CH = MG > 4 ? 1 : 2;
  V16 hi[MG], ab[MG];
  float tail_hi[MG], tail_ab[MG];
  BI_UNROLL for (int m = 0; m < MG; ++m) {
    hi[m] = vset1(-INFINITY), ab[m] = vzero();
    tail_hi[m] = -INFINITY, tail_ab[m] = 0.0f;
  }
  for (int64_t v = v0; v < v1; v += 16) {
    const int nv = (int)std::min<int64_t>(16, v1 - v);
    V16 acc[MG][CH];
    BI_UNROLL for (int m = 0; m < MG; ++m)
      BI_UNROLL for (int h = 0; h < CH; ++h) acc[m][h] = vzero();
    for (int64_t j = 0; j < n_out; ++j) {
      const V16 w = ld_n<WBF>(wo, j * V + v, nv);
      const int h = CH == 2 ? (int)(j & 1) : 0;
      BI_UNROLL for (int m = 0; m < MG; ++m) acc[m][h] = vfma(vset1(xo[m * n_out + j]), w, acc[m][h]);
    }
    BI_UNROLL for (int m = 0; m < MG; ++m) {
      float* row = a + m * V + v;
      const V16 sum = CH == 2 ? vadd(acc[m][0], acc[m][CH - 1]) : acc[m][0];
      if (nv == 16) {
        const V16 r = vadd(vload(row), sum);
        vstore(row, r);
        hi[m] = vmax(hi[m], r);
        ab[m] = vmax(ab[m], vmax(r, vsub(vzero(), r)));
      } else {  // the last block's lanes one by one: lanes past the end must not reach the maxima
        const V16 r = vadd(vload_n(row, nv), sum);
        vstore_n(row, r, nv);
        for (int i = 0; i < nv; ++i) {
          tail_hi[m] = std::max(tail_hi[m], row[i]);
          tail_ab[m] = std::max(tail_ab[m], std::fabs(row[i]));
        }
      }
    }
  }
  BI_UNROLL for (int m = 0; m < MG; ++m) {
    mx[m] = std::max(hmax(hi[m]), tail_hi[m]);
    mabs[m] = std::max(hmax(ab[m]), tail_ab[m]);
  }
}

static void approx(const float* xo, int64_t M, int64_t n_out, const void* wo, bool wbf, int64_t V, int64_t v0,
                   int64_t v1, float* a, float* mx, float* mabs) {
  // AVX-512's 32 registers hold 8 rows' chains and maxima: the weights are read once for a verify block
#if BI_KERNEL_PASS == 1
  constexpr int MG = 8;
#else
  constexpr int MG = 4;
#endif
  for (int64_t m0 = 0; m0 < M;)
    m0 += widest_upto<MG>((int)(M - m0), [&](auto w) {
      constexpr int W = decltype(w)::value;
      if (wbf) approx_rows<W, true>(xo + m0 * n_out, n_out, wo, V, v0, v1, a + m0 * V, mx + m0, mabs + m0);
      else approx_rows<W, false>(xo + m0 * n_out, n_out, wo, V, v0, v1, a + m0 * V, mx + m0, mabs + m0);
    });
}

static const Kernels kTable = {kIsaName,      &linear_tile,     &norm_rows, &silu_rows, &attn_items,
                               &selftest_reduce, &quantize_rows, &approx,    &at_least,
                               &row_top_probability};

#endif  // BI_KERNEL_PASS
