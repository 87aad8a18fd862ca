"""Prompt lookup (n-gram) drafting: the tokens that followed the latest earlier occurrence of the request's
last n tokens are proposed as its next ones (TensorRT-LLM's NGram, vLLM's `ngram`, Hugging Face's prompt
lookup). No drafter: text that repeats its input (code edits, summaries, retrieval-grounded answers) gets
multi-token steps for the price of verify rows alone, and the policy's cost model, seeing no drafter pass,
drafts only while the measured acceptance pays for those rows.
"""
from __future__ import annotations

from .interface import Proposal, Proposer


def lookup(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens following the most recent earlier occurrence of the longest suffix of `tokens` of
    n_max..n_min tokens (longer matches first: they predict better); [] when none occurs."""
    n_tokens = len(tokens)
    for n in range(min(n_max, n_tokens - 1), n_min - 1, -1):
        suffix, last = tokens[n_tokens - n:], tokens[-1]
        # the latest match first: recent text is the likeliest to continue the same way
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start + n - 1] == last and tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


class NGramProposer(Proposer):
    name = "ngram"

    def __init__(self, n_max: int = 4, n_min: int = 1, default_k: int = 7):
        self.n_max, self.n_min, self.default_k = n_max, n_min, default_k

    def max_draft_len(self, requested: int | None) -> int:
        return self.default_k if requested is None else requested

    def propose(self, work, want_confidence: bool = False) -> Proposal:
        return Proposal({w.seq.seq_id: lookup(w.seq.token_ids, w.draft_len, self.n_max, self.n_min)
                         for w in work if w.draft_len > 0})
