"""The drafter trainer on a tiny target: mask, labels, weights, learning, export that both runtimes load."""
import json
import os

import torch

import tiny
from dflash_trt.builder.training.trainer import (block_attention_mask, block_labels, choose_anchors,
                                                 position_weights)


def test_block_mask_sees_strict_past_own_block_and_nothing_else():
    anchors = torch.tensor([3, 7])
    m = block_attention_mask(anchors, ctx_len=10, block_size=4)
    assert m.shape == (8, 18)
    for n, a in enumerate(anchors.tolist()):
        for r in range(4):
            row = m[n * 4 + r]
            assert row[:a].all() and not row[a:10].any(), "context strictly before the anchor"
            own = row[10 + n * 4:10 + n * 4 + 4]
            assert own.all(), "bidirectional inside the block"
            other = torch.cat([row[10:10 + n * 4], row[10 + n * 4 + 4:]])
            assert not other.any(), "no other block"


def test_same_position_labels_and_weights():
    ids = torch.arange(100, 120)
    labels = block_labels(ids, torch.tensor([5, 17]), block_size=4)
    assert labels.tolist() == [[106, 107, 108], [118, 119, -100]]  # row k -> x_{a+k}, not shifted
    w = position_weights(16)
    assert torch.allclose(w, torch.exp(-torch.arange(15) / 7.0))
    assert torch.allclose(position_weights(8), torch.exp(-torch.arange(7) / 4.0))
    a = choose_anchors(prompt_len=6, length=12, n=100, gen=None)
    assert a.tolist() == [6, 7, 8, 9, 10]  # generated tokens that have a successor


def test_training_learns_and_exports(tmp_path):
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.builder.train_cli import main

    t = tiny.make_target(str(tmp_path / "t"), layers=4, hidden=64, boost_tokens=(11,), boost=5.0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 128, (6,), generator=g).tolist() for _ in range(24)]
    outs = LLM(target=t, speculative=False).generate(prompts, SamplingParams(max_tokens=48, ignore_eos=True))
    data = tmp_path / "data.jsonl"
    with open(data, "w") as f:
        for i, (p, o) in enumerate(zip(prompts, outs)):
            f.write(json.dumps({"id": i, "prompt_ids": p, "output_ids": o.token_ids}) + "\n")
    out = tmp_path / "run"
    rc = main(["--target", t, "--output", str(out), "--data", str(data), "--block-size", "8", "--num-layers", "2",
               "--max-steps", "60", "--eval-every", "20", "--eval-records", "3", "--split", "first", "--lr", "1e-3",
               "--mask-token-id", "3", "--anchors-per-seq", "16"])
    assert rc == 0
    hist = json.load(open(out / "checkpoint" / "history.json"))
    assert hist[0]["step"] == 0 and hist[-1]["step"] == 60
    assert hist[-1]["eval_loss"] < hist[0]["eval_loss"] * 0.9, hist
    assert hist[-1]["tau"] > hist[0]["tau"], hist
    d = str(out / "drafter")
    sp = SamplingParams(max_tokens=32, ignore_eos=True)
    heldout = prompts[:3]  # eval split: the first records (--split first)
    trained = LLM(target=t, draft=d, draft_len_policy="fixed").generate(heldout, sp)
    untrained = LLM(target=t, draft=str(out / "init"), draft_len_policy="fixed").generate(heldout, sp)
    tau_t = sum(o.accepted + o.num_drafts for o in trained) / sum(o.num_drafts for o in trained)
    tau_u = sum(o.accepted + o.num_drafts for o in untrained) / sum(o.num_drafts for o in untrained)
    assert tau_t > tau_u + 0.08, (tau_t, tau_u)
    assert [o.token_ids for o in trained] == [o.token_ids[:32] for o in outs[:3]]  # still lossless
    tau_decode = check_decode_walk(t, d, heldout, tmp_path)
    assert tau_decode > 1.2, "multi-token runs, or the walk's identity with the engine means little"


def _tiny_run_inputs(tmp_path):
    """A 2-layer tiny target and two records of its own greedy text: the smallest input dflash-train takes."""
    from dflash_trt import LLM, SamplingParams
    t = tiny.make_target(str(tmp_path / "t"), layers=2, hidden=32, heads=2, kv_heads=1)
    outs = LLM(target=t, speculative=False).generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=20, ignore_eos=True))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt_ids": p, "output_ids": o.token_ids}) + "\n"
                            for i, (p, o) in enumerate(zip([[5, 6, 7], [8, 9]], outs))))
    return t, data


