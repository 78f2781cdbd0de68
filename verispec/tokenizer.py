"""Tokenizer: text <-> token ids for a checkpoint, with its special tokens and chat template."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from verispec.models.weights.gguf import is_gguf
from verispec.models.weights.gguf_cache import cached_checkpoint, cached_tokenizer, gguf_tokenizer


class Tokenizer:
    """Thin wrapper over the checkpoint's Hugging Face tokenizer: tokenizer.json + config in a
    directory, or the vocabulary in a GGUF file's metadata (converted by transformers once,
    then read from the file's cache entry: see models/weights/gguf_cache.py)."""

    def __init__(self, path: Path) -> None:
        checkpoint = cached_checkpoint(path) if is_gguf(path) else path
        if checkpoint is None:  # a GGUF file the cache cannot hold: convert it here
            self.hf: PreTrainedTokenizerBase = gguf_tokenizer(path)
        elif checkpoint != path:  # the GGUF's converted copy in the cache
            self.hf = cached_tokenizer(checkpoint)
        else:
            try:
                self.hf = AutoTokenizer.from_pretrained(str(path))
            except (OSError, ValueError, KeyError) as e:
                raise ValueError(f"cannot load a tokenizer from {path}: {e}") from e
        # A GGUF's eos is tokenizer.ggml.eos_token_id, which transformers makes hf's eos token
        # (and its cache entry's generation_config.json holds).
        self.eos_token_ids = _eos_ids(checkpoint or path, self.hf.eos_token_id)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (the model's vocabulary may be padded beyond)."""
        return len(self.hf)

    @property
    def chat_template(self) -> str | None:
        """The checkpoint's Jinja chat template (tokenizer config or GGUF metadata), if any."""
        template = self.hf.chat_template
        return template if isinstance(template, str) else None

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
