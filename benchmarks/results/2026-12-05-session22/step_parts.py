import sys, time, torch, functools
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer as L
t, d = embedded_paths()
spec = sys.argv[1] == "df"
llm = LLM(target=t, draft=d if spec else None, speculative=spec, dtype="bfloat16")
e = llm.engine
acc = {}
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t0; return r
    setattr(obj, name, g)
wrap(L, "run_stack", "stack"); wrap(e.target, "greedy_tokens", "greedy"); wrap(e.target, "finish", "finish")
gh = e.target.prepare_greedy_head()
from dflash_trt.plugins import invariant as bi
wrap(bi, "linear", "bi.linear")
wrap(e.scheduler, "schedule", "schedule"); wrap(e.scheduler, "postprocess", "postprocess"); wrap(e, "verifier", "verify")
from dflash_trt import attention as A
wrap(A.AttentionBatch, "build", "abuild")
wrap(e.target, "embed", "embed"); wrap(e.target, "_fused_stack", "fstate"); wrap(e.target, "rotary", "rotary")
wrap(e.runner, "run", "run")
wrap(e.proposer, "observe", "observe")
if spec:
    wrap(e.drafter, "write_context", "d.write_ctx"); wrap(e.drafter, "draft_tokens", "d.tokens"); wrap(e.proposer, "_blocks", "p.blocks")
    wrap(e.drafter, "project_context", "d.project"); wrap(e.proposer, "propose", "propose")
sp = SamplingParams(max_tokens=200, ignore_eos=True)
P = ["Write a Python function that returns the n-th Fibonacci number."]
llm.generate(P, sp, chat=True)
for r in range(3):
    acc.clear()
    s = llm.add_request(P[0], sp, chat=True); e.step()
    n = 0; T = 0
    acc.clear()
    while not s.is_finished:
        t0 = time.perf_counter(); e.step(); T += time.perf_counter() - t0; n += 1
    other = T - sum(v for k, v in acc.items() if k in ("run", "schedule", "postprocess", "verify", "observe", "propose"))
    print(f"steps {n} step {T/n*1e3:.3f} ms | " + " ".join(f"{k} {v/n*1e6:.0f}" for k, v in acc.items()) + f" | unaccounted {other/n*1e6:.0f} us", flush=True)
