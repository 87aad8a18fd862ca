// DFlash custom ops: schemas (namespace dflash_trt, prefix dflash_) and the CPU kernels.
// The CUDA kernels live in dflash_ops_cuda.cu (raw kernels) + dflash_ops_cuda_glue.cpp (torch glue);
// the pure-PyTorch oracle of every op is plugins/reference.py, the fake (meta) kernels are in dflash_ops.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "dflash_ops.h"
#include "argmax_row.h"
#include "dflash_ops_common.h"

namespace dflash {
namespace {

using at::Tensor;

Tensor as_long(const Tensor& t) { return t.to(at::kLong).contiguous(); }

// ------------------------------------------------------------------------------- prepare_draft_blocks
std::tuple<Tensor, Tensor, Tensor, Tensor> prepare_draft_blocks_cpu(
    const Tensor& last_tokens, const Tensor& starts, const Tensor& block_tables, int64_t block_size,
    int64_t mask_token_id, int64_t page_size, int64_t num_ctx_slots) {
  check_prepare(last_tokens, starts, block_tables, block_size, page_size, num_ctx_slots);
  const Tensor lt = as_long(last_tokens), st = as_long(starts), bt = as_long(block_tables);
  const int64_t r_n = lt.size(0), b = block_size, max_blocks = bt.size(1);
  const auto opt = lt.options();
  Tensor ids = at::empty({r_n * b}, opt), pos = at::empty({r_n * b}, opt);
  Tensor offsets = at::empty({r_n + 1}, opt), slots = at::empty({num_ctx_slots}, opt);
  const int64_t *plt = lt.data_ptr<int64_t>(), *pst = st.data_ptr<int64_t>(), *pbt = bt.data_ptr<int64_t>();
  int64_t *pids = ids.data_ptr<int64_t>(), *ppos = pos.data_ptr<int64_t>();
  int64_t *poff = offsets.data_ptr<int64_t>(), *pslots = slots.data_ptr<int64_t>();
  poff[0] = 0;
  for (int64_t r = 0; r < r_n; ++r) {
    TORCH_CHECK(pst[r] >= 0, "starts[", r, "] = ", pst[r], " is negative");
    TORCH_CHECK((pst[r] + page_size - 1) / page_size <= max_blocks, "request ", r, ": context length ", pst[r],
                " needs ", (pst[r] + page_size - 1) / page_size, " pages, its block table holds ", max_blocks);
    poff[r + 1] = poff[r] + pst[r];
  }
  TORCH_CHECK(poff[r_n] <= num_ctx_slots, "num_ctx_slots = ", num_ctx_slots, " < total context length ",
              poff[r_n]);
  at::parallel_for(0, r_n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t j = 0; j < b; ++j) {
        pids[r * b + j] = j == 0 ? plt[r] : mask_token_id;
        ppos[r * b + j] = pst[r] + j;
      }
      const int64_t* table = pbt + r * max_blocks;
      int64_t* out = pslots + poff[r];
      for (int64_t p = 0; p < pst[r]; ++p) out[p] = table[p / page_size] * page_size + p % page_size;
    }
  });
  std::fill(pslots + poff[r_n], pslots + num_ctx_slots, kPad);
  return {ids, pos, slots, offsets};
}

// ------------------------------------------------------------------------------------------ verify

// torch.argmax itself: NaN beats everything, ties go to the lowest index.
Tensor argmax_rows(const Tensor& logits) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  if (avx512 && logits.is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.size(1) > 0 &&
      logits.stride(1) == 1) {
    const int64_t rows = logits.size(0), n = logits.size(1), ld = logits.stride(0);
    Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
    const float* x = logits.data_ptr<float>();
    int64_t* o = out.data_ptr<int64_t>();
    at::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) o[r] = dflash::argmax_row_avx512<false>(x + r * ld, n);
    });
    for (int64_t r = 0; r < rows; ++r)
      if (o[r] < 0) return at::argmax(logits, -1).to(at::kLong);
    return out;
  }
#endif
  return at::argmax(logits, -1).to(at::kLong);
}

Tensor rows_view(const Tensor& logits) { return logits.stride(1) == 1 ? logits : logits.contiguous(); }

