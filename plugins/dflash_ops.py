"""DFlash kernels as PyTorch custom ops (namespace `dflash_trt`, names prefixed `dflash_`).

    from dflash_trt.plugins import dflash_ops
    if dflash_ops.available():          # builds (once, cached) and loads; False when no compiler works
        out = dflash_ops.greedy_verify(drafts, draft_lens, logits, row_offsets)

The C++ extension is compiled just in time by `build.load_extension`: csrc/dflash_ops.cpp (schemas + CPU
kernels) always; where torch has CUDA, also csrc/dflash_ops_cuda.cu (raw kernels) and
csrc/dflash_ops_cuda_glue.cpp (the CUDA dispatch). Fake (meta) kernels are registered here, so
torch.compile and CUDA-graph capture can trace the ops; no op synchronises with the host.

Ragged batches: R requests, request r has K_r = draft_lens[r] drafts (drafts is padded to [R, Kmax]) and owns
the K_r + 1 logits rows row_offsets[r] .. row_offsets[r] + K_r (row j is the target's verify row j: its
choice is the token at position starts[r] + j + 1). Index outputs are int64, padded with -1.

Device notes: the CPU kernels equal plugins/reference.py exactly, token for token (context_append: up to a
rare last-ulp difference from the summation order of the float32 mean of squares). The CUDA sampler computes
the same float64 distribution with another summation order (parallel reductions, a threshold search over the
logits instead of a sort), so its token can differ from the CPU one only (a) when u * total or the top-p mass
lands within float64 rounding of a step, or (b) on ties at the top-p cut: when only some of several equal
probabilities are kept, the kernel keeps the lowest token ids while the CPU (torch.sort, not stable) keeps an
implementation-defined subset. Both are deterministic run to run and independent of the rest of the batch.
CUDA sampling takes float32/float16/bfloat16 logits (greedy also float64); NaN logits are undefined there.
Without a GPU, `python -m dflash_trt.plugins.gpu_check --emulate` checks the CUDA kernels' logic on the CPU.
"""
from __future__ import annotations

import os
import threading

import torch

from .build import load_extension

_NS = "dflash_trt"
_lock = threading.Lock()
_state: dict[str, object] = {"loaded": False, "error": None}


def _sources() -> tuple[str, list[str], bool]:
    cuda = torch.version.cuda is not None and os.environ.get("DFLASH_TRT_NO_CUDA_OPS") != "1"
    if cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        cuda = CUDA_HOME is not None
    if cuda:
        return "dflash_ops_cuda", ["dflash_ops.cpp", "dflash_ops_cuda_glue.cpp", "dflash_ops_cuda.cu"], True
    return "dflash_ops_cpu", ["dflash_ops.cpp"], False


def load() -> None:
    """Build (once per source hash and torch version) and load the extension, then register fake kernels.
    Raises if the build fails."""
    with _lock:
        if _state["loaded"]:
            return
        if not hasattr(torch.ops.dflash_trt, "dflash_greedy_verify"):
            name, sources, with_cuda = _sources()
            load_extension(name, sources, with_cuda=with_cuda)
        _register_fakes()
        _state["loaded"] = True


def available() -> bool:
    """True when the ops are loaded (building them now if needed); False, with `load_error()`, otherwise."""
    if _state["loaded"]:
        return True
    if _state["error"] is not None:
        return False
    try:
        load()
        return True
    except Exception as e:  # no compiler, headers missing, ...
        _state["error"] = e
        return False


def load_error() -> Exception | None:
    return _state["error"]  # type: ignore[return-value]


def has_cuda_kernels() -> bool:
    """Whether the loaded library carries the CUDA kernels."""
    load()
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{_NS}::dflash_greedy_verify", "CUDA")


