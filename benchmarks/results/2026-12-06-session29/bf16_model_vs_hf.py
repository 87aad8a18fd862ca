# A bf16 model (dtype="bfloat16", bf16 and W8A8 weights) against transformers in fp32, teacher-forced on the fp32
# engine's own greedy answers: max |logit - HF logit|, mean |dlogit|, top-1 agreement with HF fp32.
#   python bf16_model_vs_hf.py new          -- this tree's kernels
#   python bf16_model_vs_hf.py OLD/invariant.cpp  -- another build's (git show REV:plugins/csrc/invariant.cpp)
import sys, torch
torch.set_num_threads(2)
import dflash_trt.plugins.invariant as inv
if sys.argv[1] != "new":
    inv._SOURCE = sys.argv[1]
inv.load()
from transformers import AutoModelForCausalLM
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.teacher import teacher_forward
PROMPTS = ["Write a Python function that returns the n-th triangular number.",
           "Explain in a paragraph how rainbows form.",
           "Give three tips for writing clear documentation.",
           "What is the difference between a list and a tuple in Python?"]
t, d = embedded_paths()
outs = LLM(target=t, speculative=False).generate(PROMPTS, SamplingParams(max_tokens=96), chat=True)
seqs = [o.prompt_token_ids + o.token_ids for o in outs]
hf_model = AutoModelForCausalLM.from_pretrained(t, dtype=torch.float32).eval()
with torch.no_grad():
    hf = torch.cat([hf_model(torch.tensor([s])).logits[0].float() for s in seqs])
name = "new" if sys.argv[1] == "new" else "old"
for w in ("auto", "w8a8"):
    llm = LLM(target=t, speculative=False, dtype="bfloat16", weights=w)
    with torch.no_grad():
        lg = teacher_forward(llm.engine.target, seqs)[1].float()
    err = (lg - hf).abs()
    print(f"{name} bf16 model, weights {w:5s}: {lg.shape[0]} positions, max |dlogit| {err.max().item():.3f}, "
          f"mean {err.mean().item():.4f}, top-1 vs HF fp32 {(lg.argmax(-1) == hf.argmax(-1)).float().mean().item():.4f} "
          f"(max |logit| {hf.abs().max().item():.1f})", flush=True)
