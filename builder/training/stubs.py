"""HumanEval-shaped code-stub prompts: a real function's signature and docstring (its examples kept) as a Python
function to complete, in the instructions benchmarks and users hand one over with.

The functions come from the Python standard library and from sympy and networkx (torch installs both), so the
prompts are derived from code, not from any evaluation set. Deterministic for a seed and a set of installed
versions; the records trained on are committed, so a machine with other versions continues from those.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import pkgutil
import random
import sys
import warnings

from .prompts import STUB_TEMPLATES

CODE_STUB_ID_BASE = 3_000_000  # record ids of these prompts
SKIP = ("test", "idlelib", "tkinter", "turtle", "turtledemo", "antigravity", "this", "lib2to3", "ensurepip",
        "pydoc_data", "xxsubtype", "msvcrt", "winreg", "winsound", "_")
PACKAGES = ("sympy", "networkx")  # pure Python, doctest examples in most docstrings
MAX_DOC = 700  # characters of docstring: HumanEval's are a description and a few examples


def _modules():
    names = [m for m in sorted(sys.stdlib_module_names) if not m.startswith(SKIP)]
    for pkg in PACKAGES:
        try:
            root = importlib.import_module(pkg)
        except Exception:
            continue
        names.append(pkg)
        names += sorted(i.name for i in pkgutil.walk_packages(root.__path__, pkg + ".")
                        if not any(p.startswith(("test", "_")) for p in i.name.split(".")[1:]))
    for name in names:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                yield name, importlib.import_module(name)
        except BaseException:  # a module that needs what this machine lacks (or exits on import)
            continue


def _docstring(doc: str) -> str | None:
    """The docstring to show, indented as a function body: whole paragraphs up to MAX_DOC characters."""
    out = ""
    for para in doc.strip().split("\n\n"):
        if out and len(out) + len(para) > MAX_DOC:
            break
        out += ("\n\n" if out else "") + para
    if len(out) < 30 or len(out) > MAX_DOC or '"""' in out or "\\" in out:
        return None
    return "\n".join(("    " + line) if line else "" for line in out.split("\n"))


@functools.lru_cache(maxsize=1)
def stub_items() -> tuple[tuple[str, str], ...]:
    """(qualified name, stub text) of every function defined in those modules with a usable signature and
    docstring; a class's methods appear as functions without their `self`."""
    items, seen = [], set()
    for modname, mod in _modules():
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            funcs = [(name, obj, False)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                funcs += [(m, f, True) for m, f in sorted(vars(obj).items())
                          if not m.startswith("_") and inspect.isfunction(f)]
            for fname, f, method in funcs:
                key = f"{modname}.{name}" + (f".{fname}" if method else "")
                if key in seen:
                    continue
                seen.add(key)
                doc = _docstring(inspect.getdoc(f) or "")
                if doc is None:
                    continue
                try:
                    sig = inspect.signature(f)
                except (TypeError, ValueError):
                    continue
                params = list(sig.parameters.values())
                if method:
                    if not params or params[0].name not in ("self", "cls"):
                        continue
                    params = params[1:]
                text = f'def {fname}{sig.replace(parameters=params)}:\n    """\n{doc}\n    """\n'
                if len(text) > 1200:
                    continue
                try:
                    compile(text + "    pass\n", "<stub>", "exec")
                except (SyntaxError, ValueError):
                    continue
                items.append((key, text))
    return tuple(items)


def code_stub_prompts(n: int, seed: int = 0) -> list[dict]:
    """n prompts (fewer when there are fewer functions), one per function, in a seeded order, each in one of the
    stub instructions; ids from CODE_STUB_ID_BASE. Two of every three have doctest examples, as HumanEval's do,
    and no package gives more than half."""
    rng = random.Random(seed)
    items = list(stub_items())
    rng.shuffle(items)
    pools = [[it for it in items if ">>>" in it[1]], [it for it in items if ">>>" not in it[1]]]
    picked, per_pkg = [], {}
    while len(picked) < n and any(pools):
        for pool in (pools[0], pools[0], pools[1]):
            while pool:
                key, text = pool.pop(0)
                pkg = key.split(".")[0]
                if per_pkg.get(pkg, 0) < max(1, n // 2):
                    per_pkg[pkg] = per_pkg.get(pkg, 0) + 1
                    picked.append((key, text))
                    break
    return [{"id": CODE_STUB_ID_BASE + i, "kind": "code-stub", "function": key,
             "prompt": rng.choice(STUB_TEMPLATES).format(stub=text)}
            for i, (key, text) in enumerate(picked[:n])]
