"""Tiny random checkpoints of each supported family, made locally, and the corpus and pairs
the tests share (the fixtures in tests/conftest.py build on them)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from verispec.engine.request import Request
from verispec.engine.scheduler import Scheduler
from verispec.train.tokenizer import save_tokenizer

FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3")


CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
]


def family_config(family: str, vocab_size: int, **overrides: Any) -> Any:
    """A tiny config of one family: 2 layers, GQA (4 heads, 2 KV heads), head_dim 16."""
    base: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    if family == "llama":
        cls = LlamaConfig
    elif family == "llama3":
        cls = LlamaConfig
        base["rope_parameters"] = {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
        }  # fmt: skip
        base["tie_word_embeddings"] = True
    elif family == "mistral":
        cls = MistralConfig
        base["sliding_window"] = 24
    elif family == "qwen2":
        cls = Qwen2Config
        base["tie_word_embeddings"] = True
    elif family == "qwen3":
        cls = Qwen3Config
        base["head_dim"] = 16
    else:
        raise ValueError(family)
    base.update(overrides)
    return cls(**base)


def make_checkpoint(
    path: Path,
    family: str,
    tokenizer: PreTrainedTokenizerFast,
    seed: int = 0,
    layer_scale: float = 1.0,
    fp16_values: bool = False,
    **overrides: Any,
) -> PreTrainedModel:
    """Save a random tiny model of `family` with `tokenizer` to path; return the HF model (eval).

    layer_scale multiplies the layers' matrices: at the default init the layers barely touch
    the residual stream and greedy decoding repeats one token; 8 gives varied text.
    fp16_values rounds every matrix to a float16-representable value (still saved as float32),
    so the fp16 linear backend, which refuses to round, can load it.
    """
    overrides.setdefault("vocab_size", len(tokenizer))
    config = family_config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for weight in model.model.layers.parameters():
            if weight.dim() == 2:
                weight.mul_(layer_scale)
    if family == "qwen2":  # random biases so the bias path is really exercised
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    if fp16_values:
        round_matrices_to_fp16(model)
    model.save_pretrained(str(path))
    GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2).save_pretrained(str(path))
    save_tokenizer(tokenizer, path)
    return model


def round_matrices_to_fp16(model: PreTrainedModel) -> None:
    """Round every matrix of model in place to the nearest float16 value (kept float32)."""
    from verispec.models.kernels.quantization import round_to_fp16

    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.copy_(round_to_fp16(weight))


def make_perturbed_copy(
    path: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    noise: float,
    seed: int = 1,
) -> PreTrainedModel:
    """Save a draft that agrees with `model` only partly: every matrix plus noise * its std."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in draft.parameters():
            if weight.dim() == 2:
                weight.add_(noise * weight.std() * torch.randn(weight.shape, generator=gen))
    draft.save_pretrained(str(path))
    GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2).save_pretrained(str(path))
    save_tokenizer(tokenizer, path)
    return draft


SPEC_PAIRS = (("llama", 0.03), ("qwen2", 0.03), ("qwen3", 0.03))


def count_preemptions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the requests the scheduler preempts from now on (a test that wants
    preemptions asserts the list is not empty)."""
    preemptions: list[str] = []
    preempt = Scheduler._preempt

    def spy(self: Scheduler, victim: Request, scheduled: list) -> None:
        preemptions.append(victim.request_id)
        preempt(self, victim, scheduled)

    monkeypatch.setattr(Scheduler, "_preempt", spy)
    return preemptions
