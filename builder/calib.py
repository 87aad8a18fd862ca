"""Calibration text: the small set shipped with the package, or a user JSONL ({"text": ..} or {"prompt": ..})."""
from __future__ import annotations

import json
import os

from .errors import BuildError

BUILTIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "calib.jsonl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")


def load_texts(path: str | None, samples: int) -> list[str]:
    """Up to `samples` non-empty texts, in file order. Raises BuildError naming the file and line."""
    src = path or BUILTIN
    flag = "--calib-data" if path else "built-in calibration set"
    if not os.path.isfile(src):
        raise BuildError(f"{flag} {src}: file not found (give a JSONL file with one {{\"text\": ...}} or "
                         "{\"prompt\": ...} object per line)")
    texts = []
    try:
        with open(src, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    raise BuildError(f"{flag} {src} line {lineno} is not JSON: each line must be an object like "
                                     "{\"text\": \"...\"}") from None
                text = row.get("text", row.get("prompt")) if isinstance(row, dict) else None
                if isinstance(text, list):  # chat turns: join them
                    text = "\n".join(str(t) for t in text)
                if not isinstance(text, str):
                    raise BuildError(f"{flag} {src} line {lineno} has no \"text\" or \"prompt\" string: each line "
                                     "must be an object like {\"text\": \"...\"}")
                if text.strip():
                    texts.append(text)
                if len(texts) >= samples:
                    break
    except (OSError, UnicodeDecodeError) as e:
        raise BuildError(f"{flag} {src} is unreadable: {e} (give a UTF-8 JSONL file)") from None
    if not texts:
        raise BuildError(f"{flag} {src} holds no text: give at least one {{\"text\": ...}} line")
    return texts


def has_tokenizer(target_dir: str) -> bool:
    return any(os.path.isfile(os.path.join(target_dir, f)) for f in ("tokenizer.json", "tokenizer.model",
                                                                      "vocab.json"))


class Tokenize:
    """The target's own tokenizer; without tokenizer files (bare test checkpoints), UTF-8 bytes mod vocab_size."""

    def __init__(self, target_dir: str, vocab_size: int, max_tokens: int):
        self.vocab_size, self.max_tokens = vocab_size, max_tokens
        self.kind = "bytes"
        self.tok = None
        if has_tokenizer(target_dir):
            from transformers import AutoTokenizer

            try:
                self.tok = AutoTokenizer.from_pretrained(target_dir)
            except Exception as e:  # tokenizer files that transformers cannot read
                raise BuildError(f"--target tokenizer in {target_dir} is unreadable: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''} (fix or remove the tokenizer files)")
            self.kind = "target"

    def __call__(self, text: str) -> list[int]:
        if self.tok is not None:
            ids = self.tok(text, add_special_tokens=True)["input_ids"]
            ids = [i for i in ids if 0 <= i < self.vocab_size]
        else:
            ids = [b % self.vocab_size for b in text.encode("utf-8")]
        return ids[: self.max_tokens]
