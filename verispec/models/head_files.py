"""Drafter head directories (EAGLE, Medusa): config.json plus safetensors, read and written
with every tensor's shape checked against the config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def read_head_dir(
    path: Path,
    what: str,
    shapes_of: Callable[[dict[str, Any]], tuple[Any, dict[str, tuple[int, ...]]]],
    defaults: Callable[[Any], dict[str, torch.Tensor]] | None = None,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """(config, weights) of a head directory. shapes_of(config dict) -> (parsed config,
    {tensor name: shape}); defaults(parsed config) fills optional tensors; ValueError naming
    `what` for a missing config.json, a missing tensor or a shape the config does not imply."""
    config, shapes = shapes_of(read_head_config(path, what))
    return config, read_head_tensors(path, what, shapes, defaults(config) if defaults else None)


def read_head_config(path: Path, what: str) -> dict[str, Any]:
    """The config.json of a head directory; ValueError naming `what` when it is missing or
    not JSON."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{what} directory {path} has no config.json")
    try:
        return json.loads(config_file.read_text())
    except ValueError as e:
        raise ValueError(f"{what} config {config_file} is not valid JSON ({e})") from e


def read_head_tensors(
    path: Path,
    what: str,
    shapes: dict[str, tuple[int, ...]],
    defaults: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's *.safetensors over `defaults` (tensors a checkpoint may
    leave out); ValueError naming `what` when one of `shapes` is missing or shaped otherwise."""
    weights: dict[str, torch.Tensor] = dict(defaults or {})
    for file in sorted(path.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    for name, shape in shapes.items():
        if name not in weights:
            raise ValueError(f"{what} {path} lacks tensor {name!r}")
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"{what} {path}: tensor {name!r} has shape {list(weights[name].shape)}, the "
                f"config implies {list(shape)}"
            )
    return weights


def check_tensor_names(tensors: dict[str, torch.Tensor], shapes: dict[str, Any]) -> None:
    """A head to be written must hold exactly the tensors its config implies."""
    if set(tensors) != set(shapes):
        raise ValueError(f"head tensors must be exactly {sorted(shapes)}, got {sorted(tensors)}")


def write_head_dir(
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    shapes: dict[str, tuple[int, ...]],
    path: Path,
    dtype: torch.dtype = torch.float16,
) -> None:
    """Write config.json and model.safetensors (floating tensors in dtype, boolean masks as
    bool, other integers as int64)."""
    check_tensor_names(tensors, shapes)
    path.mkdir(parents=True, exist_ok=True)
    out = {name: _stored(t, dtype).contiguous() for name, t in tensors.items()}
    save_file(out, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _stored(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """How a head tensor is stored: floats in dtype, bools as they are, integers as int64."""
    t = t.detach()
    if t.is_floating_point():
        return t.to(dtype)
    return t if t.dtype == torch.bool else t.long()
