"""Checkpoints for the model tests whose decoder layers dominate their outputs."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from tests.helpers.checkpoints import round_matrices_to_fp16
from tests.helpers.gguf_files import WriteGGUF, write_gguf_file

LAYER_WEIGHT_SCALE = 8.0


@pytest.fixture(scope="session")
def sharp_checkpoint(
    family_checkpoint: tuple[Path, PreTrainedModel], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, PreTrainedModel]:
    """family_checkpoint with its layers' matrices scaled up and rounded to float16 values
    (so every linear backend, the fp16 one included, loads it), saved beside its tokenizer.

    Why: at the default init (std 0.02) the layers barely touch the residual stream, so a
    tied-embedding model's logits mostly echo the last token and greedy decoding repeats one
    token; comparisons against such a model would miss most attention and MLP bugs.
    """
    path, hf_model = family_checkpoint
    model = copy.deepcopy(hf_model)
    with torch.no_grad():
        for weight in model.model.layers.parameters():
            if weight.dim() == 2:
                weight.mul_(LAYER_WEIGHT_SCALE)
    round_matrices_to_fp16(model)
    out = tmp_path_factory.mktemp(f"{path.name}-sharp")
    model.save_pretrained(str(out))
    for f in path.iterdir():
        if not (out / f.name).exists():
            shutil.copy(f, out)
    return out, model


@pytest.fixture(scope="session")
def write_gguf() -> WriteGGUF:
    """write_gguf(path, model, tokenizer, qtype="F16", arch=None, tokenizer_metadata=True):
    save a transformers model as llama.cpp's convert_hf_to_gguf.py would (its metadata keys,
    tensor names from gguf's own name map, q/k rows permuted for llama and mistral, a "gpt2"
    tokenizer with merges and a ChatML template), every matrix as qtype and the norms as F32.
    Returns the weights as stored, dequantized, under Hugging Face names and row order."""
    return write_gguf_file
