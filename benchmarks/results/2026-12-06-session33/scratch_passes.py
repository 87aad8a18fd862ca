# target passes of scratch requests (48 cached positions each, as the calibration's), timed one at a time
import time
import torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.sampling import SamplingParams
from dflash_trt.scheduler import Scheduled
from dflash_trt.sequence import Sequence

CTX = 48


def timed_passes(dtype: str, requests: int, **kw):
    """run(n, drafts): seconds of one target pass of the first n scratch requests, each verifying `drafts` drafts
    (0: decoding one row)."""
    t, d = embedded_paths()
    e = LLM(target=t, draft=d, max_batch_size=32, dtype=dtype, **kw).engine
    seqs = []
    for _ in range(requests):
        s = Sequence([0] * CTX, SamplingParams(max_tokens=8, seed=0))
        s.token_ids.append(0)
        e.blocks.grow(s, CTX + 8)
        seqs.append(s)

    def run(n, drafts):
        g = seqs[:n]
        for s in g:
            s.num_computed = CTX
        t0 = time.perf_counter()
        e.runner.run([Scheduled(s, drafts + 1, drafts, False) for s in g],
                     {s.seq_id: [0] * drafts for s in g} if drafts else {})
        return time.perf_counter() - t0
    return run
