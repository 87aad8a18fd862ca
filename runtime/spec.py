"""Tree-free DFlash acceptance: one linear chain, the longest prefix of drafts the target agrees with.

`posterior[j]` is the target's own choice for the token after verify row j (argmax, or its seeded sample).
Accepting exactly the drafts that equal the target's choice keeps the output identical to the target's own
decoding; for T > 0 it equals speculative rejection sampling with a one-hot draft.
"""
from __future__ import annotations


def accept(drafts: list[int], posterior: list[int]) -> tuple[int, list[int]]:
    """Returns (accepted draft count a, committed tokens d_1..d_a + posterior[a])."""
    a = 0
    while a < len(drafts) and drafts[a] == posterior[a]:
        a += 1
    return a, drafts[:a] + [posterior[a]]
