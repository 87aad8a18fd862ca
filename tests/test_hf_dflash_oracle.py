"""A second, independent DFlash oracle: transformers 5.24's native DFlash assisted generation
(`generate(..., assistant_model=..., speculation_type="dflash")`, `DFlashTokenCandidateGenerator`).

transformers cannot load a z-lab drafter as it is: its generator drives an assistant whose forward takes
(noise_embeds, context_hidden_states, position_ids, attention_mask, cache) and whose config carries
target_layer_ids / block_size / mask_token_id at top level, and the only such model it ships is
`MuseGlimmerAssistantModel` (model_type `muse_glimmer_assistant`). A z-lab `DFlashDraftModel` (model_type qwen3,
architectures DFlashDraftModel) resolves to a plain Qwen3Model there, with an embedding of its own and no context
path. MuseGlimmerAssistant is the same computation as a z-lab DFlash drafter (Qwen3-style pre-norm layers with
q/k norms, K/V over [projected context | block], bidirectional attention, fc + RMSNorm context projection), so a
drafter converts by renaming only: fc -> encoder.fc, hidden_norm -> encoder.output_norm_enc, the block fields
moved to the top level. DFlash2 drafters have no transformers counterpart (no convolution, no selector).

Here our engine and transformers run the same converted weights on the embedded pair (SmolLM2-135M-Instruct
and its shipped drafter) and on a tiny random pair, and must agree on every step's drafts and acceptance.
"""
import json
import os

import torch
from safetensors.torch import load_file

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.config import DraftConfig


def to_transformers_assistant(draft_dir: str, target_dir: str):
    """Our z-lab drafter as transformers' MuseGlimmerAssistantModel (weights renamed, nothing recomputed)."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    d = DraftConfig.from_dir(draft_dir)
    with open(os.path.join(target_dir, "config.json")) as f:
        t = json.load(f)
    cfg = MuseGlimmerAssistantConfig(
        hidden_size=d.hidden_size, intermediate_size=d.intermediate_size, num_hidden_layers=d.num_hidden_layers,
        num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads, head_dim=d.head_dim,
        rms_norm_eps=d.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": d.rope.theta},
        max_position_embeddings=d.raw.get("max_position_embeddings", 8192),
        layer_types=d.layer_types or ["full_attention"] * d.num_hidden_layers,
        sliding_window=d.sliding_window or 2048, block_size=d.block_size, mask_token_id=d.mask_token_id,
        target_layer_ids=d.target_layer_ids, bos_token_id=t.get("bos_token_id"), eos_token_id=t.get("eos_token_id"),
        pad_token_id=t.get("pad_token_id"))
    rename = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
    state = {rename.get(k, k): v.float() for k, v in load_file(os.path.join(draft_dir, "model.safetensors")).items()}
    model = MuseGlimmerAssistantModel(cfg).float().eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def run_transformers(target_dir, draft_dir, prompt, max_new):
    """transformers' own DFlash loop, greedy: (output tokens, per-step drafts, per-step accepted counts)."""
    from transformers import AutoModelForCausalLM
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assistant = to_transformers_assistant(draft_dir, target_dir)
    drafts, accepted = [], []
    get, update = DFlashTokenCandidateGenerator.get_candidates, DFlashTokenCandidateGenerator.update_candidate_strategy

    def spy_get(self, input_ids, *a, **kw):
        ids, logits = get(self, input_ids, *a, **kw)
        if ids.shape[1] > input_ids.shape[1]:
            drafts.append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    def spy_update(self, input_ids, scores, num_matches):
        if drafts and len(accepted) < len(drafts):
            accepted.append(int(num_matches))
        return update(self, input_ids, scores, num_matches)

    DFlashTokenCandidateGenerator.get_candidates = spy_get
    DFlashTokenCandidateGenerator.update_candidate_strategy = spy_update
    try:
        with torch.no_grad():
            out = target.generate(torch.tensor([prompt]), assistant_model=assistant, speculation_type="dflash",
                                  max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0)
    finally:
        DFlashTokenCandidateGenerator.get_candidates = get
        DFlashTokenCandidateGenerator.update_candidate_strategy = update
    return out[0, len(prompt):].tolist(), drafts, accepted


def compare(target_dir, draft_dir, prompt, max_new):
    hf_tokens, hf_drafts, hf_accepted = run_transformers(target_dir, draft_dir, prompt, max_new)
    llm = LLM(target=target_dir, draft=draft_dir, draft_len_policy="fixed", draft_vocab=False, trace=True,
              draft_weights="auto")
    out = llm.generate([prompt], SamplingParams(max_tokens=max_new, ignore_eos=True))[0]
    assert out.token_ids == hf_tokens[:max_new]
    block = llm.engine.drafter.block_size
    # near max_tokens transformers still drafts a whole block and crops it; compare whole-block steps only
    steps = [i for i in range(min(len(hf_drafts), len(out.trace)))
             if len(out.trace[i][0]) == block - 1 and len(hf_drafts[i]) == block - 1]
    assert len(steps) >= 3
    for i in steps:
        drafts, acc = out.trace[i]
        assert drafts == hf_drafts[i], f"step {i}"
        assert acc == hf_accepted[i], f"step {i}"
    return [out.trace[i][1] for i in steps]


def test_tiny_pair_matches_transformers_dflash(tmp_path):
    # the pair of test_zlab_parity's (block 8, 5-token prompt) case: a Qwen3 target whose head favours token 11
    # and a drafter whose mask embedding proposes it, so drafts get accepted
    t = tiny.make_target(str(tmp_path / "t"), kind="qwen3", head_dim=32, seed=8, boost_tokens=(11,), boost=5.0)
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8, seed=5, std=0.15,
                          mask_token_id=tiny.mask_proposing(t, 11), residual_scale=0.3)
    prompt = torch.randint(4, 128, (5,), generator=torch.Generator().manual_seed(5)).tolist()
    accepted = compare(t, d, prompt, max_new=40)
    assert max(accepted) >= 1  # acceptance happened: the context appends of accepted rows were compared too


def test_embedded_pair_matches_transformers_dflash():
    from dflash_trt import embedded

    target = embedded.ensure_target()  # converted once per machine (cached), as dflash-demo does
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "List three prime numbers and explain why."}],
                                          add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    accepted = compare(target, embedded.DRAFT_DIR, prompt, max_new=32)
    assert max(accepted) >= 2  # the trained drafter gets multi-token steps: real acceptance lengths compared