def test_resume_continues_from_checkpoint(tmp_path):
    from dflash_trt.builder.train_cli import main

    t, data = _tiny_run_inputs(tmp_path)
    common = ["--target", t, "--output", str(tmp_path / "r"), "--data", str(data), "--block-size", "4",
              "--num-layers", "1", "--mask-token-id", "3", "--eval-records", "1"]
    assert main(common + ["--max-steps", "10"]) == 0
    assert main(common + ["--max-steps", "10"]) == 2  # refuses to overwrite without --resume
    assert main(common + ["--max-steps", "20", "--resume"]) == 0
    st = torch.load(tmp_path / "r" / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert st["step"] == 20


def test_sigterm_saves_and_resume_continues(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    t, data = _tiny_run_inputs(tmp_path)
    run = tmp_path / "r"
    args = ["--target", t, "--output", str(run), "--data", str(data), "--block-size", "4", "--num-layers", "1",
            "--mask-token-id", "3", "--eval-records", "1", "--threads", "1"]
    cmd = [sys.executable, "-m", "dflash_trt.builder.train_cli"] + args + ["--max-steps", "1000000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # a line per 10 steps once training runs
        if " step 20 " in f" {line}":
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, rest  # 143: scripts tell a cut run from a finished one
    assert "stopped by a signal" in rest and "exit 143" in rest and "Traceback" not in rest
    st = torch.load(run / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert 20 <= st["step"] < 1000000
    assert (run / "drafter" / "model.safetensors").is_file()
    from dflash_trt.builder.train_cli import main
    assert main(args + ["--max-steps", str(st["step"] + 5), "--resume"]) == 0
    assert torch.load(run / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == st["step"] + 5


def test_feature_shards_hold_each_record_once_as_data_grows_out_of_id_order(tmp_path):
    from safetensors.torch import load_file, save_file
    from dflash_trt.builder.training.features import build_feature_shards, load_shard

    t = tiny.make_target(str(tmp_path / "t"), layers=2, hidden=32, heads=2, kv_heads=1)
    rec = lambda i: {"id": i, "prompt_ids": [5, 6 + i % 7], "output_ids": [7 + i % 5, 9, 10 + i % 50]}  # noqa: E731
    out = str(tmp_path / "f")
    quiet = lambda *_: None  # noqa: E731
    first = build_feature_shards(t, [rec(i) for i in (0, 1, 2, 3, 10, 11, 12)], [0, 1], out, seqs_per_shard=2,
                                 full_only=True, log=quiet)
    assert len(first) == 3  # ids 0-3, 10, 11; 12 waits for a full shard
    # a shard written before shards recorded their ids: recognised by its tokens
    legacy = load_file(first[0])
    del legacy["record_ids"]
    save_file(legacy, first[0], metadata={"layer_ids": "[0, 1]"})
    stamps = [os.path.getmtime(p) for p in first]
    grown = [rec(i) for i in (0, 1, 2, 3, 5, 6, 10, 11, 12, 1000)]  # ids 5, 6 sort before ones already in shards
    paths = build_feature_shards(t, grown, [0, 1], out, seqs_per_shard=2, full_only=False, log=quiet)
    assert paths[:3] == first and [os.path.getmtime(p) for p in first] == stamps  # nothing redone
    held = [tuple(s["ids"].tolist()) for p in paths for s in load_shard(p)]
    assert sorted(held) == sorted(tuple(r["prompt_ids"] + r["output_ids"]) for r in grown)  # each exactly once


def test_subset_head_loss_is_the_loss_over_those_rows():
    from dflash_trt.builder.training.trainer import block_loss, label_vocab, to_subset
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([1, 2, 3, 40, 41, 40, 77, 41, 40, 77])
    vocab, lut = label_vocab([{"ids": ids, "prompt_len": 3}], 100)
    assert vocab.tolist() == [40, 41, 77]  # response tokens only, not the prompt's
    head = torch.randn(100, 8, generator=g)
    hidden = torch.randn(2, 3, 8, generator=g)
    labels = block_labels(ids, torch.tensor([3, 6]), 4)
    sub = to_subset(labels, lut)
    assert sub.tolist() == [[1, 0, 2], [1, 0, 2]]
    loss, correct = block_loss(hidden, sub, head[vocab], position_weights(4))
    logits = hidden.reshape(-1, 8) @ head[vocab].T
    ce = torch.nn.functional.cross_entropy(logits, sub.flatten(), reduction="none").view(2, 3)
    w = position_weights(4)[None, :3]
    assert torch.allclose(loss, (ce * w).sum() / (w.sum() * 2))
    full, _ = block_loss(hidden, labels, head, position_weights(4))
    assert loss < full  # fewer competitors: an upper bound on the full loss is not what we compute


def test_block_attention_equals_the_dense_masked_form():
    import torch.nn.functional as F
    from dflash_trt.builder.training.trainer import block_attention
    g = torch.Generator().manual_seed(0)
    b, t, h, kvh, d = 4, 13, 6, 2, 8
    anchors = torch.tensor([2, 5, 9])
    nb = anchors.numel() * b
    q = torch.randn(nb, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    kc, vc = (torch.randn(t, kvh, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    kb, vb = (torch.randn(nb, kvh, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = block_attention_mask(anchors, t, b)
    dense = F.scaled_dot_product_attention(q.transpose(0, 1)[None], torch.cat([kc, kb]).transpose(0, 1)[None],
                                           torch.cat([vc, vb]).transpose(0, 1)[None], attn_mask=mask, scale=0.3,
                                           enable_gqa=True)[0].transpose(0, 1)
    fast = block_attention(q, kc, vc, kb, vb, anchors, b, 0.3)
    assert torch.allclose(fast, dense, atol=1e-12)
    w = torch.randn_like(dense)
    grads_dense = torch.autograd.grad((dense * w).sum(), (q, kc, vc, kb, vb))
    grads_fast = torch.autograd.grad((fast * w).sum(), (q, kc, vc, kb, vb))
    for a, c in zip(grads_fast, grads_dense):
        assert torch.allclose(a, c, atol=1e-12)


def test_self_distillation_data_keeps_the_batch_full_and_resumes(tmp_path):
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.builder.training.datagen import generate_data
    from dflash_trt.builder.training.prompts import make_prompts

    t = tiny.make_target(str(tmp_path / "t"))
    out = str(tmp_path / "sd.jsonl")
    generate_data(t, out, 10, seed=1, max_tokens=12, batch=4, log=lambda *_: None)
    recs = [json.loads(x) for x in open(out)]
    assert sorted(r["id"] for r in recs) == sorted(p["id"] for p in make_prompts(10, 1))
    # each record is what the target answers to that prompt alone (greedy, chat template)
    llm = LLM(target=t, speculative=False)
    for r in recs[:4]:
        alone = llm.generate([r["prompt"]], SamplingParams(max_tokens=12), chat=True)[0]
        assert r["prompt_ids"] == alone.prompt_token_ids and r["output_ids"] == alone.token_ids
        assert r["finish_reason"] in ("stop", "length")
    generate_data(t, out, 14, seed=1, max_tokens=12, batch=4, log=lambda *_: None)  # resumes: 4 more
    ids = [json.loads(x)["id"] for x in open(out)]
    assert len(ids) == len(set(ids)) == 14


def test_self_distillation_data_skips_prompts_with_no_room_for_an_answer(tmp_path, monkeypatch):
    from dflash_trt import LLM
    from dflash_trt.builder.training import datagen
    from dflash_trt.builder.training.prompts import make_prompts

    t = tiny.make_target(str(tmp_path / "t"))
    llm = LLM(target=t, speculative=False)
    lengths = {p["id"]: len(llm.encode(p["prompt"], chat=True)) for p in make_prompts(10, 1)}
    cut = sorted(lengths.values())[5]  # about half the prompts leave no room for 12 new tokens
    monkeypatch.setattr(datagen, "MAX_SEQ_LEN", cut + 12)
    out, said = str(tmp_path / "sd.jsonl"), []
    datagen.generate_data(t, out, 10, seed=1, max_tokens=12, batch=4, log=said.append)
    ids = {json.loads(x)["id"] for x in open(out)}
    assert ids == {i for i, n in lengths.items() if n <= cut}
    assert any(f"skipped {10 - len(ids)} prompts" in line for line in said)


def test_magpie_requests_are_the_targets_own_distinct_reproducible_and_resume(tmp_path):
    from dflash_trt.builder.training.datagen import generate_data
    from dflash_trt.builder.training.magpie import ID_BASE, magpie_prompts
    from dflash_trt.embedded import ensure_target

    t = ensure_target()
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    first = magpie_prompts(t, 3, a, batch=4, max_tokens=48, log=lambda *_: None)
    assert [r["id"] for r in first] == [ID_BASE + i for i in range(3)]
    assert len({r["prompt"] for r in first}) == 3
    assert all(r["prompt"] and "<|im_" not in r["prompt"] for r in first)  # the request alone, not the template
    resumed = magpie_prompts(t, 5, a, batch=4, max_tokens=48, log=lambda *_: None)
    assert resumed[:3] == first
    assert resumed == magpie_prompts(t, 5, b, batch=4, max_tokens=48, log=lambda *_: None)  # seeds, not batches
    # answered like any prompt, before the templated ones
    out = str(tmp_path / "sd.jsonl")
    generate_data(t, out, 0, max_tokens=6, batch=4, magpie=2, log=lambda *_: None)
    recs = [json.loads(x) for x in open(out)]
    assert sorted((r["id"], r["prompt"]) for r in recs) == [(r["id"], r["prompt"]) for r in first[:2]]
    assert all(0 < len(r["output_ids"]) <= 6 for r in recs)


def test_prompts_past_the_first_8000_add_code_stubs_and_open_requests_without_changing_the_first():
    from dflash_trt.builder.training.prompts import V1, make_prompts
    first, more = make_prompts(V1, 0), make_prompts(V1 + 400, 0)
    assert more[:V1] == first  # the shipped drafter's data regenerates exactly
    later = more[V1:]
    assert [p["id"] for p in later] == list(range(V1, V1 + 400))
    kinds = {p["kind"] for p in later}
    assert {"code-stub", "open"} <= kinds
    assert len({p["prompt"] for p in more}) == len(more)  # no duplicate prompt
    for p in later:
        if p["kind"] == "code-stub":  # a Python function to complete: signature and docstring, no body
            stub = p["prompt"].split("```python\n")[-1].split("```")[0]
            assert stub.startswith("def ")
            compile(stub + "    pass\n", "<stub>", "exec")


def check_decode_walk(t: str, d: str, prompts: list[list[int]], tmp_path, k: int = 5, n_out: int = 40) -> float:
    """evaluate's decode tau walks the teacher-forced blocks the way decoding does: the anchors it visits are the
    engine's, with the engine's drafts, so its tau is the engine's tau at that K (not the uniform-anchor tau).
    Returns that tau."""
    from test_batching import Probe

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.builder.training.features import build_feature_shards, load_shard
    from dflash_trt.builder.training.trainer import (accepted_lengths, block_labels, choose_anchors, decode_anchors,
                                                     draft_rows, evaluate)
    from dflash_trt.checkpoint import load_state_dict
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.draft_vocab import load_draft_vocab
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.models.draft import DFlashDrafter

    # whole drafter blocks, as training evaluates them (a trimmed batch's blocks end after the longest draft)
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", draft_len_schedule={1: k}, trim_draft_block=False)
    probe = Probe(llm.engine)
    sp = SamplingParams(max_tokens=n_out, ignore_eos=True)
    seqs = [llm.engine.add_request(p, sp) for p in prompts]
    while llm.engine.has_unfinished():
        llm.engine.step()
    recs = [{"id": i, "prompt_ids": p, "output_ids": s.token_ids[len(p):]} for i, (p, s) in enumerate(zip(prompts, seqs))]
    tcfg = TargetConfig.from_dir(t)
    dcfg = DraftConfig.from_dir(d, num_target_layers=tcfg.num_hidden_layers)
    shards = build_feature_shards(t, recs, list(dcfg.target_layer_ids), str(tmp_path / "f"), log=lambda *_: None)
    feats = [x for p in shards for x in load_shard(p)]
    tmodel, _ = load_models(ModelPaths(t, None), tcfg, None, torch.float32, "cpu")
    embed_w, head_w = tmodel.model.embed_tokens.weight.detach(), tmodel.head_weight.detach()
    drafter = DFlashDrafter(dcfg)
    drafter.load_weights(load_state_dict(d, "drafter"), torch.float32)
    vocab = load_draft_vocab(d, head_w.shape[0])  # the engine drafts from it
    steps = tokens = 0
    for s, f, p in zip(seqs, feats, prompts):
        anchors = choose_anchors(f["prompt_len"], f["ids"].numel(), 1 << 20, None)
        with torch.no_grad():
            h = draft_rows(drafter, embed_w, f["ids"], f["features"], anchors)
            labels = block_labels(f["ids"], anchors, dcfg.block_size)
            rows = vocab if vocab is not None else torch.arange(head_w.shape[0])
            drafts = rows[(h @ head_w[rows].T).argmax(-1)]
            correct = (drafts == labels) & (labels != -100)
        runs = accepted_lengths(correct, k)
        visited = [len(p) + i for i in decode_anchors(runs)]
        engine = sorted(pos for (sid, pos) in probe.drafts if sid == s.seq_id)
        # the engine caps K by the tokens left near max_tokens: compare the blocks before that
        full = [a for a in engine if a + k + 1 < len(p) + n_out]
        assert full and visited[:len(full)] == full
        for a in full:
            assert probe.drafts[(s.seq_id, a)] == drafts[a - len(p), :k].tolist()
        steps += len(visited)
        tokens += sum(int(runs[a - len(p)]) + 1 for a in visited)
    _, _, tau_decode = evaluate(drafter, embed_w, head_w, feats, k, vocab=vocab)
    assert abs(tau_decode - tokens / steps) < 1e-9
    return tau_decode


def test_chat_data_in_every_shape_is_the_targets_chat_template(tmp_path):
    from transformers import AutoTokenizer
    from dflash_trt.builder.training.data_formats import read_chat

    t = tiny.make_target(str(tmp_path / "t"), layers=1, hidden=16, heads=2, kv_heads=1)
    tok = AutoTokenizer.from_pretrained(t)
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hey"}, {"role": "user", "content": "Sum 2+2"},
            {"role": "assistant", "content": "4"}]
    lines = [{"messages": conv},
             {"messages": [dict(m, content=[{"type": "text", "text": m["content"]}]) for m in conv]},
             {"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                                 "value": m["content"]} for m in conv]},
             {"prompt": "Sum 2+2", "response": "4"}, {"id": 40, "instruction": "Sum 2+2", "output": "4"}]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = read_chat(str(data), t)
    assert [r["id"] for r in recs] == [0, 1, 2, 3, 40]
    prompt = tok.apply_chat_template(conv[:4], add_generation_prompt=True, tokenize=True, return_dict=False)
    answer = tok.encode("4", add_special_tokens=False) + [tok.eos_token_id]  # through the end of the turn
    for r in recs[:3]:  # the last assistant turn is the response, every earlier turn the prompt
        assert r["prompt_ids"] == list(prompt) and r["output_ids"] == answer and r["prompt"] == "Sum 2+2"
    single = tok.apply_chat_template([conv[3]], add_generation_prompt=True, tokenize=True, return_dict=False)
    for r in recs[3:]:
        assert r["prompt_ids"] == list(single) and r["output_ids"] == answer


def test_regenerated_responses_are_the_targets_own_and_train(tmp_path):
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.builder.train_cli import main

    t = tiny.make_target(str(tmp_path / "t"), layers=2, hidden=32, heads=2, kv_heads=1)
    data = tmp_path / "chat.jsonl"
    asks = ["Hello there", "Name a colour", "Count to three", "What is 5+5?"]
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": a}]}) + "\n" for a in asks)
                    + json.dumps({"prompt": "Say yes", "response": "no, I will not"}) + "\n")
    out = tmp_path / "run"
    common = ["--target", t, "--output", str(out), "--data", str(data), "--block-size", "4", "--num-layers", "1",
              "--mask-token-id", "3", "--split", "first", "--eval-records", "1", "--threads", "1",
              "--regenerate", "runtime", "--regenerate-max-tokens", "12"]
    assert main(common + ["--max-steps", "2"]) == 0
    recs = [json.loads(x) for x in open(out / "data.jsonl")]
    assert len(recs) == 5
    llm = LLM(target=t, speculative=False)
    for r in recs:  # the target's greedy answer to the prompt, in its chat template
        assert r["prompt_ids"] == llm.encode([{"role": "user", "content": r["prompt"]}], chat=True)
        want = llm.generate([r["prompt_ids"]], SamplingParams(max_tokens=12))[0].token_ids
        assert r["output_ids"] == want
    assert main(common + ["--max-steps", "3", "--resume"]) == 0  # nothing regenerated twice
    assert len(open(out / "data.jsonl").read().splitlines()) == 5
