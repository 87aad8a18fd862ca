// Host entry points of the batch-invariant CPU kernels (invariant.cpp), for other translation units of the
// same extension that compose them without a trip through Python and the dispatcher.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace bi {

at::Tensor bi_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias,
                     int64_t k_splits, const c10::optional<at::Tensor>& wscale);
at::Tensor bi_linear_partial(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t chunk_begin,
                             int64_t chunk_end, int64_t k_splits, const c10::optional<at::Tensor>& wscale);
at::Tensor bi_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> bi_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                   const at::Tensor& weight, double eps);
at::Tensor bi_silu_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor bi_paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& q_start, const at::Tensor& q_len, const at::Tensor& kv_len,
                              const at::Tensor& kv_slots, const at::Tensor& kv_offsets, double scale, bool causal);

}  // namespace bi
