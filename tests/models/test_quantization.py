"""Weight-only quantization: the rounding itself (worked examples), and that a quantized model
computes exactly the model with those rounded weights (transformers as the reference)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import make_checkpoint
from torch.testing import assert_close
from transformers import PreTrainedModel

from verispec import LLM
from verispec.models.loader import load_model
from verispec.models.quantization import (
    check_quantization,
    int8_per_channel,
    round_to_fp16,
)

from .harness import Runner, hf_logits, random_ids

CPU = torch.device("cpu")


def test_int8_worked_example() -> None:
    q, scale = int8_per_channel(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
    assert q.dtype == torch.int8
    assert q.tolist() == [[64, -127, 32], [0, 0, 0]]  # 63.5 rounds to even
    assert_close(scale, torch.tensor([1 / 127, 1.0]))


def test_int8_error_is_at_most_half_a_step() -> None:
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    q, scale = int8_per_channel(w)
    assert int(q.abs().max()) == 127
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())


def test_fp16_rounding_worked_example() -> None:
    out = round_to_fp16(torch.tensor([0.1, 0.5]))
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0999755859375, 0.5]


@pytest.mark.parametrize("name", ["int4", "FP16", "", 8])
def test_unknown_quantization_lists_the_allowed_ones(name: object) -> None:
    with pytest.raises(ValueError, match="fp16, int8 or None"):
        check_quantization(name)  # type: ignore[arg-type]


def rounded_like_verispec(model: PreTrainedModel, quantization: str) -> PreTrainedModel:
    """A copy of model whose linear layers (and LM head) hold the values verispec computes with."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in out.named_modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                if quantization == "fp16":
                    new = round_to_fp16(w)
                else:
                    q, scale = int8_per_channel(w)
                    new = q.float() * scale[:, None]
                if name == "lm_head" and out.config.tie_word_embeddings:
                    module.weight = torch.nn.Parameter(new.clone())  # the embedding stays as is
                else:
                    w.copy_(new)
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: biases stay unrounded
def fp32_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory, tokenizer
) -> tuple[Path, PreTrainedModel]:
    """Full float32 values (neither backend nor test rounds them by accident), sharp layers."""
    path = tmp_path_factory.mktemp(f"{request.param}-fp32")
    return path, make_checkpoint(path, request.param, tokenizer, layer_scale=8.0)


@pytest.mark.parametrize("quantization", ["fp16", "int8"])
def test_quantized_model_is_the_rounded_model(
    fp32_checkpoint: tuple[Path, PreTrainedModel], quantization: str
) -> None:
    path, hf_model = fp32_checkpoint
    reference = rounded_like_verispec(hf_model, quantization)
    ids = random_ids(24, hf_model.config.vocab_size, seed=3)
    runner = Runner(load_model(path, torch.float32, CPU, quantization=quantization))
    seq = runner.sequence()
    got = runner.forward([seq.chunk(ids, num_logits=len(ids))])
    assert_close(got, hf_logits(reference, ids), atol=1e-4, rtol=0)
    # and it is not the unrounded model: farther from it than twice the tolerance above
    assert (got - hf_logits(hf_model, ids)).abs().max() > 2e-4


def test_engine_options_are_checked(llama_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="quantization must be one of fp16, int8"):
        LLM(model=str(llama_checkpoint), quantization="int4")
