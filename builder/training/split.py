"""The held-out set of dflash-train: whole tasks, every record kind, fixed as the data grows.

Templated prompts come in near-twins: "Write a Python function `f(x)` that <docstring>" and the same docstring as a
stub to complete, "Explain photosynthesis to a ten-year-old" and "Give me five facts about photosynthesis", the same
arithmetic form with other numbers. Holding out single records leaves their twins in training and overstates
acceptance, so records are grouped by task (task_key) and whole groups are held out. A group is held out when the
hash of its key falls below its namespace's fraction: a pure function of the key, so appending records (in any
order, any kind) never moves a record between the sets, and nothing depends on positions in the file.

Small data: a namespace present in the data with no group under its fraction holds out its lowest-hash group (a
fallback that can move to a newer, lower-hash group as data grows; it never moves a training record into the
held-out set, because the candidate groups only gain members). With the data dflash-train makes (hundreds of
records or more) every kind has groups under its fraction and the fallback never applies.
"""
from __future__ import annotations

import hashlib
import re
import string

from . import prompts as P

SALT = "dflash-heldout-v1"

# Fraction of each namespace's groups held out. Large namespaces (hundreds of docstrings, thousands of Magpie
# requests) give a few percent; the small templated ones (8 arithmetic forms, 30 tasks or topics, 10-12
# templates) a larger share so that at least one group of each is held out (tests/test_train_split.py checks it
# over prompts.py's whole universe).
FRACTIONS = {"stdlib": 0.04, "task": 0.12, "topic": 0.12, "maths": 0.2, "errand": 0.05, "open": 0.1,
             "magpie": 0.04, "other": 0.05}

# Families of kinds, the rows of reports: code, chat, maths, Magpie (the target's own requests).
FAMILY = {"code-stdlib": "code", "code-stub": "code", "code-task": "code", "maths": "maths", "explain": "chat",
          "everyday": "chat", "open": "chat", "magpie": "magpie"}


def family(kind: str | None) -> str:
    if kind and kind.startswith("magpie"):
        return "magpie"
    return FAMILY.get(kind or "", "other")


def _pattern(template: str) -> re.Pattern:
    """A prompts.py template as a regex with one named group per field ({t}, {topic}, ...)."""
    parts, seen = [], set()
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            # a field used twice must match the same text, and only the first occurrence can name a group
            parts.append(f"(?P={field})" if field in seen else f"(?P<{field}>.+?)")
            seen.add(field)
    return re.compile("".join(parts) + r"\Z", re.S)


# kind -> [(compiled template, the fields that make the task, namespace)]
_TEMPLATES = {
    "code-stdlib": [(_pattern(t), ("summary",), "stdlib") for t in P.CODE_TEMPLATES],
    "code-task": [(_pattern(t), ("t",), "task") for t in P.TASK_TEMPLATES],
    "explain": [(_pattern(t), ("topic",), "topic") for t in P.EVERYDAY],
}
_STUB_DOC = re.compile(r'def \w+.*?:\n    """(?P<summary>.*?)\n    """', re.S)
_NUMBER = re.compile(r"\d+(\.\d+)?")


def _norm(text: str) -> str:
    """Case, spacing, punctuation and numbers do not make a different task."""
    return " ".join(re.sub(r"[^a-z#]+", " ", _NUMBER.sub("#", text.lower())).split())


