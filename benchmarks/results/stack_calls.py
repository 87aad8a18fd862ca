"""The fused decoder stack's calls captured from real decoding, for the results scripts that replay them. A script
in a session's folder imports it with sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))."""
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer

PROMPT = "Write a Python function that returns the n-th Fibonacci number."
engines = []  # the engines whose caches and weights the captured calls read stay alive with the process


def capture(dtype: str, weights: str, ar_tokens: int = 200, layers: int = 30):
    """(the stack op, {rows: [args]} of the target's calls in a DFlash decode of 200 tokens (K = 7), the same of an
    AR engine's decode of ar_tokens tokens ({} for 0)). Calls of a stack of `layers` layers only."""
    t, d = embedded_paths()
    layer.load()
    orig = layer._state["stack"]

    def run(llm, tokens):
        engines.append(llm)
        cap = {}

        def wrap(*a):
            if len(a[4]) == layers:
                cap.setdefault(a[1].shape[0], []).append(a)
            return orig(*a)

        layer._state["stack"] = wrap
        try:
            llm.generate([PROMPT], SamplingParams(max_tokens=tokens, ignore_eos=True), chat=True)
        finally:
            layer._state["stack"] = orig
        return cap

    spec = run(LLM(target=t, dtype=dtype, weights=weights, draft=d, draft_len_policy="fixed", max_draft_len=7), 200)
    ar = run(LLM(target=t, dtype=dtype, weights=weights, speculative=False), ar_tokens) if ar_tokens else {}
    return orig, spec, ar
