"""Incremental detokenization: each step decodes only a request's new tokens (with a few before them for
context), so text, streaming deltas and stop strings cost O(new tokens) per step, not O(output).

The offsets follow the usual scheme (vLLM, TGI): `prefix` .. `read` are tokens already turned into text, kept
as the context the next tokens are decoded against, because a token's text can depend on its neighbours
(a leading space, a multi-byte character split over tokens). Text is emitted only once it no longer ends in an
incomplete UTF-8 sequence ("\\ufffd"); `flush` emits the rest when the request ends.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetokState:
    text: str = ""
    prefix: int = 0
    read: int = 0


class Detokenizer:
    def __init__(self, tokenizer):
        self.tok = tokenizer

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def update(self, st: DetokState, ids: list[int], final: bool = False) -> str:
        """Append the text of ids[st.read:] to st.text; returns what was appended."""
        if self.tok is None or (st.read >= len(ids) and not final):
            return ""
        before = self._decode(ids[st.prefix:st.read])
        after = self._decode(ids[st.prefix:])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""  # nothing printable yet: wait for the rest of the character
        new = after[len(before):]
        st.text += new
        st.prefix, st.read = st.read, len(ids)
        return new


def find_stop(text: str, stops: list[str], start: int) -> int | None:
    """The earliest position >= start where a stop string begins (start: where new text may first match)."""
    best = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best):
            best = i
    return best
