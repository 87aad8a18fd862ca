"""GPU step timing of our model code at real shapes, with random weights (nothing downloaded, nothing read
beyond the repository), against the memory-bound floor; then the CUDA plugin ops (plugins/gpu_check.py).

    python benchmarks/gpu_timing.py --json gpu_timing.json            # one GPU, a few minutes
    python benchmarks/gpu_timing.py --device cpu --tiny --json t.json  # the same code path, tiny, on a CPU (CI)

For each target (Llama-3.1-8B and Qwen3-8B dimensions, bf16) with a 5-layer DFlash drafter of the same hidden
size (block 16), built ON the device with TargetModel / DFlashDrafter from their configs and random weights,
and a paged KV cache holding --context committed tokens per sequence (random K/V, random page order), it times
at batch 1, 8 and 32:

  ar          one target step, 1 row per sequence: forward + head + greedy choice
  verify K+1  one target step of K+1 = 8 or 16 rows per sequence, capturing the drafter's layer features,
              head over every row + greedy choice (acceptance itself is a plugin op, timed below)
  draft K     the drafter's part of an iteration: the context write of the K+1 rows the last verify could
              commit (fc, k/v projections, cache scatter), one forward over the 16-row block, the target's head
              over the K draft rows + argmax

each captured once as a CUDA graph at its fixed shapes (torch.cuda.CUDAGraph) and timed by replay (median of
--reps, CUDA events), falling back to torch.compile or eager with a note if capture fails (--mode picks the
first choice). Each row reports ms, the memory floor (weights read + KV read and written, / --bandwidth), the
arithmetic floor (2 x MACs + attention, / --tflops), floor = the larger, and floor / ms. Then the DFlash speed-up
bound tau * t_ar / (t_draft(K) + t_verify(K+1)) for tau = 3, 5, 7 (and the same from the floors). Last, the
plugin ops' checks and timing table of plugins/gpu_check.py (CUDA only). One table is printed; --json writes
everything (rewritten after each model, so a run cut short keeps what it finished).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_package():
    """dflash_trt as installed, else the repository's runtime/ and plugins/ folders under that name."""
    try:
        import dflash_trt  # noqa: F401
        from dflash_trt.plugins import gpu_check  # noqa: F401
        return
    except ImportError:
        pass
    import importlib.util

    for name, folder in (("dflash_trt", "runtime"), ("dflash_trt.plugins", "plugins")):
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, "__init__.py"),
                                                      submodule_search_locations=[os.path.join(ROOT, folder)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    sys.modules["dflash_trt"].plugins = sys.modules["dflash_trt.plugins"]


_import_package()

from dflash_trt.attention import AttentionBatch  # noqa: E402
from dflash_trt.config import DraftConfig, TargetConfig  # noqa: E402
from dflash_trt.kv_cache import allocate_caches  # noqa: E402
from dflash_trt.models.draft import DFlashDrafter, DraftSlice  # noqa: E402
from dflash_trt.models.target import TargetModel  # noqa: E402
from dflash_trt.plugins import gpu_check  # noqa: E402  (its timing and bandwidth logic; the ops' checks)

SCHEMA = "dflash-gpu-timing/1"
TAUS = (3, 5, 7)

# Hugging Face config.json fields of the two targets (random weights: only the shapes matter)
MODELS = {
    "llama3.1-8b": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=[128001, 128008, 128009], mask_token_id=128002),
    "qwen3-8b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope_theta=1000000.0, rope_scaling=None, tie_word_embeddings=False,
        bos_token_id=151643, eos_token_id=151645, mask_token_id=151669),
}
# the Llama target as an FP8 engine runs it: e4m3 weights and activations, native FP8 GEMMs (runtime/ops.py
# fp8_linear, torch._scaled_mm) in every decoder-layer linear; embeddings, head and drafter stay bf16
MODELS["llama3.1-8b-fp8"] = dict(MODELS["llama3.1-8b"], fp8=True)
# the same families at toy size: CI runs the whole code path on a CPU in seconds
TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, mask_token_id=999)
DRAFT_LAYERS, TINY_DRAFT_LAYERS, BLOCK = 5, 2, 16


