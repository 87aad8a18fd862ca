// CUDA dispatch of the DFlash ops: argument checks, dtype conversions and output allocation with torch,
// then the raw launchers of dflash_ops_cuda.cu on the current stream. Built only where torch has CUDA
// (dflash_ops.py adds it to the JIT build then). Only c10/cuda headers are used (no cuBLAS-dependent ATen
// headers), so plugins/check_cuda.sh can also compile this file against a CPU torch's headers.
// With DFLASH_CUDA_EMU defined (plugins/gpu_check.py --emulate) the same glue drives the CPU emulation of the
// kernels instead, as ops dflash_emu::dflash_* on CPU tensors.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#ifdef DFLASH_CUDA_EMU
#include "dflash_ops_cuda_emu.h"
namespace c10 {
namespace cuda {
struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
};
struct EmuStream {
  cudaStream_t stream() const { return nullptr; }
};
inline EmuStream getCurrentCUDAStream() { return {}; }
}  // namespace cuda
}  // namespace c10
#else
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

#include "dflash_ops.h"
#include "dflash_ops_cuda.cuh"

namespace dflash {
namespace {

using at::Tensor;

cuda::DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda::kF32;
    case at::kHalf: return cuda::kF16;
    case at::kBFloat16: return cuda::kBF16;
    case at::kDouble: return cuda::kF64;
    default: TORCH_CHECK(false, "unsupported dtype ", t);
  }
}

void check_launch(cudaError_t e, const char* op) {
  TORCH_CHECK(e == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(e));
}

void check_cuda(const Tensor& t, const char* name) {
#ifndef DFLASH_CUDA_EMU
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
#endif
}

Tensor as_long(const Tensor& t) { return t.to(at::kLong).contiguous(); }

