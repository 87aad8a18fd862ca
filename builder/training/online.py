"""Online target features: the frozen target runs inside the training loop and hands the drafter its tapped
hidden states, instead of a feature cache on disk (features.py).

A cache holds n_tapped x hidden values per token: 5 x 4096 in bf16 is 40 KB a token for an 8B target, terabytes
for a real data set, while a target forward costs about what the drafter's own step does. choose_mode picks the
cache only while it stays small.
"""
from __future__ import annotations

import torch

CACHE_LIMIT_GB = 20.0  # default --feature-cache-limit


def cache_bytes(hidden_size: int, n_tapped: int, tokens: int) -> int:
    return tokens * n_tapped * hidden_size * 2  # float16 on disk


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return ""


def choose_mode(asked: str, hidden_size: int, n_tapped: int, tokens: int,
                limit_gb: float = CACHE_LIMIT_GB) -> tuple[str, str]:
    """("cache" or "online", the reason in words) for --features auto|cache|online."""
    per_token = n_tapped * hidden_size * 2
    total = cache_bytes(hidden_size, n_tapped, tokens)
    what = f"{n_tapped} tapped layers x {hidden_size} = {_size(per_token)}/token x {tokens} tokens = {_size(total)}"
    if asked == "cache":
        return "cache", f"offline cache (--features cache): {what} on disk"
    if asked == "online":
        return "online", f"online, the target runs in the loop (--features online); a cache would hold {what}"
    if total <= limit_gb * 1e9:
        return "cache", f"offline cache: {what}, within --feature-cache-limit {limit_gb:g} GB"
    return "online", (f"online, the target runs in the loop: a cache would hold {what}, over "
                      f"--feature-cache-limit {limit_gb:g} GB")


class OnlineFeatures:
    """Callable: sequences -> their target features [T, n*H], one packed no-grad target pass per call.

    The features are the same values features.build_feature_shards caches (the same teacher_forward), in the
    target's dtype rather than rounded to float16."""

    def __init__(self, target, layer_ids: list[int], max_tokens: int = 16384):
        self.target = target
        target.capture_ids = list(layer_ids)
        self.max_tokens = max_tokens  # bounds the scratch KV cache of one pass

    def __call__(self, seqs: list[dict]) -> list[torch.Tensor]:
        from ...teacher import teacher_forward

        out, group, n = [], [], 0
        for s in seqs:
            if group and n + s["ids"].numel() > self.max_tokens:
                out += self._pass(group, teacher_forward)
                group, n = [], 0
            group.append(s)
            n += s["ids"].numel()
        if group:
            out += self._pass(group, teacher_forward)
        return out

    def _pass(self, group, teacher_forward) -> list[torch.Tensor]:
        _, _, f = teacher_forward(self.target, [s["ids"].tolist() for s in group], capture=True, logits=False)
        # teacher_forward runs in inference mode; a clone outside it is an ordinary tensor autograd may save
        f = f.clone()
        return list(f.split([s["ids"].numel() for s in group]))
