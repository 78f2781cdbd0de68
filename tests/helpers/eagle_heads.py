"""Shared by the EAGLE head tests: a random head whose layer really changes its output, and
copies of a head directory with config.json or the tensors edited."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.checkpoints import make_checkpoint
from verispec.models.eagle import EagleConfig
from verispec.models.llama import LlamaModel
from verispec.models.weights.loader import load_model
from verispec.train.eagle import TrainableEagle


def tiny_target(path: Path, tokenizer: object) -> tuple[Path, LlamaModel]:
    """(checkpoint dir, the loaded model): a tiny 2-layer Llama, hidden 64, vocab 320, whose
    layers are scaled up so its features differ enough for heads to tell positions apart."""
    make_checkpoint(path, "llama", tokenizer, layer_scale=8.0)
    return path, load_model(path, torch.float32, torch.device("cpu"), "torch")


def random_head(
    config: EagleConfig, embed: torch.Tensor, draft_ids: torch.Tensor
) -> TrainableEagle:
    """A random head (seed 1) whose attention and MLP really change its output (weights scaled
    up)."""
    torch.manual_seed(1)
    head = TrainableEagle(config, embed, draft_ids)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.mul_(25.0)
    return head


def copy_head(
    src: Path,
    dst: Path,
    config: Callable[[dict], None] | None = None,
    tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> Path:
    """A copy of head dir src in dst, with config.json and the tensors edited in place."""
    cfg = json.loads((src / "config.json").read_text())
    weights = load_file(str(src / "model.safetensors"))
    if config is not None:
        config(cfg)
    if tensors is not None:
        tensors(weights)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(dst / "model.safetensors"))
    return dst