struct Requests {
  int64_t r_n, k_max, n_rows;
  Tensor drafts, lens, offs;
};

Requests check_requests(const Tensor& drafts, const Tensor& draft_lens, const Tensor& row_offsets, int64_t n_rows) {
  Requests q{drafts.size(0), drafts.size(1), n_rows, as_long(drafts), as_long(draft_lens), as_long(row_offsets)};
  const int64_t *len = q.lens.data_ptr<int64_t>(), *off = q.offs.data_ptr<int64_t>();
  for (int64_t r = 0; r < q.r_n; ++r) {
    TORCH_CHECK(len[r] >= 0 && len[r] <= q.k_max, "draft_lens[", r, "] = ", len[r], " outside [0, ", q.k_max, "]");
    TORCH_CHECK(off[r] >= 0 && off[r] + len[r] + 1 <= n_rows, "request ", r, " owns logits rows ", off[r], "..",
                off[r] + len[r], " but logits has ", n_rows, " rows");
  }
  return q;
}

// Longest prefix of drafts equal to the target's choice of the previous row, then the bonus.
std::tuple<Tensor, Tensor, Tensor> accept(const Requests& q, const int64_t* choice) {
  const auto opt = q.drafts.options();
  Tensor accepted = at::empty({q.r_n}, opt), committed = at::empty({q.r_n, q.k_max + 1}, opt);
  Tensor count = at::empty({q.r_n}, opt);
  const int64_t *d = q.drafts.data_ptr<int64_t>(), *len = q.lens.data_ptr<int64_t>();
  const int64_t* off = q.offs.data_ptr<int64_t>();
  int64_t *pa = accepted.data_ptr<int64_t>(), *pc = committed.data_ptr<int64_t>(), *pn = count.data_ptr<int64_t>();
  for (int64_t r = 0; r < q.r_n; ++r) {
    const int64_t* dr = d + r * q.k_max;
    const int64_t* post = choice + off[r];
    int64_t* out = pc + r * (q.k_max + 1);
    int64_t a = 0;
    while (a < len[r] && dr[a] == post[a]) { out[a] = dr[a]; ++a; }
    out[a] = post[a];
    for (int64_t j = a + 1; j <= q.k_max; ++j) out[j] = kPad;
    pa[r] = a;
    pn[r] = a + 1;
  }
  return {accepted, committed, count};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> greedy_verify_cpu(const Tensor& drafts, const Tensor& draft_lens,
                                                             const Tensor& logits, const Tensor& row_offsets) {
  check_verify(drafts, draft_lens, logits, row_offsets);
  const Tensor lg = rows_view(logits);
  const Requests q = check_requests(drafts, draft_lens, row_offsets, lg.size(0));
  Tensor choice = argmax_rows(lg).contiguous();
  auto [accepted, committed, count] = accept(q, choice.data_ptr<int64_t>());
  return {choice, accepted, committed, count};
}

// One sampled token, reproducing dflash_trt.sampling.sample_rows bit for bit: the float64 division, softmax,
// sort and sum go through the same ATen kernels as filtered_probs (their vectorised reduction orders differ
// from a scalar loop in the last ulp); the top-k threshold, the top-p cut, the cumulative sums (sequential in
// torch too) and the inverse-CDF search are native loops.
int64_t sample_row(const Tensor& logits_row, double temperature, int64_t top_k, double top_p, int64_t seed,
                   int64_t position) {
  const int64_t v = logits_row.size(1);
  Tensor scores = logits_row.to(at::kDouble).div(temperature).contiguous();  // [1, V]
  double* s = scores.data_ptr<double>();
  if (top_k > 0 && top_k < v) {
    std::vector<double> tmp(s, s + v);
    std::nth_element(tmp.begin(), tmp.begin() + (top_k - 1), tmp.end(), std::greater<double>());
    const double kth = tmp[top_k - 1];
    for (int64_t j = 0; j < v; ++j)
      if (s[j] < kth) s[j] = -std::numeric_limits<double>::infinity();
  }
  Tensor probs = at::softmax(scores, -1);
  if (top_p < 1.0) {
    auto sorted = probs.sort(-1, /*descending=*/true);
    const Tensor sp = std::get<0>(sorted).contiguous(), order = std::get<1>(sorted).contiguous();
    const double* psp = sp.data_ptr<double>();
    const int64_t* pord = order.data_ptr<int64_t>();
    Tensor kept = at::zeros_like(probs);
    double* pk = kept.data_ptr<double>();
    double cum = 0.0;
    for (int64_t j = 0; j < v; ++j) {
      cum += psp[j];
      pk[pord[j]] = psp[j] * ((cum - psp[j]) < top_p ? 1.0 : 0.0);
    }
    probs = kept / kept.sum(-1, /*keepdim=*/true);
  }
  probs = probs.contiguous();
  const double* p = probs.data_ptr<double>();
  double total = 0.0;
  for (int64_t j = 0; j < v; ++j) total += p[j];
  const double target = philox_uniform(seed, position) * total;
  double cdf = 0.0;
  for (int64_t j = 0; j < v; ++j) {
    cdf += p[j];
    if (cdf > target) return j;
  }
  return v - 1;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sampling_verify_cpu(
    const Tensor& drafts, const Tensor& draft_lens, const Tensor& logits, const Tensor& row_offsets,
    const Tensor& starts, const Tensor& seeds, const Tensor& temperature, const Tensor& top_k, const Tensor& top_p) {
  check_verify(drafts, draft_lens, logits, row_offsets);
  check_sampling_params(logits, drafts.size(0), starts, seeds, temperature, top_k, top_p);
  const Tensor lg = rows_view(logits);
  const int64_t n = lg.size(0);
  const Requests q = check_requests(drafts, draft_lens, row_offsets, n);
  const Tensor st = as_long(starts), sd = as_long(seeds), tk = as_long(top_k);
  const Tensor temp = temperature.to(at::kDouble).contiguous(), tp = top_p.to(at::kDouble).contiguous();
  const double *ptemp = temp.data_ptr<double>(), *ptp = tp.data_ptr<double>();
  const int64_t *pst = st.data_ptr<int64_t>(), *psd = sd.data_ptr<int64_t>(), *ptk = tk.data_ptr<int64_t>();
  const int64_t *len = q.lens.data_ptr<int64_t>(), *off = q.offs.data_ptr<int64_t>();
  // owner request and row-in-request of every logits row (the first owner wins)
  std::vector<int64_t> owner(n, -1), jrow(n, 0);
  for (int64_t r = 0; r < q.r_n; ++r)
    for (int64_t j = 0; j <= len[r]; ++j)
      if (owner[off[r] + j] < 0) { owner[off[r] + j] = r; jrow[off[r] + j] = j; }
  Tensor choice = argmax_rows(lg).contiguous();  // greedy and unowned rows keep their argmax
  int64_t* pc = choice.data_ptr<int64_t>();
  auto sampled = [&](int64_t i) { return owner[i] >= 0 && ptemp[owner[i]] != 0.0; };
  // Sampled rows run one after another: the ATen reductions inside then split work across threads exactly as
  // they do when the Python reference calls them.
  for (int64_t i = 0; i < n; ++i) {
    if (!sampled(i)) continue;
    const int64_t r = owner[i];
    TORCH_CHECK(ptemp[r] > 0.0, "temperature[", r, "] = ", ptemp[r], " is negative");
    pc[i] = sample_row(lg.narrow(0, i, 1), ptemp[r], ptk[r], ptp[r], psd[r], pst[r] + jrow[i] + 1);
  }
  auto [accepted, committed, count] = accept(q, pc);
  return {choice, accepted, committed, count};
}

// ----------------------------------------------------------------------------------- context_append
inline float load_as_float(const void* p, at::ScalarType t, int64_t i) {
  switch (t) {
    case at::kHalf: return static_cast<float>(static_cast<const c10::Half*>(p)[i]);
    case at::kBFloat16: return static_cast<float>(static_cast<const c10::BFloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Rounds a float to the precision of dtype t (round to nearest even), as a torch op producing t does.
inline float round_to(float x, at::ScalarType t) {
  switch (t) {
    case at::kHalf: return static_cast<float>(c10::Half(x));
    case at::kBFloat16: return static_cast<float>(c10::BFloat16(x));
    default: return x;
  }
}

inline void store_from_float(void* p, at::ScalarType t, int64_t i, float x) {
  switch (t) {
    case at::kHalf: static_cast<c10::Half*>(p)[i] = c10::Half(x); break;
    case at::kBFloat16: static_cast<c10::BFloat16*>(p)[i] = c10::BFloat16(x); break;
    default: static_cast<float*>(p)[i] = x;
  }
}

// k_cache[slot] = rope(rms_norm(k) * w), v_cache[slot] = v, rounding where the eager PyTorch code rounds:
// n = x * rsqrt(mean(x^2) + eps) in float32 -> dtype(k); w * n -> promote(w, k) = P; x*cos, rot*sin, their
// sum -> promote(P, cos) = Q; then the cache dtype.
void context_append_cpu(const Tensor& k, const Tensor& v, const Tensor& k_norm_weight, const Tensor& cos,
                        const Tensor& sin, const Tensor& slots, Tensor& k_cache, Tensor& v_cache, double eps) {
  check_context_append(k, v, k_norm_weight, cos, sin, slots, k_cache, v_cache);
  const Tensor kc = k.contiguous(), vc = v.contiguous(), w = k_norm_weight.contiguous();
  const Tensor cs = cos.contiguous(), sn = sin.contiguous(), sl = as_long(slots);
  const int64_t t_n = kc.size(0), kvh = kc.size(1), d = kc.size(2), half = d / 2;
  const int64_t n_slots = k_cache.size(0) * k_cache.size(1);
  const at::ScalarType xt = kc.scalar_type(), wt = w.scalar_type(), ct = cs.scalar_type();
  const at::ScalarType pt = at::promote_types(wt, xt), qt = at::promote_types(pt, ct);
  const at::ScalarType kct = k_cache.scalar_type(), vct = v_cache.scalar_type(), vt = vc.scalar_type();
  const int64_t* ps = sl.data_ptr<int64_t>();
  for (int64_t i = 0; i < t_n; ++i)
    TORCH_CHECK(ps[i] < n_slots, "slots[", i, "] = ", ps[i], " outside the cache (", n_slots, " slots)");
  const void *px = kc.data_ptr(), *pv = vc.data_ptr(), *pw = w.data_ptr(), *pcos = cs.data_ptr(), *psin = sn.data_ptr();
  void *pkc = k_cache.data_ptr(), *pvc = v_cache.data_ptr();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, t_n * kvh, 16, [&](int64_t lo, int64_t hi) {
    std::vector<float> kn(d);
    for (int64_t th = lo; th < hi; ++th) {
      const int64_t t = th / kvh, row = th * d;
      if (ps[t] < 0) continue;  // padding row
      float ss = 0.f;
      for (int64_t j = 0; j < d; ++j) {
        const float x = load_as_float(px, xt, row + j);
        ss += x * x;
      }
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + feps);
      for (int64_t j = 0; j < d; ++j) {
        const float n = round_to(load_as_float(px, xt, row + j) * r, xt);
        kn[j] = round_to(load_as_float(pw, wt, j) * n, pt);
      }
      const int64_t dst = (ps[t] * kvh + th % kvh) * d;
      for (int64_t j = 0; j < d; ++j) {
        const float rot = j < half ? -kn[j + half] : kn[j - half];
        const float a = round_to(kn[j] * load_as_float(pcos, ct, t * d + j), qt);
        const float b = round_to(rot * load_as_float(psin, ct, t * d + j), qt);
        store_from_float(pkc, kct, dst + j, round_to(a + b, qt));
        store_from_float(pvc, vct, dst + j, load_as_float(pv, vt, row + j));
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dflash_trt, m) {
  m.def(kSchemaPrepare);
  m.def(kSchemaGreedy);
  m.def(kSchemaSampling);
  m.def(kSchemaAppend);
}

TORCH_LIBRARY_IMPL(dflash_trt, CPU, m) {
  m.impl("dflash_prepare_draft_blocks", &prepare_draft_blocks_cpu);
  m.impl("dflash_greedy_verify", &greedy_verify_cpu);
  m.impl("dflash_sampling_verify", &sampling_verify_cpu);
  m.impl("dflash_context_append", &context_append_cpu);
}

}  // namespace dflash
