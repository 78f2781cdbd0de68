"""Trainable Medusa heads and their loss: head i at position t matches the target's own
distribution of token t + 2 + i (soft cross-entropy, Medusa-1 with self-distillation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from verispec.models.medusa import MedusaConfig
from verispec.train.eagle import draft_offsets


class TrainableMedusa(nn.Module):
    """K residual blocks + LM heads over the target's final-normed last hidden state."""

    def __init__(
        self, config: MedusaConfig, final_norm: torch.Tensor, eps: float,
        draft_ids: torch.Tensor, lm_head_init: torch.Tensor,
    ) -> None:  # fmt: skip
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.eps = eps
        self.register_buffer("final_norm", final_norm.float().clone(), persistent=False)
        self.register_buffer("draft_ids", draft_ids.long().clone())
        to_draft = torch.full((config.vocab_size,), -1, dtype=torch.long)
        to_draft[draft_ids.long()] = torch.arange(len(draft_ids))
        self.register_buffer("to_draft", to_draft, persistent=False)
        # Zero blocks: each head starts as the target's own LM head (Medusa's initialisation).
        self.blocks = nn.ModuleList(nn.Linear(h, h) for _ in range(config.num_heads))
        self.heads = nn.ModuleList(
            nn.Linear(h, config.draft_vocab_size, bias=False) for _ in range(config.num_heads)
        )
        for block, head in zip(self.blocks, self.heads, strict=True):
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
            head.weight.data.copy_(lm_head_init.float())

    def forward(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Last-layer residual stream [B, T, H] -> per head draft logits [B, T, draft vocab]."""
        h = F.rms_norm(hidden.float(), self.final_norm.shape, self.final_norm, self.eps)
        return [head(h + F.silu(block(h))) for block, head in zip(self.blocks, self.heads,
                                                                  strict=True)]  # fmt: skip

    def state_for_export(self) -> dict[str, torch.Tensor]:
        """Tensors under Medusa's names (verispec/models/medusa.py)."""
        out: dict[str, torch.Tensor] = {"d2t": draft_offsets(self.draft_ids)}
        for i, (block, head) in enumerate(zip(self.blocks, self.heads, strict=True)):
            out[f"{i}.0.linear.weight"] = block.weight
            out[f"{i}.0.linear.bias"] = block.bias
            out[f"{i}.1.weight"] = head.weight
        return out


def medusa_loss(
    logits: list[torch.Tensor],
    draft_ids: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, list[float]]:
    """Mean soft cross-entropy over heads, and each head's top-1 agreement with the target.

    logits[i] [B, T, Vd] (row t guesses token t + 2 + i); draft_ids/weights [B, T, k]: the
    target's distribution of token t + 1 at row t (soft_targets); mask [B, T] bool: row t's
    token t + 1 is trained on. Head i at row t is scored against row t + 1 + i."""
    total = torch.zeros((), device=mask.device)
    agreement = []
    t = mask.shape[1]
    best = draft_ids.gather(-1, weights.argmax(-1, keepdim=True)).squeeze(-1)  # [B, T]
    for i, lg in enumerate(logits):
        shift = i + 1
        if shift >= t:
            agreement.append(0.0)
            continue
        valid = mask[:, shift:] & (weights[:, shift:].sum(-1) > 0)  # [B, T - shift]
        logp = F.log_softmax(lg[:, :-shift].float(), dim=-1).gather(-1, draft_ids[:, shift:])
        ce = -(weights[:, shift:] * logp).sum(-1)  # [B, T - shift]
        n = valid.sum().clamp(min=1)
        total = total + (ce * valid).sum() / n / len(logits)
        hit = (lg[:, :-shift].argmax(-1) == best[:, shift:]) & valid
        agreement.append(float(hit.sum()) / float(n))
    return total, agreement
