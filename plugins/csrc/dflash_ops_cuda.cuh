// Launchers of the DFlash CUDA kernels (dflash_ops_cuda.cu). Raw pointers and plain types only: the kernels
// compile with plain nvcc (no torch headers); dflash_ops_cuda_glue.cpp calls these with torch tensors.
// All launchers are asynchronous on `stream`, never synchronise, and return the launch status.
#pragma once

#ifndef DFLASH_CUDA_EMU
#include <cuda_runtime.h>
#endif
#include <stdint.h>

namespace dflash {
namespace cuda {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };

// Context slots, block ids and positions of a batch of drafting requests (see dflash_ops.py).
cudaError_t launch_prepare_draft_blocks(const int64_t* last_tokens, const int64_t* starts,
                                        const int64_t* block_tables, int64_t num_requests, int64_t max_blocks,
                                        int64_t block_size, int64_t mask_token_id, int64_t page_size,
                                        int64_t num_ctx_slots, int64_t* block_ids, int64_t* positions,
                                        int64_t* ctx_slots, int64_t* ctx_offsets, cudaStream_t stream);

// How many CTAs split one logits row in the greedy argmax (scratch: rows * splits values and indices).
int greedy_splits(int64_t rows, int64_t vocab, int num_sms);

// argmax of every logits row, then acceptance. scratch_val: rows * splits doubles, scratch_idx: int64s.
cudaError_t launch_greedy_verify(const void* logits, DType dtype, int64_t rows, int64_t vocab, int64_t row_stride,
                                 const int64_t* drafts, const int64_t* draft_lens, const int64_t* row_offsets,
                                 int64_t num_requests, int64_t k_max, int splits, double* scratch_val,
                                 int64_t* scratch_idx, int64_t* argmax, int64_t* accepted, int64_t* committed,
                                 int64_t* num_committed, cudaStream_t stream);

// One token per logits row (seeded sample of its owner request, argmax when greedy or unowned), then acceptance.
// dtype: kF32, kF16 or kBF16.
cudaError_t launch_sampling_verify(const void* logits, DType dtype, int64_t rows, int64_t vocab, int64_t row_stride,
                                   const int64_t* drafts, const int64_t* draft_lens, const int64_t* row_offsets,
                                   int64_t num_requests, int64_t k_max, const int64_t* starts, const int64_t* seeds,
                                   const double* temperature, const int64_t* top_k, const double* top_p,
                                   int64_t* sampled, int64_t* accepted, int64_t* committed, int64_t* num_committed,
                                   cudaStream_t stream);

// Fused k_norm + RoPE + scatter of drafter context K/V. k/v/cos/sin contiguous; dtypes per tensor; pt/qt: the
// dtypes the eager PyTorch code rounds to after the weight product (promote(w, k)) and in RoPE
// (promote(pt, cos)).
struct AppendDTypes {
  DType k, v, w, cs, kc, vc, p, q;
};
cudaError_t launch_context_append(const void* k, const void* v, const void* k_norm_weight, const void* cos,
                                  const void* sin, const int64_t* slots, void* k_cache, void* v_cache,
                                  int64_t tokens, int64_t kv_heads, int64_t head_dim, int64_t num_slots,
                                  AppendDTypes dt, float eps, cudaStream_t stream);

}  // namespace cuda
}  // namespace dflash
