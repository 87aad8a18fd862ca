"""HumanEval-shaped stub prompts for drafter data: real signatures and docstrings, valid Python, deterministic."""
import re

from dflash_trt.builder.training import split
from dflash_trt.builder.training.stubs import CODE_STUB_ID_BASE, code_stub_prompts

STUB = re.compile(r"(def \w+\(.*?:\n    \"\"\"\n.*?\n    \"\"\"\n)", re.S)


def test_code_stubs_are_python_functions_in_a_seeded_order():
    a, b, c = code_stub_prompts(60, seed=1), code_stub_prompts(60, seed=1), code_stub_prompts(60, seed=2)
    assert a == b and a != c
    assert [p["id"] for p in a] == list(range(CODE_STUB_ID_BASE, CODE_STUB_ID_BASE + 60))
    assert len({p["function"] for p in a}) == 60  # one prompt per function
    for p in a:
        m = STUB.search(p["prompt"])
        assert m, p["prompt"]
        compile(m.group(1) + "    pass\n", "<stub>", "exec")
        assert not re.match(r"def \w+\(self\b", m.group(1))  # methods are handed over as functions
    with_examples = sum(">>>" in p["prompt"] for p in a)
    assert 30 <= with_examples <= 50  # two of three, as HumanEval's docstrings carry examples
    assert max(sum(p["function"].startswith(pkg + ".") for p in a) for pkg in ("sympy", "networkx")) <= 30


def test_code_stubs_are_grouped_by_docstring_for_the_held_out_split():
    p = code_stub_prompts(5, seed=1)[0]
    key = split.task_key(p)
    assert key.startswith("stdlib:") and len(key) > 20
    twin = dict(p, prompt="Complete the following Python function:\n```python\n" + STUB.search(p["prompt"]).group(1)
                + "```")
    assert split.task_key(twin) == key  # the same function in another instruction is the same task