def target_config(spec: dict) -> TargetConfig:
    """TargetConfig.from_hf over a plain namespace of config.json fields (no transformers object needed)."""
    hf = types.SimpleNamespace(**{k: v for k, v in spec.items() if k not in ("mask_token_id", "fp8")})
    return TargetConfig.from_hf(hf)


def draft_config(spec: dict, n_layers: int) -> DraftConfig:
    """A z-lab-format drafter config.json for this target: Qwen3-style layers of the target's width."""
    raw = {"architectures": ["DFlashDraftModel"], "hidden_size": spec["hidden_size"],
           "intermediate_size": spec["intermediate_size"], "num_hidden_layers": n_layers,
           "num_attention_heads": spec["num_attention_heads"], "num_key_value_heads": spec["num_key_value_heads"],
           "head_dim": spec["head_dim"], "rms_norm_eps": spec["rms_norm_eps"], "rope_theta": spec["rope_theta"],
           "rope_scaling": spec.get("rope_scaling"), "vocab_size": spec["vocab_size"],
           "num_target_layers": spec["num_hidden_layers"], "block_size": BLOCK,
           "dflash_config": {"mask_token_id": spec["mask_token_id"]}}
    return DraftConfig.from_dict(raw, where="gpu_timing")


class StaticRotary:
    """RotaryTable.__call__ without its host synchronisation (int(positions.max()) grows the table), which a
    CUDA graph cannot capture: the table is grown beforehand to cover every position this script uses."""

    def __init__(self, table, max_pos: int, device):
        table(torch.tensor([max_pos], device=device), torch.float32)  # grow + move once, eagerly
        self.table = table

    def __call__(self, positions, dtype):
        return self.table.cos[positions].to(dtype), self.table.sin[positions].to(dtype)


def build_models(spec: dict, n_draft: int, device, dtype, max_pos: int, seed: int):
    tcfg, dcfg = target_config(spec), draft_config(spec, n_draft)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created on the device, in the final dtype
    try:
        with torch.device(device):
            target = TargetModel(tcfg, max_positions=max_pos)
            drafter = DFlashDrafter(dcfg, max_positions=max_pos)
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():
        for model in (target, drafter):
            for name, p in model.named_parameters():
                if p.ndim >= 2:
                    p.normal_(0.0, 0.02)
                else:  # norm weights: near one (never zeros: METHOD.md)
                    p.normal_(1.0, 0.05)
    target.capture_ids = list(dcfg.target_layer_ids)
    target.rotary = StaticRotary(target.rotary, max_pos, device)
    drafter.rotary = StaticRotary(drafter.rotary, max_pos, device)
    return target.eval(), drafter.eval(), tcfg, dcfg


def numel(mod) -> int:
    return sum(p.numel() for p in mod.parameters())


def to_fp8(target) -> int:
    """Every decoder-layer Linear as a ModelOpt FP8 export would give it: per-tensor e4m3 weight + scale and a
    static input scale; the dequantised copy freed. Returns the parameters converted."""
    from dflash_trt.models.target import Linear

    n = 0
    for m in target.model.layers.modules():
        if isinstance(m, Linear):
            w = m.weight.data
            scale = (w.abs().amax().float() / 448.0).clamp_min(1e-12)
            m.fp8 = ((w.float() / scale).to(torch.float8_e4m3fn), scale, torch.tensor(0.02, device=w.device))
            n += w.numel()
            m.weight.data = torch.empty(0, dtype=w.dtype, device=w.device)
    return n


