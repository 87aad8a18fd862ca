# in-process A/B at c=1: OLD (per-layer context k/v calls, 4-op draft head) vs NEW, AR as the baseline
import sys, time, types, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt import ops
t, d = embedded_paths()
dt = sys.argv[1]; rounds = int(sys.argv[2]); ntok = int(sys.argv[3]) if len(sys.argv) > 3 else 128
kw = dict(dtype=dt, max_batch_size=1)
E = {"AR": LLM(target=t, speculative=False, **kw), "OLD": LLM(target=t, draft=d, **kw), "NEW": LLM(target=t, draft=d, **kw)}
od = E["OLD"].engine.proposer.drafter
od._context_kv = lambda c: None
def old_tokens(self, hidden, head, argmax=None, confidence=False):
    logits = ops.linear(hidden, self.vocab_head, packed=self.vocab_packed).float()
    if not confidence: return self.vocab_ids[logits.argmax(-1)]
    best, idx = logits.max(-1)
    return self.vocab_ids[idx], self._top_probability(logits, best)
od.draft_tokens = types.MethodType(old_tokens, od)
sys.path.insert(0, "/work/main/benchmarks")
from spec_limit import PROMPTS
sp = SamplingParams(max_tokens=ntok, ignore_eos=True)
for n, l in E.items(): l.generate(PROMPTS[:1], sp, chat=True)
for r in range(rounds):
    tot = {n: [0.0, 0] for n in E}
    for p in PROMPTS:
        for n, l in E.items():
            t0 = time.perf_counter(); o = l.generate([p], sp, chat=True)[0]; tot[n][0] += time.perf_counter() - t0; tot[n][1] += len(o.token_ids)
    ar = tot["AR"][1] / tot["AR"][0]
    print(" ".join(f"{n} {v[1]/v[0]:.1f} ({v[1]/v[0]/ar:.3f}x)" for n, v in tot.items()), flush=True)
# propose time per drafted step, both engines, interleaved
acc = {}
def wrap(name, obj, attr):
    f = getattr(obj, attr)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); v = acc.setdefault((name, attr), [0.0, 0]); v[0] += time.perf_counter() - t0; v[1] += 1; return r
    setattr(obj, attr, g)
for n in ("OLD", "NEW"):
    p = E[n].engine.proposer
    wrap(n, p, "propose"); wrap(n, p.drafter, "write_context"); wrap(n, p.drafter, "draft_tokens"); wrap(n, p.drafter, "forward")
for r in range(2):
    for pr in PROMPTS:
        for n in ("OLD", "NEW"): E[n].generate([pr], sp, chat=True)
print(" | ".join(f"{k[0]}.{k[1]} {v[0]/v[1]*1e6:.0f}us" for k, v in sorted(acc.items())))