def task_key(rec: dict) -> str:
    """The group a record belongs to, as "namespace:text". Records of one task share a key whatever template or
    kind asked for it (a docstring as a coding task or as a stub); prompts no template explains (user data, other
    versions of prompts.py) fall back to their normalised text, or their token ids when they carry no text."""
    kind, text = rec.get("kind") or "", rec.get("prompt")
    if not isinstance(text, str):
        ids = rec.get("prompt_ids") or []
        return "other:" + hashlib.sha256(repr(list(ids)).encode()).hexdigest()
    if kind.startswith("magpie"):  # one namespace per domain: each is held out even in small data
        return f"{kind}:" + _norm(text)
    for pat, fields, ns in _TEMPLATES.get(kind, ()):
        m = pat.match(text)
        if m:
            return f"{ns}:" + " | ".join(_norm(m.group(f)) for f in fields)
    if kind == "code-stub":
        m = _STUB_DOC.search(text)
        if m:
            return "stdlib:" + _norm(m.group("summary"))
    if kind == "maths":  # eight forms whose numbers change: the form is the task
        return "maths:" + _norm(text)
    if kind == "everyday":  # ERRANDS: a template filled with a city or a job
        for i, t in enumerate(P.ERRANDS):
            if _pattern(t).match(text):
                return f"errand:{i}"
    if kind == "open":  # a template and what it is about (its role, text, topics; numbers do not count)
        for i, t in enumerate(P.OPEN):
            m = _pattern(t).match(text)
            if m:
                about = sorted(_norm(v) for f, v in m.groupdict().items() if f != "a")
                return f"open:{i}|" + " | ".join(about)
    return "other:" + kind + "|" + _norm(text)


def key_hash(key: str) -> float:
    """A key's place in [0, 1): its group is held out when this is below its namespace's fraction."""
    return int.from_bytes(hashlib.sha256(f"{SALT}|{key}".encode()).digest()[:8], "big") / 2.0 ** 64


def namespace(key: str) -> str:
    """The key's namespace: its fraction, and the groups among which a fallback is chosen."""
    ns = key.split(":", 1)[0]
    return ns if ns in FRACTIONS or ns.startswith("magpie") else "other"


def fraction(ns: str, fractions: dict) -> float:
    return fractions["magpie" if ns.startswith("magpie") else ns]


def held_out_keys(keys, fractions: dict | None = None, fallback: bool = True) -> set[str]:
    """The held-out groups among `keys` (those of a data set): below the fraction, plus each namespace's fallback.
    fractions: a run's recorded FRACTIONS (OUTPUT/split.json), so that a later change here cannot move its
    training records into its held-out set."""
    fr = {**FRACTIONS, **(fractions or {})}
    keys = set(keys)
    out = {k for k in keys if key_hash(k) < fraction(namespace(k), fr)}
    by_ns: dict[str, list[str]] = {}
    for k in keys:
        by_ns.setdefault(namespace(k), []).append(k)
    for ns, ks in by_ns.items():
        if fallback and len(ks) > 1 and not any(k in out for k in ks):
            out.add(min(ks, key=key_hash))
    return out


def split_records(records: list[dict], fractions: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(held out, training), each in the input's order. Whole groups only: no task_key is in both."""
    keys = [task_key(r) for r in records]
    held = held_out_keys(keys, fractions)
    return ([r for r, k in zip(records, keys) if k in held], [r for r, k in zip(records, keys) if k not in held])


def record_hash(rec: dict) -> float:
    return key_hash(f"record|{rec.get('id')}|{rec.get('prompt') or rec.get('prompt_ids')}")


def _interleave(queues: list[list]) -> list:
    out, queues = [], [list(q) for q in queues]
    while any(queues):
        out.extend(q.pop(0) for q in queues if q)
    return out


def eval_sample(held: list[dict], n: int) -> list[dict]:
    """At most n held-out records for the acceptance logged during training: families (code, chat, maths, Magpie)
    in turn, the kinds of a family in turn within it, each kind's records in record-hash order, so a kind with
    few records gives its share to the others. Scoring the whole held-out set at every evaluation would cost more
    than the training between evaluations; benchmarks/drafter_report.py scores all of it."""
    by_kind: dict[str, list[dict]] = {}
    for r in sorted(held, key=record_hash):
        by_kind.setdefault(r.get("kind") or "", []).append(r)
    fams: dict[str, list[list[dict]]] = {}
    for k in sorted(by_kind):
        fams.setdefault(family(k), []).append(by_kind[k])
    return _interleave([_interleave(qs) for _, qs in sorted(fams.items())])[:n]