# ------------------------------------------------------------------------------------------ one model
class Bench:
    def __init__(self, name, spec, args, device, dtype, notes):
        self.name, self.args, self.device, self.dtype, self.notes = name, args, device, dtype, notes
        self.ctx, self.page = args.context, args.page_size
        self.max_b = max(args.batches)
        self.max_q = max(max(args.verify_rows), BLOCK)
        max_pos = self.ctx + self.max_q + 8
        t0 = time.time()
        self.target, self.drafter, self.tcfg, self.dcfg = build_models(
            spec, TINY_DRAFT_LAYERS if args.tiny else DRAFT_LAYERS, device, dtype, max_pos, args.seed)
        self.build_s = time.time() - t0
        g = torch.Generator().manual_seed(args.seed + 1)
        self.gen = g
        # pages: every sequence owns ctx + max_q positions, scattered over the pool in random order
        per_seq = -(-(self.ctx + self.max_q) // self.page)
        n_blocks = self.max_b * per_seq + 1
        perm = torch.randperm(n_blocks, generator=g).tolist()
        self.tables = [perm[i * per_seq:(i + 1) * per_seq] for i in range(self.max_b)]
        t, d = self.tcfg, self.dcfg
        self.tcaches = allocate_caches(n_blocks, self.page, [(t.num_key_value_heads, t.head_dim)] * t.num_hidden_layers,
                                       dtype, device)
        self.dcaches = allocate_caches(n_blocks, self.page, [(d.num_key_value_heads, d.head_dim)] * d.num_hidden_layers,
                                       dtype, device)
        for k, v in self.tcaches + self.dcaches:  # a filled context: real K/V values, not zeros
            k.normal_()
            v.normal_()
        self.elem = torch.empty(0, dtype=dtype).element_size()
        self.head_params = t.hidden_size * t.vocab_size
        self.t_layer_params = numel(self.target.model.layers)
        self.t_layer_bytes = self.t_layer_params * self.elem
        self.t_params, self.t_bytes = numel(self.target), numel(self.target) * self.elem
        self.fp8 = bool(spec.get("fp8"))
        if self.fp8:  # 1 byte per converted weight; norms, embeddings and head stay in the model dtype
            n8 = to_fp8(self.target)
            self.t_layer_bytes -= n8 * (self.elem - 1)
            self.t_bytes -= n8 * (self.elem - 1)
        self.d_layer_params = numel(self.drafter.layers)
        self.fc_params = numel(self.drafter.fc) + numel(self.drafter.hidden_norm)
        self.kv_write_params = sum(numel(a.k_proj) + numel(a.v_proj) + numel(a.k_norm)
                                   for a in (layer.self_attn for layer in self.drafter.layers))

    def info(self) -> dict:
        t, d = self.tcfg, self.dcfg
        return {"target": {"model_type": t.model_type, "hidden_size": t.hidden_size, "layers": t.num_hidden_layers,
                           "heads": t.num_attention_heads, "kv_heads": t.num_key_value_heads, "head_dim": t.head_dim,
                           "intermediate_size": t.intermediate_size, "vocab_size": t.vocab_size,
                           "rope_type": t.rope.rope_type, "qk_norm": t.qk_norm, "params": self.t_params,
                           "weight_bytes": self.t_bytes, "fp8_linears": self.fp8},
                "drafter": {"layers": d.num_hidden_layers, "block_size": d.block_size,
                            "target_layer_ids": d.target_layer_ids, "params": numel(self.drafter),
                            "weight_bytes": numel(self.drafter) * self.elem},
                "build_s": round(self.build_s, 2)}

    # ---- work counts: (bytes that must move, FLOPs)
    def kv_token_bytes(self, cfg) -> int:
        return 2 * cfg.num_key_value_heads * cfg.head_dim * self.elem * cfg.num_hidden_layers

    def target_work(self, b: int, q: int):
        t = self.tcfg
        rows, kv_len = b * q, self.ctx + q
        nbytes = (self.t_layer_bytes + self.head_params * self.elem + rows * t.hidden_size * self.elem
                  + b * self.ctx * self.kv_token_bytes(t) + rows * self.kv_token_bytes(t))
        attn = 4 * b * q * kv_len * t.num_attention_heads * t.head_dim * t.num_hidden_layers
        return nbytes, 2 * rows * (self.t_layer_params + self.head_params) + attn

    def draft_work(self, b: int, k: int):
        d = self.dcfg
        w_rows, rows, kv_len = b * (k + 1), b * BLOCK, self.ctx + BLOCK
        weights = self.fc_params + self.d_layer_params + self.head_params
        feat_in = self.drafter.fc.weight.shape[1]  # the captured target features read by the context write
        nbytes = (weights * self.elem + rows * d.hidden_size * self.elem + w_rows * feat_in * self.elem
                  + b * self.ctx * self.kv_token_bytes(d) + w_rows * self.kv_token_bytes(d))
        attn = 4 * rows * kv_len * d.num_attention_heads * d.head_dim * d.num_hidden_layers
        flops = (2 * w_rows * (self.fc_params + self.kv_write_params) + 2 * rows * self.d_layer_params
                 + 2 * b * k * self.head_params + attn)
        return nbytes, flops

    # ---- the steps (fixed shapes; every tensor they read is made here, outside any capture)
    def _rand_ids(self, n):
        return torch.randint(0, self.tcfg.vocab_size, (n,), generator=self.gen).to(self.device)

    def target_step(self, b: int, q: int, capture: bool):
        batch = AttentionBatch.build([(q, self.ctx + q, self.tables[i]) for i in range(b)], self.page, self.device)
        ids = self._rand_ids(b * q)
        pos = torch.arange(self.ctx, self.ctx + q).repeat(b).to(self.device)
        target, caches = self.target, self.tcaches

        def step():
            hidden, feats = target(ids, pos, caches, batch, capture=capture)
            return target.logits(hidden).argmax(-1), feats

        return step

    def draft_step(self, b: int, k: int):
        d, page, ctx = self.drafter, self.page, self.ctx
        dev = self.device

        def slots(i, lo, hi):
            p = torch.arange(lo, hi)
            bt = torch.tensor(self.tables[i], dtype=torch.int64)
            return bt[p // page] * page + p % page

        n_feat = d.fc.weight.shape[1]
        feats = (torch.randn(b * (k + 1), n_feat, generator=self.gen) * 0.5).to(dev, self.dtype)
        w_pos = torch.arange(ctx - k - 1, ctx).repeat(b).to(dev)
        w_slots = torch.cat([slots(i, ctx - k - 1, ctx) for i in range(b)]).to(dev)
        ids = []
        for _ in range(b):
            ids += [int(self._rand_ids(1)[0])] + [d.mask_token_id] * (BLOCK - 1)
        ids = torch.tensor(ids, device=dev)
        pos = torch.arange(ctx, ctx + BLOCK).repeat(b).to(dev)
        dslices = [DraftSlice(i * BLOCK, BLOCK, slots(i, 0, ctx).to(dev)) for i in range(b)]
        rows = torch.tensor([i * BLOCK + 1 + j for i in range(b) for j in range(k)], device=dev)
        target, caches = self.target, self.dcaches

        def step():
            d.write_context(feats, w_pos, w_slots, caches)
            hidden = d(target.embed(ids), pos, caches, dslices)
            return d.draft_tokens(hidden.index_select(0, rows), target.logits)

        return step


# ------------------------------------------------------------------------------------------ execution
def _outputs(out):
    return [t.detach().clone() for t in (out if isinstance(out, (tuple, list)) else (out,)) if t is not None]


def prepare(fn, device, mode: str):
    """(callable to time, how it runs, note, same-as-eager or None). Order of attempts: --mode, then eager."""
    eager_out = None
    if device.type == "cuda":
        eager_out = _outputs(fn())  # also the warm-up of everything lazy (cuBLAS handles, SDPA selection)
        torch.cuda.synchronize()
    if mode == "graph" and device.type == "cuda":
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn()
            graph.replay()
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(_outputs(out), eager_out))
            return graph.replay, "cuda-graph", None, same, graph
        except Exception as e:  # noqa: BLE001  (a capture that fails: fall back, say why)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            note = f"CUDA graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:160]}); eager"
            return fn, "eager", note, None, None
    if mode == "compile":
        try:
            compiled = torch.compile(fn, dynamic=False)
            out = compiled()
            if device.type == "cuda":
                torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(_outputs(out), eager_out)) if eager_out else None
            return compiled, "torch.compile", None, same, None
        except Exception as e:  # noqa: BLE001
            return fn, "eager", f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:160]}); eager", \
                None, None
    note = None
    if mode == "graph":
        note = f"CUDA graphs need a CUDA device: eager on {device.type}"
    return fn, "eager", note, None, None


