// Torch-side declarations shared by the CPU ops (dflash_ops.cpp) and the CUDA glue
// (dflash_ops_cuda_glue.cpp): argument checks, so both devices refuse the same malformed calls.
#pragma once

#include <ATen/ATen.h>

namespace dflash {

// Op schemas (namespace dflash_trt; also used by the CPU emulation of the CUDA kernels, see gpu_check.py).
constexpr const char* kSchemaPrepare =
    "dflash_prepare_draft_blocks(Tensor last_tokens, Tensor starts, Tensor block_tables, int block_size, "
    "int mask_token_id, int page_size, int num_ctx_slots) -> (Tensor block_ids, Tensor positions, "
    "Tensor ctx_slots, Tensor ctx_offsets)";
constexpr const char* kSchemaGreedy =
    "dflash_greedy_verify(Tensor drafts, Tensor draft_lens, Tensor logits, Tensor row_offsets) -> "
    "(Tensor argmax, Tensor accepted, Tensor committed, Tensor num_committed)";
constexpr const char* kSchemaSampling =
    "dflash_sampling_verify(Tensor drafts, Tensor draft_lens, Tensor logits, Tensor row_offsets, "
    "Tensor starts, Tensor seeds, Tensor temperature, Tensor top_k, Tensor top_p) -> "
    "(Tensor sampled, Tensor accepted, Tensor committed, Tensor num_committed)";
constexpr const char* kSchemaAppend =
    "dflash_context_append(Tensor k, Tensor v, Tensor k_norm_weight, Tensor cos, Tensor sin, Tensor slots, "
    "Tensor(a!) k_cache, Tensor(b!) v_cache, float eps) -> ()";

inline void check_index_vector(const at::Tensor& t, const char* name, int64_t n) {
  TORCH_CHECK(t.dim() == 1, name, " must be 1-D, got ", t.sizes());
  TORCH_CHECK(!at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool,
              name, " must be an integer tensor, got ", t.scalar_type());
  if (n >= 0) TORCH_CHECK(t.size(0) == n, name, " must have ", n, " entries, got ", t.size(0));
}

inline void check_prepare(const at::Tensor& last_tokens, const at::Tensor& starts,
                          const at::Tensor& block_tables, int64_t block_size, int64_t page_size,
                          int64_t num_ctx_slots) {
  check_index_vector(last_tokens, "last_tokens", -1);
  const int64_t r = last_tokens.size(0);
  check_index_vector(starts, "starts", r);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == r,
              "block_tables must be [R, max_blocks] with R = ", r, ", got ", block_tables.sizes());
  TORCH_CHECK(!at::isFloatingType(block_tables.scalar_type()), "block_tables must be an integer tensor");
  TORCH_CHECK(block_size >= 1, "block_size must be >= 1, got ", block_size);
  TORCH_CHECK(page_size >= 1, "page_size must be >= 1, got ", page_size);
  TORCH_CHECK(num_ctx_slots >= 0, "num_ctx_slots must be >= 0, got ", num_ctx_slots);
  TORCH_CHECK(last_tokens.device() == starts.device() && starts.device() == block_tables.device(),
              "prepare_draft_blocks: all tensors must be on one device");
}

inline void check_verify(const at::Tensor& drafts, const at::Tensor& draft_lens, const at::Tensor& logits,
                         const at::Tensor& row_offsets) {
  TORCH_CHECK(drafts.dim() == 2, "drafts must be [R, Kmax], got ", drafts.sizes());
  TORCH_CHECK(!at::isFloatingType(drafts.scalar_type()), "drafts must be an integer tensor");
  const int64_t r = drafts.size(0);
  check_index_vector(draft_lens, "draft_lens", r);
  check_index_vector(row_offsets, "row_offsets", -1);
  TORCH_CHECK(row_offsets.size(0) == r || row_offsets.size(0) == r + 1,
              "row_offsets must have R or R+1 entries (R = ", r, "), got ", row_offsets.size(0));
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) >= 1, "logits must be [N, V] with V >= 1, got ",
              logits.sizes());
  const auto dt = logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble,
              "logits must be float32, float16, bfloat16 or float64, got ", dt);
  TORCH_CHECK(drafts.device() == logits.device() && draft_lens.device() == logits.device() &&
              row_offsets.device() == logits.device(), "verify: all tensors must be on one device");
}

inline void check_sampling_params(const at::Tensor& logits, int64_t r, const at::Tensor& starts,
                                  const at::Tensor& seeds, const at::Tensor& temperature,
                                  const at::Tensor& top_k, const at::Tensor& top_p) {
  check_index_vector(starts, "starts", r);
  check_index_vector(seeds, "seeds", r);
  check_index_vector(top_k, "top_k", r);
  TORCH_CHECK(temperature.dim() == 1 && temperature.size(0) == r && at::isFloatingType(temperature.scalar_type()),
              "temperature must be a floating [R] tensor (float64 reproduces Python floats exactly)");
  TORCH_CHECK(top_p.dim() == 1 && top_p.size(0) == r && at::isFloatingType(top_p.scalar_type()),
              "top_p must be a floating [R] tensor (float64 reproduces Python floats exactly)");
  for (const at::Tensor* t : {&starts, &seeds, &temperature, &top_k, &top_p})
    TORCH_CHECK(t->device() == logits.device(), "sampling_verify: all tensors must be on one device");
}

inline void check_context_append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& w,
                                 const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                                 const at::Tensor& k_cache, const at::Tensor& v_cache) {
  TORCH_CHECK(k.dim() == 3, "k must be [T, KVH, D], got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have k's shape ", k.sizes(), ", got ", v.sizes());
  const int64_t t = k.size(0), kvh = k.size(1), d = k.size(2);
  TORCH_CHECK(d % 2 == 0, "head_dim must be even (rotate-half RoPE), got ", d);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == d, "k_norm_weight must be [D] = [", d, "], got ", w.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == t && cos.size(1) == d, "cos must be [T, D], got ", cos.sizes());
  TORCH_CHECK(sin.sizes() == cos.sizes(), "sin must have cos's shape, got ", sin.sizes());
  TORCH_CHECK(sin.scalar_type() == cos.scalar_type(), "cos and sin must have one dtype");
  check_index_vector(slots, "slots", t);
  for (const at::Tensor* c : {&k_cache, &v_cache}) {
    TORCH_CHECK(c->dim() == 4 && c->size(2) == kvh && c->size(3) == d,
                "caches must be [num_blocks, page, KVH, D] with KVH = ", kvh, ", D = ", d, ", got ", c->sizes());
    TORCH_CHECK(c->is_contiguous(), "caches must be contiguous");
  }
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache must have one shape");
  for (const at::Tensor* x : {&k, &v, &w, &cos, &sin, &k_cache, &v_cache}) {
    const auto dt = x->scalar_type();
    TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16,
                "context_append supports float32, float16 and bfloat16 tensors, got ", dt);
    TORCH_CHECK(x->device() == k_cache.device(), "context_append: all tensors must be on one device");
  }
  TORCH_CHECK(slots.device() == k_cache.device(), "context_append: all tensors must be on one device");
}

}  // namespace dflash
