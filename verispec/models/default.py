"""The default model used when none is named.

Until the project's trained pair is embedded (issue 4), the default is a small Llama with random
weights and a BPE tokenizer trained on verispec's own sources, created on first use in the user's
cache directory. Its text is gibberish; it exists so the first command runs with no download.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

DEMO_NAME = "verispec-demo-random-v1"


def cache_dir() -> Path:
    """$VERISPEC_CACHE, else $XDG_CACHE_HOME/verispec, else ~/.cache/verispec."""
    if os.environ.get("VERISPEC_CACHE"):
        return Path(os.environ["VERISPEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verispec"


def default_model_path(progress: bool = False) -> Path:
    """Directory of the default checkpoint, created on first use."""
    path = cache_dir() / DEMO_NAME
    if not (path / "config.json").is_file():
        if progress:
            print(f"creating the demo checkpoint (random weights) in {path} ...", file=sys.stderr)
        make_demo_checkpoint(path)
    return path


def make_demo_checkpoint(path: Path, seed: int = 0) -> None:
    """Write a ~6M-parameter random Llama with a 1024-token BPE tokenizer (atomic rename)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from verispec.train.tokenizer import save_tokenizer, train_bpe_tokenizer

    sources = sorted(Path(__file__).resolve().parents[1].rglob("*.py"))
    tokenizer = train_bpe_tokenizer((p.read_text() for p in sources), vocab_size=1024)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=704, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(str(tmp))
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(tmp))  # fmt: skip
    save_tokenizer(tokenizer, tmp)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp)  # another process finished first
        if not (path / "config.json").is_file():
            raise