# ------------------------------------------------------------------------------------------ fake kernels
def _register_fakes() -> None:
    def fake_prepare(last_tokens, starts, block_tables, block_size, mask_token_id, page_size, num_ctx_slots):
        r = last_tokens.shape[0]
        new = last_tokens.new_empty
        return (new((r * block_size,), dtype=torch.int64), new((r * block_size,), dtype=torch.int64),
                new((num_ctx_slots,), dtype=torch.int64), new((r + 1,), dtype=torch.int64))

    def _verify_outputs(drafts, logits):
        r, k_max = drafts.shape
        new = logits.new_empty
        return (new((logits.shape[0],), dtype=torch.int64), new((r,), dtype=torch.int64),
                new((r, k_max + 1), dtype=torch.int64), new((r,), dtype=torch.int64))

    def fake_greedy(drafts, draft_lens, logits, row_offsets):
        return _verify_outputs(drafts, logits)

    def fake_sampling(drafts, draft_lens, logits, row_offsets, starts, seeds, temperature, top_k, top_p):
        return _verify_outputs(drafts, logits)

    def fake_append(k, v, k_norm_weight, cos, sin, slots, k_cache, v_cache, eps):
        return None

    for name, fn in (("dflash_prepare_draft_blocks", fake_prepare), ("dflash_greedy_verify", fake_greedy),
                     ("dflash_sampling_verify", fake_sampling), ("dflash_context_append", fake_append)):
        qual = f"{_NS}::{name}"
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qual, "Meta"):
            try:
                torch.library.register_fake(qual)(fn)
            except RuntimeError as e:  # registered by an earlier import of this file under another name
                if "already has" not in str(e):
                    raise


# ---------------------------------------------------------------------------------------------- wrappers
def prepare_draft_blocks(last_tokens: torch.Tensor, starts: torch.Tensor, block_tables: torch.Tensor, *,
                         block_size: int, mask_token_id: int, page_size: int,
                         num_ctx_slots: int | None = None):
    """Drafter inputs for a batch of R drafting requests.

    last_tokens [R] (each request's newest committed token, the bonus), starts [R] (its committed length =
    the bonus's position), block_tables [R, max_blocks] (int32 or int64).
    Returns (block_ids [R*B], positions [R*B], ctx_slots [num_ctx_slots], ctx_offsets [R+1]): the block
    [bonus, MASK x (B-1)] at positions start..start+B-1 per request, and the flat drafter-cache slots of its
    context positions 0..start-1 at ctx_slots[ctx_offsets[r]:ctx_offsets[r+1]] (-1 past ctx_offsets[R]).
    num_ctx_slots: the capacity of ctx_slots (>= sum(starts); fixed for CUDA graphs). None: exactly
    sum(starts), which reads starts on the host (a synchronisation when starts is on a GPU).
    """
    load()
    if num_ctx_slots is None:
        num_ctx_slots = int(starts.sum())
    return torch.ops.dflash_trt.dflash_prepare_draft_blocks(last_tokens, starts, block_tables, block_size,
                                                            mask_token_id, page_size, num_ctx_slots)


def greedy_verify(drafts: torch.Tensor, draft_lens: torch.Tensor, logits: torch.Tensor, row_offsets: torch.Tensor):
    """Greedy (T = 0) acceptance. drafts [R, Kmax], draft_lens [R], logits [N, V] (fp32/fp16/bf16/fp64; row
    stride free, last dim contiguous), row_offsets [R] or [R+1] (first logits row of each request).
    Returns (argmax [N], accepted [R] = a, committed [R, Kmax+1] = d_1..d_a, argmax(row a), then -1,
    num_committed [R] = a + 1). Every logits row gets its argmax, also rows no request owns."""
    load()
    return torch.ops.dflash_trt.dflash_greedy_verify(drafts, draft_lens, logits, row_offsets)


def sampling_verify(drafts: torch.Tensor, draft_lens: torch.Tensor, logits: torch.Tensor, row_offsets: torch.Tensor,
                    starts: torch.Tensor, seeds: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor):
    """Lossless exact-match acceptance against the target's own seeded sample (dflash_trt.sampling).
    Per request: starts [R] (position of row 0's input token), seeds [R] int64, temperature [R] (float64:
    0 means greedy), top_k [R] (<= 0 or >= V: off), top_p [R] (float64, >= 1: off).
    Returns (sampled [N], accepted, committed, num_committed) as greedy_verify; rows no request owns get
    their argmax."""
    load()
    return torch.ops.dflash_trt.dflash_sampling_verify(drafts, draft_lens, logits, row_offsets, starts, seeds,
                                                       temperature, top_k, top_p)


def context_append(k: torch.Tensor, v: torch.Tensor, k_norm_weight: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   eps: float) -> None:
    """Fused k_norm (RMSNorm over D) + rotate-half RoPE + scatter of drafter context K/V, in place.
    k, v [T, KVH, D] (k_proj(c), v_proj(c) viewed per head), k_norm_weight [D], cos/sin [T, D] (rows for the
    rows' positions), slots [T] flat cache slots (-1: skip the row), caches [num_blocks, page, KVH, D]."""
    load()
    torch.ops.dflash_trt.dflash_context_append(k, v, k_norm_weight, cos, sin, slots, k_cache, v_cache, float(eps))