def time_ms(fn, device, reps: int) -> float:
    """Median ms per call: CUDA events (gpu_check.cuda_time: 3 warm-ups) on a GPU, the host clock elsewhere."""
    if device.type == "cuda":
        return gpu_check.cuda_time(fn, reps) / 1e3
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def floors(nbytes: int, flops: int, bw_gbs: float, tflops: float) -> dict:
    mem = nbytes / (bw_gbs * 1e9) * 1e3
    arith = flops / (tflops * 1e12) * 1e3
    return {"bytes": int(nbytes), "flops": int(flops), "mem_floor_ms": mem, "flop_floor_ms": arith,
            "floor_ms": max(mem, arith), "bound_by": "memory" if mem >= arith else "compute"}


def run_model(name, spec, args, device, dtype, bw, notes, deadline, rows_out):
    bench = Bench(name, spec, args, device, dtype, notes)
    plan = []
    for b in args.batches:
        plan.append(("ar", b, 0))
        for q in args.verify_rows:
            plan.append(("verify", b, q - 1))
        for q in args.verify_rows:
            plan.append(("draft", b, q - 1))
    with torch.inference_mode():
        for step, b, k in plan:
            row = {"model": name, "step": step, "batch": b, "k": k,
                   "rows_per_seq": 1 if step == "ar" else (k + 1 if step == "verify" else BLOCK)}
            if deadline and time.time() > deadline:
                row.update(ms=None, mode="skipped", note="time budget spent (--budget-s)")
                rows_out.append(row)
                continue
            if step == "draft":
                fn, (nbytes, flops) = bench.draft_step(b, k), bench.draft_work(b, k)
            else:
                q = 1 if step == "ar" else k + 1
                fn, (nbytes, flops) = bench.target_step(b, q, capture=step == "verify"), bench.target_work(b, q)
            try:
                call, mode, note, same, keep = prepare(fn, device, args.mode)
                ms = time_ms(call, device, args.reps)
            except Exception as e:  # noqa: BLE001  (out of memory, an op the device lacks: say so, go on)
                if device.type == "cuda":
                    with contextlib.suppress(Exception):
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
                row.update(ms=None, mode="failed", note=f"{type(e).__name__}: {str(e).strip()[:200]}")
                rows_out.append(row)
                print(f"  {name:<12} {step:<7} B={b:<3} K={k:<3} FAILED {row['note']}", flush=True)
                continue
            row.update(ms=ms, mode=mode, note=note, graph_matches_eager=same, **floors(nbytes, flops, bw, args.tflops))
            row["pct_of_floor"] = 100.0 * row["floor_ms"] / ms if ms else None
            rows_out.append(row)
            del call, keep
            print(f"  {name:<12} {step:<7} B={b:<3} K={k:<3} {ms:9.3f} ms  floor {row['floor_ms']:8.3f} ms "
                  f"({row['pct_of_floor']:5.1f}%)  {mode}{'  ' + note if note else ''}", flush=True)
    info = bench.info()
    if device.type == "cuda":
        info["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    del bench
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return info


def speedup_bounds(rows) -> list[dict]:
    by = {(r["model"], r["step"], r["batch"], r["k"]): r for r in rows}
    out = []
    for r in rows:
        if r["step"] != "verify":
            continue
        ar, dr = by.get((r["model"], "ar", r["batch"], 0)), by.get((r["model"], "draft", r["batch"], r["k"]))
        if not ar or not dr or None in (ar.get("ms"), dr.get("ms"), r.get("ms")):
            continue
        denom, fden = dr["ms"] + r["ms"], dr["floor_ms"] + r["floor_ms"]
        out.append({"model": r["model"], "batch": r["batch"], "verify_rows": r["k"] + 1, "k": r["k"],
                    "t_ar_ms": ar["ms"], "t_draft_ms": dr["ms"], "t_verify_ms": r["ms"],
                    "bound": {str(t): t * ar["ms"] / denom for t in TAUS if t <= r["k"] + 1},
                    "bound_at_floor": {str(t): t * ar["floor_ms"] / fden for t in TAUS if t <= r["k"] + 1}})
    return out


# ------------------------------------------------------------------------------------------ plugin ops
def run_plugins(args, bw) -> dict:
    """plugins/gpu_check.py: build the CUDA ops, check them against the CPU ops, time them against their floor."""
    if args.no_plugins:
        return {"status": "skipped", "note": "--no-plugins", "rows": []}
    if not torch.cuda.is_available() or args.device != "cuda":
        return {"status": "skipped", "note": "the CUDA plugin ops need a CUDA device "
                "(without one: python -m dflash_trt.plugins.gpu_check --emulate)", "rows": []}
    from dflash_trt.plugins import dflash_ops

    out = {"status": "ok", "note": None, "rows": [], "failures": None}
    try:
        t0 = time.time()
        dflash_ops.load()
        out["build_s"] = round(time.time() - t0, 1)
        if not dflash_ops.has_cuda_kernels():
            return {"status": "error", "note": "the extension has no CUDA kernels (CUDA_HOME not found?)", "rows": []}
        if args.plugin_cases > 0:
            out["failures"] = gpu_check.run_checks(args.plugin_cases, verbose=False)
            if out["failures"]:
                out["status"] = "failed"
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):  # its own table: folded into ours
            rows = gpu_check.timing_table(bw, args.plugin_reps)
        for op, cfg, nbytes, floor, us, tus in rows:
            out["rows"].append({"op": op, "config": cfg, "bytes": int(nbytes), "floor_us": floor, "us": us,
                                "pct_of_floor": 100.0 * floor / us if us else None,
                                "torch_us": tus if tus == tus else None})
    except Exception as e:  # noqa: BLE001  (a build failure must not lose the model timings)
        last = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
        out.update(status="error", note=f"{type(e).__name__}: {last}")
    return out


