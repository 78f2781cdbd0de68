"""MedusaHeads: K residual heads on the target's last hidden state (Medusa-1, Cai et al. 2024).

Head i turns the final-normed hidden state h of position t into a guess of token t + 2 + i
(the target's own LM head already gives token t + 1): logits_i = W_i(h + SiLU(A_i h + b_i)).

Checkpoint format (a directory, Medusa's tensor names): config.json with
`architectures: ["MedusaHeads"]`, `medusa_num_heads`, `medusa_num_layers` (1), `hidden_size`,
`vocab_size` (the target's), `draft_vocab_size`; model.safetensors with `{i}.0.linear.weight`
[hidden, hidden] and `{i}.0.linear.bias` [hidden] (the residual block of head i) and
`{i}.1.weight` [draft_vocab_size, hidden] (its LM head), and `d2t` [draft_vocab_size] (target
id = draft id + d2t[draft id]) when the draft vocabulary is reduced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from verispec.models.eagle import check_draft_ids
from verispec.models.head_files import read_head_dir, write_head_dir
from verispec.models.kernels.linear import Linear, pack_together
from verispec.models.llama import LlamaModel, rms_norm

ARCHITECTURE = "MedusaHeads"


@dataclass(slots=True)
class MedusaConfig:
    """Shapes of a set of Medusa heads."""

    num_heads: int
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> MedusaConfig:
        """Parse config.json; ValueError when it does not describe Medusa heads."""
        if ARCHITECTURE not in (cfg.get("architectures") or []) or "medusa_num_heads" not in cfg:
            raise ValueError(f"not a Medusa checkpoint: config.json needs architectures "
                             f"[{ARCHITECTURE!r}] and medusa_num_heads")  # fmt: skip
        if int(cfg.get("medusa_num_layers", 1)) != 1:
            raise ValueError("only Medusa heads with one residual block (medusa_num_layers 1)")
        vocab = int(cfg["vocab_size"])
        return cls(int(cfg["medusa_num_heads"]), int(cfg["hidden_size"]), vocab,
                   int(cfg.get("draft_vocab_size") or vocab))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "architectures": [ARCHITECTURE], "medusa_num_heads": self.num_heads,
            "medusa_num_layers": 1, "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
        }  # fmt: skip

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        h = self.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"d2t": (self.draft_vocab_size,)}
        for i in range(self.num_heads):
            shapes[f"{i}.0.linear.weight"] = (h, h)
            shapes[f"{i}.0.linear.bias"] = (h,)
            shapes[f"{i}.1.weight"] = (self.draft_vocab_size, h)
        return shapes


class MedusaHeads:
    """Inference-time heads over a target's last hidden state (no KV cache: one step)."""

    def __init__(
        self, config: MedusaConfig, weights: dict[str, torch.Tensor], target: LlamaModel,
        backend: str, batch_invariant: bool = False, quantization: str | None = None,
    ) -> None:  # fmt: skip
        t = target.config
        if config.hidden_size != t.hidden_size or config.vocab_size != t.vocab_size:
            raise ValueError(
                f"Medusa heads (hidden {config.hidden_size}, vocab {config.vocab_size}) do not "
                f"fit the target (hidden {t.hidden_size}, vocab {t.vocab_size})"
            )
        self.config = config
        self.final_norm, self.eps = target.final_norm, t.rms_norm_eps
        self.feature_layer = t.num_layers
        """The target residual stream read: the last layer's output (before its final norm)."""
        self.device, self.dtype = target.device, target.dtype

        def tensor(name: str) -> torch.Tensor:
            return weights[name].to(self.device, self.dtype)

        def linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            return Linear(weight, bias, backend, batch_invariant, quantization)

        self.blocks = [linear(tensor(f"{i}.0.linear.weight"), tensor(f"{i}.0.linear.bias"))
                       for i in range(config.num_heads)]  # fmt: skip
        self.heads = [linear(tensor(f"{i}.1.weight"), None) for i in range(config.num_heads)]
        pack_together([lin for pair in zip(self.blocks, self.heads, strict=True) for lin in pair])
        offsets = weights["d2t"].to(self.device, torch.int64)
        self.draft_to_target = torch.arange(len(offsets), device=self.device) + offsets
        check_draft_ids(self.draft_to_target, config.vocab_size)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Last-layer residual stream [n, hidden] -> draft logits [heads, n, draft vocab] of
        the first num_heads heads (all by default)."""
        h = rms_norm(hidden.to(self.dtype), self.final_norm, self.eps)
        pairs = zip(self.blocks[:num_heads], self.heads[:num_heads], strict=True)
        return torch.stack([head(h + F.silu(block(h))).float() for block, head in pairs])


def load_medusa_heads(
    path: Path, target: LlamaModel, backend: str, batch_invariant: bool = False,
    quantization: str | None = None,
) -> MedusaHeads:  # fmt: skip
    """Read a Medusa directory (config.json + *.safetensors) for `target`; without d2t the
    heads cover the whole vocabulary."""

    def parse(raw: dict[str, Any]) -> tuple[MedusaConfig, dict[str, tuple[int, ...]]]:
        config = MedusaConfig.from_dict(raw)
        return config, config.tensor_shapes()

    def no_reduction(config: MedusaConfig) -> dict[str, torch.Tensor]:
        return {"d2t": torch.zeros(config.draft_vocab_size, dtype=torch.int64)}

    config, weights = read_head_dir(path, "Medusa checkpoint", parse, no_reduction)
    return MedusaHeads(config, weights, target, backend, batch_invariant, quantization)


def save_medusa_heads(
    config: MedusaConfig, tensors: dict[str, torch.Tensor], path: Path,
    dtype: torch.dtype = torch.float16,
) -> None:  # fmt: skip
    """Write a Medusa directory: config.json and model.safetensors (floats in dtype)."""
    write_head_dir(config.to_dict(), tensors, config.tensor_shapes(), path, dtype)
