"""dflash-train's held-out set (builder/training/split.py): whole tasks, every kind, fixed as the data grows."""
import collections
import json
import random
import re
import subprocess
import sys

import pytest

from dflash_trt.builder.training import prompts as P
from dflash_trt.builder.training.split import eval_sample, family, held_out_keys, split_records, task_key

N = 14000  # past V1: code stubs and open requests too


@pytest.fixture(scope="module")
def prompts():
    return P.make_prompts(N, 0)


def magpie(n: int, seed: int = 0) -> list[dict]:
    """Stand-ins for Magpie requests: free text, plain and domain-steered kinds, ids as magpie.py gives them."""
    rng = random.Random(seed)
    words = "tree river code proof essay star sum poem grid cell law myth tax fox lamp".split()
    out = []
    for i in range(n):
        kind = "magpie" if i % 3 == 0 else f"magpie-{i % 8}"
        text = " ".join(rng.choice(words) for _ in range(12)) + f" number {i}?"
        out.append({"id": (1_000_000 if kind == "magpie" else 2_000_000) + i, "kind": kind, "prompt": text})
    return out


def ids(recs):
    return {r["id"] for r in recs}


def test_appending_data_in_any_order_moves_no_record(prompts):
    data = prompts + magpie(900)
    rng = random.Random(1)
    early = rng.sample(data, 2500)  # a file that grew out of id order (newest-first prompts, Magpie first)
    held1, train1 = split_records(early)
    grown = early + [r for r in data if r["id"] not in ids(early)]
    rng.shuffle(grown)
    held2, train2 = split_records(grown)
    assert ids(train1) <= ids(train2)  # never: a record trained on, then held out
    # held-out records stay held out, but for a namespace small enough to have no group under its fraction: its
    # lowest-hash group is held out (each kind is measured) until one under the fraction arrives
    under = held_out_keys({task_key(r) for r in early}, fallback=False)
    assert under and {r["id"] for r in held1 if task_key(r) in under} <= ids(held2)
    moved = [r["kind"] for r in held1 if r["id"] not in ids(held2)]
    assert len(moved) < 20, moved
    # nor does appending depend on positions: the same records in another order split the same way
    assert ids(split_records(list(reversed(grown)))[0]) == ids(held2)


def test_no_task_is_both_held_out_and_trained_on(prompts):
    held, train = split_records(prompts + magpie(600))
    # twins found without task_key: the stdlib docstring a coding prompt or a stub quotes, the topic an
    # explanation is about, the arithmetic form with its numbers removed, the coding task
    summaries = sorted({s for *_, s in P._stdlib_items()}, key=len, reverse=True)

    def about(r):
        text, kind = r["prompt"], r["kind"]
        if kind in ("code-stdlib", "code-stub"):
            return "doc:" + next((s for s in summaries if s in text), text)
        if kind == "explain":
            return "topic:" + next(t for t in P.TOPICS if t in text)
        if kind == "code-task":
            return "task:" + next(t for t in P.TASKS if t in text)
        if kind == "maths":
            return "form:" + re.sub(r"\d+", "#", text)
        return None

    held_about = {about(r) for r in held} - {None}
    shared = [r["prompt"] for r in train if about(r) in held_about]
    assert not shared, shared[:3]
    assert not {task_key(r) for r in held} & {task_key(r) for r in train}


def test_twins_share_a_task_and_other_tasks_do_not():
    doc = "Return the number of items in a container."
    stub = f'def count(x):\n    """{doc}\n    """\n'
    twins = [[P.CODE_TEMPLATES[0].format(name="count", sig="(x)", summary=doc, module="m"),
              P.CODE_TEMPLATES[5].format(name="count", sig="(x)", summary=doc, module="m")],
             [P.EVERYDAY[0].format(topic="gravity"), P.EVERYDAY[7].format(topic="gravity")],
             [P.TASK_TEMPLATES[0].format(t="implement binary search"), P.TASK_TEMPLATES[3].format(t="implement "
                                                                                                   "binary search")],
             ["Solve for x: 3x + 4 = 19. Show each step.", "Solve for x: 12x + 50 = 86. Show each step."]]
    kinds = ["code-stdlib", "explain", "code-task", "maths"]
    for (a, b), kind in zip(twins, kinds):
        assert task_key({"kind": kind, "prompt": a}) == task_key({"kind": kind, "prompt": b}), (a, b)
    stub_key = task_key({"kind": "code-stub", "prompt": P.STUB_TEMPLATES[1].format(stub=stub)})
    assert stub_key == task_key({"kind": "code-stdlib", "prompt": twins[0][0]})  # a docstring, asked two ways
    others = [P.EVERYDAY[0].format(topic="volcanoes"), P.TASK_TEMPLATES[0].format(t="implement bubble sort"),
              "What is 5 percent of 70? Explain how to compute it."]
    for o, (a, _), kind in zip(others, twins[1:], kinds[1:]):
        assert task_key({"kind": kind, "prompt": o}) != task_key({"kind": kind, "prompt": a})


def test_every_kind_is_held_out_when_the_data_has_it(prompts):
    for data in (prompts + magpie(900), P.make_prompts(300, 0) + magpie(40)):
        held, train = split_records(data)
        have = collections.Counter(r["kind"] for r in data)
        got = collections.Counter(r["kind"] for r in held)
        assert set(got) == set(have), set(have) - set(got)
        for kind, n in got.items():  # a sample of the kind, not all of it
            assert n <= max(1, have[kind] * 0.3), (kind, n, have[kind])
    # the training-time sample takes every family (code, chat, maths, magpie) in turn
    sample = eval_sample(split_records(prompts + magpie(900))[0], 64)
    fams = collections.Counter(family(r["kind"]) for r in sample)
    assert len(sample) == 64 and set(fams) == {"code", "chat", "maths", "magpie"} and min(fams.values()) == 16


def test_dflash_train_holds_out_the_split_and_records_it(tmp_path):
    """The CLI trains on exactly split_records' training set (kinds from prompts.py, tokens from a tiny vocab)."""
    import tiny

    t = tiny.make_target(str(tmp_path / "t"), layers=2, hidden=32, heads=2, kv_heads=1)
    rng = random.Random(0)
    recs = [dict(p, prompt_ids=[rng.randrange(4, 128) for _ in range(4)],
                 output_ids=[rng.randrange(4, 128) for _ in range(6)]) for p in P.make_prompts(120, 0)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    held, train = split_records(recs)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "dflash_trt.builder.train_cli", "--target", t, "--output", str(out),
                        "--data", str(data), "--block-size", "4", "--num-layers", "1", "--mask-token-id", "3",
                        "--max-steps", "1", "--eval-records", "5", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"{len(train)} training sequences, {len(held)} held out by task" in r.stderr, r.stderr
    assert "5 of them scored during training" in r.stderr
    assert json.loads((out / "split.json").read_text())["rule"] == "tasks"
