"""Tokenizer: text <-> token ids for a checkpoint, with its special tokens and chat template."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase


class Tokenizer:
    """Thin wrapper over the checkpoint's Hugging Face tokenizer (tokenizer.json + config)."""

    def __init__(self, path: Path) -> None:
        try:
            self.hf: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot load a tokenizer from {path}: {e}") from e
        self.eos_token_ids = _eos_ids(path, self.hf.eos_token_id)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (the model's vocabulary may be padded beyond)."""
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt, with BOS when the tokenizer adds one."""
        return list(self.hf.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        """Text of generated ids, without special tokens."""
        return self.hf.decode(token_ids, skip_special_tokens=True)


def _eos_ids(path: Path, tokenizer_eos: int | None) -> list[int]:
    """End-of-sequence ids: generation_config.json's (may be a list) plus the tokenizer's."""
    ids: list[int] = []
    gen = path / "generation_config.json"
    if gen.is_file():
        value = json.loads(gen.read_text()).get("eos_token_id")
        ids += value if isinstance(value, list) else [] if value is None else [value]
    if tokenizer_eos is not None and tokenizer_eos not in ids:
        ids.append(tokenizer_eos)
    return [int(i) for i in ids]
