"""Run under `mpirun -n N python tests/tp_worker.py SPEC.json OUT.json`: builds an LLM with tensor parallelism
over the MPI world, generates, and rank 0 writes the outputs (plus per-rank weight bytes and traffic) as JSON.

SPEC.json: {"target": dir, "draft": dir or null, "prompts": [[ids]], "sampling": {SamplingParams kwargs} or one per prompt,
            "engine": {EngineConfig kwargs}}
"""
import json
import sys
import time

import torch

torch.set_num_threads(1)


def main(spec_path: str, out_path: str) -> None:
    from dflash_trt import LLM, SamplingParams

    with open(spec_path) as f:
        spec = json.load(f)
    llm = LLM(target=spec["target"], draft=spec.get("draft"), speculative=spec.get("draft") is not None,
              trace=True, **spec.get("engine", {}))
    # only rank 0 gets here: the other ranks follow its engine inside LLM() and exit with it
    eng = llm.engine
    sampling = spec.get("sampling", {})
    sp = [SamplingParams(**k) for k in sampling] if isinstance(sampling, list) else SamplingParams(**sampling)
    dist = eng.dist
    b0 = dist.bytes_communicated if dist else 0
    it0 = len(eng.metrics.iterations)
    t0 = time.perf_counter()
    outs = llm.generate(spec["prompts"], sp)
    dt = time.perf_counter() - t0
    steps = len(eng.metrics.iterations) - it0
    res = {"tp_size": eng.tp_size, "token_ids": [o.token_ids for o in outs], "trace": [o.trace for o in outs],
           "accepted": sum(o.accepted for o in outs), "seconds": dt, "steps": steps,
           "tokens": sum(len(o.token_ids) for o in outs),
           "bytes_per_step": ((dist.bytes_communicated - b0) / max(1, steps)) if dist else 0,
           "weight_bytes_per_rank": getattr(eng, "weight_bytes_per_rank", [eng.weight_bytes])}
    with open(out_path, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