int num_sms(int device) {
  static int cached[64] = {0};
  if (device >= 0 && device < 64 && cached[device]) return cached[device];
  int n = 0;
  check_launch(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  if (device >= 0 && device < 64) cached[device] = n;
  return n;
}

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

std::tuple<Tensor, Tensor, Tensor, Tensor> prepare_draft_blocks_cuda(
    const Tensor& last_tokens, const Tensor& starts, const Tensor& block_tables, int64_t block_size,
    int64_t mask_token_id, int64_t page_size, int64_t num_ctx_slots) {
  check_prepare(last_tokens, starts, block_tables, block_size, page_size, num_ctx_slots);
  check_cuda(last_tokens, "last_tokens");
  const c10::cuda::CUDAGuard guard(last_tokens.device());
  const Tensor lt = as_long(last_tokens), st = as_long(starts), bt = as_long(block_tables);
  const int64_t r_n = lt.size(0);
  const auto opt = lt.options();
  Tensor ids = at::empty({r_n * block_size}, opt), pos = at::empty({r_n * block_size}, opt);
  Tensor slots = at::empty({num_ctx_slots}, opt), offsets = at::empty({r_n + 1}, opt);
  check_launch(cuda::launch_prepare_draft_blocks(lt.data_ptr<int64_t>(), st.data_ptr<int64_t>(),
                                                 bt.data_ptr<int64_t>(), r_n, bt.size(1), block_size, mask_token_id,
                                                 page_size, num_ctx_slots, ids.data_ptr<int64_t>(),
                                                 pos.data_ptr<int64_t>(), slots.data_ptr<int64_t>(),
                                                 offsets.data_ptr<int64_t>(), stream()),
               "dflash_prepare_draft_blocks");
  return {ids, pos, slots, offsets};
}

struct Verify {
  Tensor drafts, lens, offs, logits, accepted, committed, count;
};

Verify verify_inputs(const Tensor& drafts, const Tensor& draft_lens, const Tensor& logits, const Tensor& row_offsets) {
  check_verify(drafts, draft_lens, logits, row_offsets);
  check_cuda(logits, "logits");
  Verify v;
  v.drafts = as_long(drafts);
  v.lens = as_long(draft_lens);
  v.offs = as_long(row_offsets);
  v.logits = logits.stride(1) == 1 ? logits : logits.contiguous();
  const int64_t r = drafts.size(0);
  const auto opt = v.drafts.options();
  v.accepted = at::empty({r}, opt);
  v.committed = at::empty({r, drafts.size(1) + 1}, opt);
  v.count = at::empty({r}, opt);
  return v;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> greedy_verify_cuda(const Tensor& drafts, const Tensor& draft_lens,
                                                              const Tensor& logits, const Tensor& row_offsets) {
  const c10::cuda::CUDAGuard guard(logits.device());
  Verify v = verify_inputs(drafts, draft_lens, logits, row_offsets);
  const int64_t rows = v.logits.size(0), vocab = v.logits.size(1);
  const int splits = cuda::greedy_splits(rows, vocab, num_sms(logits.get_device()));
  Tensor part_v = at::empty({rows * splits}, v.logits.options().dtype(at::kDouble));
  Tensor part_i = at::empty({rows * splits}, v.drafts.options());
  Tensor choice = at::empty({rows}, v.drafts.options());
  check_launch(cuda::launch_greedy_verify(v.logits.data_ptr(), dtype_of(v.logits.scalar_type()), rows, vocab,
                                          v.logits.stride(0), v.drafts.data_ptr<int64_t>(),
                                          v.lens.data_ptr<int64_t>(), v.offs.data_ptr<int64_t>(), v.drafts.size(0),
                                          v.drafts.size(1), splits, part_v.data_ptr<double>(),
                                          part_i.data_ptr<int64_t>(), choice.data_ptr<int64_t>(),
                                          v.accepted.data_ptr<int64_t>(), v.committed.data_ptr<int64_t>(),
                                          v.count.data_ptr<int64_t>(), stream()),
               "dflash_greedy_verify");
  return {choice, v.accepted, v.committed, v.count};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sampling_verify_cuda(
    const Tensor& drafts, const Tensor& draft_lens, const Tensor& logits, const Tensor& row_offsets,
    const Tensor& starts, const Tensor& seeds, const Tensor& temperature, const Tensor& top_k, const Tensor& top_p) {
  const c10::cuda::CUDAGuard guard(logits.device());
  Verify v = verify_inputs(drafts, draft_lens, logits, row_offsets);
  check_sampling_params(logits, drafts.size(0), starts, seeds, temperature, top_k, top_p);
  TORCH_CHECK(logits.scalar_type() != at::kDouble,
              "dflash_sampling_verify on CUDA takes float32, float16 or bfloat16 logits");
  const Tensor st = as_long(starts), sd = as_long(seeds), tk = as_long(top_k);
  const Tensor temp = temperature.to(at::kDouble).contiguous(), tp = top_p.to(at::kDouble).contiguous();
  const int64_t rows = v.logits.size(0), vocab = v.logits.size(1);
  Tensor choice = at::empty({rows}, v.drafts.options());
  check_launch(cuda::launch_sampling_verify(v.logits.data_ptr(), dtype_of(v.logits.scalar_type()), rows, vocab,
                                            v.logits.stride(0), v.drafts.data_ptr<int64_t>(),
                                            v.lens.data_ptr<int64_t>(), v.offs.data_ptr<int64_t>(),
                                            v.drafts.size(0), v.drafts.size(1), st.data_ptr<int64_t>(),
                                            sd.data_ptr<int64_t>(), temp.data_ptr<double>(), tk.data_ptr<int64_t>(),
                                            tp.data_ptr<double>(), choice.data_ptr<int64_t>(),
                                            v.accepted.data_ptr<int64_t>(), v.committed.data_ptr<int64_t>(),
                                            v.count.data_ptr<int64_t>(), stream()),
               "dflash_sampling_verify");
  return {choice, v.accepted, v.committed, v.count};
}

void context_append_cuda(const Tensor& k, const Tensor& v, const Tensor& k_norm_weight, const Tensor& cos,
                         const Tensor& sin, const Tensor& slots, Tensor& k_cache, Tensor& v_cache, double eps) {
  check_context_append(k, v, k_norm_weight, cos, sin, slots, k_cache, v_cache);
  check_cuda(k_cache, "k_cache");
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const Tensor kc = k.contiguous(), vc = v.contiguous(), w = k_norm_weight.contiguous();
  const Tensor cs = cos.contiguous(), sn = sin.contiguous(), sl = as_long(slots);
  const at::ScalarType pt = at::promote_types(w.scalar_type(), kc.scalar_type());
  const at::ScalarType qt = at::promote_types(pt, cs.scalar_type());
  const cuda::AppendDTypes dt{dtype_of(kc.scalar_type()), dtype_of(vc.scalar_type()), dtype_of(w.scalar_type()),
                              dtype_of(cs.scalar_type()), dtype_of(k_cache.scalar_type()),
                              dtype_of(v_cache.scalar_type()), dtype_of(pt), dtype_of(qt)};
  check_launch(cuda::launch_context_append(kc.data_ptr(), vc.data_ptr(), w.data_ptr(), cs.data_ptr(), sn.data_ptr(),
                                           sl.data_ptr<int64_t>(), k_cache.data_ptr(), v_cache.data_ptr(),
                                           kc.size(0), kc.size(1), kc.size(2), k_cache.size(0) * k_cache.size(1),
                                           dt, static_cast<float>(eps), stream()),
               "dflash_context_append");
}

}  // namespace

#ifdef DFLASH_CUDA_EMU
TORCH_LIBRARY(dflash_emu, m) {
  m.def(kSchemaPrepare);
  m.def(kSchemaGreedy);
  m.def(kSchemaSampling);
  m.def(kSchemaAppend);
}
TORCH_LIBRARY_IMPL(dflash_emu, CPU, m) {
#else
TORCH_LIBRARY_IMPL(dflash_trt, CUDA, m) {
#endif
  m.impl("dflash_prepare_draft_blocks", &prepare_draft_blocks_cuda);
  m.impl("dflash_greedy_verify", &greedy_verify_cuda);
  m.impl("dflash_sampling_verify", &sampling_verify_cuda);
  m.impl("dflash_context_append", &context_append_cuda);
}

}  // namespace dflash