# ------------------------------------------------------------------------------------------ report
def print_table(rep: dict) -> None:
    print(f"\n{rep['device']} | torch {rep['torch']} | {rep['dtype']} | context {rep['context_tokens']} tokens/seq | "
          f"HBM {rep['bandwidth_gbs']:.0f} GB/s ({rep['bandwidth_source']}) | {rep['tflops']:.0f} TFLOP/s"
          + (" | TINY shapes" if rep["tiny"] else ""))
    print("floor = max(weights + KV bytes / bandwidth, FLOPs / rate); % = floor / measured")
    head = (f"{'model':<12}{'step':<12}{'B':>4}{'rows':>6}{'ms':>10}{'mem fl':>10}{'flop fl':>10}{'% floor':>9}"
            f"  {'mode':<11}")
    print(head)
    print("-" * len(head))
    notes = []  # each distinct row note once, under the table
    for r in rep["rows"]:
        label = r["step"] if r["step"] == "ar" else f"{r['step']} K={r['k']}"
        mark = ""
        if r.get("note"):
            if r["note"] not in notes:
                notes.append(r["note"])
            mark = f"[{notes.index(r['note']) + 1}]"
        if r.get("ms") is None:
            print(f"{r['model']:<12}{label:<12}{r['batch']:>4}{r['rows_per_seq']:>6}{'-':>10}{'':>29}  "
                  f"{r['mode']:<11}{mark}")
            continue
        print(f"{r['model']:<12}{label:<12}{r['batch']:>4}{r['rows_per_seq']:>6}{r['ms']:>10.3f}"
              f"{r['mem_floor_ms']:>10.3g}{r['flop_floor_ms']:>10.3g}{r['pct_of_floor']:>8.1f}%  {r['mode']:<11}{mark}")
    for i, n in enumerate(notes):
        print(f"[{i + 1}] {n}")
    if rep["speedup_bounds"]:
        taus = "".join(f"{'tau=' + str(t):>9}" for t in TAUS)
        print(f"\nDFlash speed-up bound tau * t_ar / (t_draft(K) + t_verify(K+1)); [at floor]")
        print(f"{'model':<12}{'B':>4}{'K+1':>5}{'t_ar':>9}{'t_draft':>9}{'t_verify':>10}{taus}   [at floor]")
        for s in rep["speedup_bounds"]:
            vals = "".join(f"{s['bound'].get(str(t), float('nan')):>9.2f}" for t in TAUS)
            fl = " ".join(f"{s['bound_at_floor'].get(str(t), float('nan')):.2f}" for t in TAUS)
            print(f"{s['model']:<12}{s['batch']:>4}{s['verify_rows']:>5}{s['t_ar_ms']:>9.3f}{s['t_draft_ms']:>9.3f}"
                  f"{s['t_verify_ms']:>10.3f}{vals}   [{fl}]")
    p = rep["plugins"]
    print(f"\nplugin ops (plugins/gpu_check.py): {p['status']}"
          + (f", {p['failures']} failed checks" if p.get("failures") is not None else "")
          + (f" -- {p['note']}" if p.get("note") else ""))
    if p["rows"]:
        print(f"{'op':<21}{'config':<38}{'MB':>9}{'floor us':>10}{'op us':>10}{'% floor':>9}{'torch us':>10}")
        for r in p["rows"]:
            t = f"{r['torch_us']:>10.1f}" if r["torch_us"] is not None else f"{'-':>10}"
            print(f"{r['op']:<21}{r['config']:<38}{r['bytes'] / 1e6:>9.2f}{r['floor_us']:>10.1f}{r['us']:>10.1f}"
                  f"{r['pct_of_floor']:>8.1f}%{t}")
    for n in rep["notes"]:
        print(f"note: {n}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="toy dimensions (CI: --device cpu --tiny)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--verify-rows", type=int, nargs="+", default=[8, 16], help="K+1 rows per sequence (<= 16)")
    ap.add_argument("--context", type=int, default=None,
                    help="committed tokens per sequence in the KV cache (default 1024; 32 with --tiny)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--mode", default="graph", choices=["graph", "compile", "eager"],
                    help="graph: CUDA graph per step (default); compile: torch.compile; eager")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per step (default 20; 2 with --tiny)")
    ap.add_argument("--bandwidth", type=float, default=4800.0,
                    help="HBM GB/s for the memory floor (default 4800, the H200's; 0: by device name or a "
                         "measured copy, as plugins/gpu_check.py does)")
    ap.add_argument("--tflops", type=float, default=989.0,
                    help="dense bf16 TFLOP/s for the arithmetic floor (default 989, the H200/H100 datasheet)")
    ap.add_argument("--no-plugins", action="store_true", help="skip the plugin ops check and timing")
    ap.add_argument("--plugin-cases", type=int, default=100,
                    help="random cases per op for the plugin checks (0: timing only)")
    ap.add_argument("--plugin-reps", type=int, default=50)
    ap.add_argument("--budget-s", type=float, default=0, help="skip the remaining steps after this many seconds")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.context is None:
        args.context = 32 if args.tiny else 1024
    if args.reps is None:
        args.reps = 2 if args.tiny else 20
    if max(args.verify_rows) > BLOCK or min(args.verify_rows) < 2:
        ap.error(f"--verify-rows must lie in 2..{BLOCK} (K+1 with K <= block_size - 1)")
    if args.context < max(args.verify_rows):
        ap.error("--context must be at least the largest --verify-rows (the draft step rewrites that many rows)")
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    deadline = t_start + args.budget_s if args.budget_s else 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU machine with a CUDA build of torch, or give --device cpu --tiny")
        return 2
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, args.dtype)
    notes = []
    if args.bandwidth:
        bw, bw_src = args.bandwidth, "given" if args.bandwidth != 4800.0 else "H200 datasheet (default)"
    elif device.type == "cuda":
        bw, bw_src = gpu_check.bandwidth_gbs(None)
    else:
        bw, bw_src = 4800.0, "H200 datasheet (no GPU to measure)"
    if device.type != "cuda":
        notes.append("CPU run: floors use the GPU's bandwidth and FLOP rate, so % of floor is not meaningful here")
    rep = {"schema": SCHEMA, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": args.dtype, "tiny": args.tiny,
           "mode": args.mode, "context_tokens": args.context, "page_size": args.page_size,
           "block_size": BLOCK, "batches": args.batches, "verify_rows": args.verify_rows, "taus": list(TAUS),
           "bandwidth_gbs": bw, "bandwidth_source": bw_src, "tflops": args.tflops, "reps": args.reps,
           "models": {}, "rows": [], "speedup_bounds": [], "plugins": {"status": "pending", "rows": []},
           "notes": notes, "elapsed_s": None}

    def write():
        rep["elapsed_s"] = round(time.time() - t_start, 1)
        rep["speedup_bounds"] = speedup_bounds(rep["rows"])
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(rep, f, indent=1)
            os.replace(tmp, args.json)

    for name in args.models:
        spec = dict(MODELS[name])
        if args.tiny:
            spec.update(TINY)
        print(f"{name}: building {'tiny ' if args.tiny else ''}random-weight target + drafter on {device} "
              f"({args.dtype})", flush=True)
        if deadline and time.time() > deadline:
            notes.append(f"{name}: not built, time budget spent (--budget-s)")
            for b in args.batches:
                for step, k in [("ar", 0)] + [(st, q - 1) for st in ("verify", "draft") for q in args.verify_rows]:
                    rep["rows"].append({"model": name, "step": step, "batch": b, "k": k, "ms": None,
                                        "rows_per_seq": 1 if step == "ar" else k + 1 if step == "verify" else BLOCK,
                                        "mode": "skipped", "note": "time budget spent (--budget-s)"})
            write()
            continue
        try:
            rep["models"][name] = run_model(name, spec, args, device, dtype, bw, notes, deadline, rep["rows"])
        except torch.cuda.OutOfMemoryError:
            notes.append(f"{name}: out of GPU memory while building")
            torch.cuda.empty_cache()
        write()
    print("plugin ops: build, check, time (plugins/gpu_check.py)", flush=True)
    rep["plugins"] = run_plugins(args, bw)
    write()
    print_table(rep)
    if args.json:
        print(f"\nwrote {args.json}")
    bad = [r for r in rep["rows"] if r.get("ms") is None and r.get("mode") != "skipped"]
    return 1 if bad or rep["plugins"]["status"] in ("failed", "error") else 0


if __name__ == "__main__":
    sys.exit(main())
