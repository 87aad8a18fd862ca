# engines side by side in batching.py's closed loop, one iteration each in turn: the figures of one level
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from batching import ClosedLoop, PROMPTS  # noqa: E402


def run_level(engines: dict, cc: int, nreq: int = 32, max_tokens: int = 64, before_step=None) -> dict:
    """name -> (aggregate tok/s, per-user tok/s, tau) of each engine at concurrency cc; before_step(name) runs
    before each of that engine's steps."""
    ps = (PROMPTS * cc)[:max(cc, nreq)]
    loops = {n: ClosedLoop(llm, ps, cc, max_tokens) for n, llm in engines.items()}
    while any(lp.busy for lp in loops.values()):
        for n, lp in loops.items():
            if lp.busy:
                if before_step:
                    before_step(n)
                lp.step()
    return {n: lp.figures() for n, lp in loops.items()}


def line(cc: int, f: dict, base: str = "AR") -> str:
    return f"c={cc} " + " ".join(f"{n} {v[0]:.1f} ({v[0] / f[base][0]:.3f}x tau {v[2]:.2f})" for n, v in f.items())
