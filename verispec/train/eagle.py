"""The trainable EAGLE-3 head and its loss: soft cross-entropy against the target's own
distribution, unrolled over several draft depths (EAGLE-3's training-time test).

At depth 1 row r reads the fused target features of position r; at depth s > 1 it reads the
head's own output of row r - 1 at depth s - 1, exactly what drafting feeds it, and attends to
depth-1 keys up to row r - s + 1 plus one key per deeper depth on the diagonal (its ancestors
in a draft), as the inference head does with its KV cache (verispec/models/eagle.py).
Tokens stay the true ones: a deeper draft only matters when the shallower ones were right.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from verispec.models.eagle import EagleConfig
from verispec.models.rope import apply_rope, inverse_frequencies, rope_cos_sin


class TrainableEagle(nn.Module):
    """The head's parameters as an nn.Module; the target's embedding is a frozen buffer."""

    def __init__(
        self, config: EagleConfig, embed: torch.Tensor, draft_ids: torch.Tensor,
        lm_head_init: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """Random weights from torch's global generator (seed it first for a fixed start)."""
        super().__init__()
        c = config
        h, d = c.hidden_size, c.head_dim
        self.config = c
        self.register_buffer("embed", embed.float().clone(), persistent=False)  # [vocab, hidden]
        self.register_buffer("draft_ids", draft_ids.long().clone())  # [draft vocab] target ids
        to_draft = torch.full((c.vocab_size,), -1, dtype=torch.long)
        to_draft[draft_ids.long()] = torch.arange(len(draft_ids))
        self.register_buffer("to_draft", to_draft, persistent=False)  # [vocab] draft id or -1
        n = len(c.feature_layers)
        self.fc = nn.Linear(n * h, h, bias=False)
        widths = [n * h] if c.norm_before_fc else [h] * n if c.fc_norm else []
        self.fused_norms = nn.ParameterList([nn.Parameter(torch.ones(w)) for w in widths])
        """The norms over the fused features before fc, where the config has them."""
        self.input_norm = nn.Parameter(torch.ones(h))
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.q = nn.Linear(2 * h, c.num_heads * d, bias=False)
        self.k = nn.Linear(2 * h, c.num_kv_heads * d, bias=False)
        self.v = nn.Linear(2 * h, c.num_kv_heads * d, bias=False)
        self.o = nn.Linear(c.num_heads * d, h, bias=False)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate = nn.Linear(h, c.intermediate_size, bias=False)
        self.up = nn.Linear(h, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        for lin in (self.fc, self.q, self.k, self.v, self.o, self.gate, self.up, self.down):
            nn.init.normal_(lin.weight, std=0.02)
        nn.init.normal_(self.o.weight, std=0.02 / math.sqrt(2))
        nn.init.normal_(self.down.weight, std=0.02 / math.sqrt(2))
        if lm_head_init is not None:  # the target's LM head rows of the draft vocabulary
            self.lm_head.weight.data.copy_(lm_head_init.float())
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        self.register_buffer(
            "inv_freq", inverse_frequencies(d, c.rope_theta, c.rope_scaling), persistent=False
        )

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in float32 (under bf16 autocast too: one fused call, as inference does)."""
        return F.rms_norm(x.float(), weight.shape, weight.float(), self.config.rms_norm_eps)

    def forward(
        self, token_ids: torch.Tensor, features: torch.Tensor, depths: int
    ) -> list[torch.Tensor]:
        """token_ids [B, T], target features [B, T, >= F] (the head's layers first; later
        columns are ignored) -> draft logits [B, T - 1, draft vocab] per depth 1..depths; row r
        of depth s predicts token r + 2 (from position r - s + 1's true features and s - 1 of
        the head's own steps)."""
        c = self.config
        b, t = token_ids.shape
        rows = t - 1
        positions = torch.arange(rows, device=token_ids.device)
        cos, sin = rope_cos_sin(positions, self.inv_freq, torch.float32)  # [R, head_dim]
        emb = self._norm(self.embed[token_ids[:, 1:]], self.input_norm)  # [B, R, H]
        fused = features[:, :rows, : self.fc.in_features].float()  # [B, R, F]
        if len(self.fused_norms):
            parts = fused.chunk(len(self.fused_norms), dim=-1)
            fused = torch.cat([self._norm(p, w) for p, w in zip(parts, self.fused_norms,
                                                                 strict=True)], dim=-1)  # fmt: skip
        feature = self.fc(fused)  # [B, R, H]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits = []
        for _ in range(depths):
            normed = self._norm(feature, self.hidden_norm)  # [B, R, H]
            x = torch.cat([emb, normed], dim=-1)  # [B, R, 2H]
            q = self.q(x).view(b, rows, c.num_heads, c.head_dim)
            k = self.k(x).view(b, rows, c.num_kv_heads, c.head_dim)
            v = self.v(x).view(b, rows, c.num_kv_heads, c.head_dim)
            q = apply_rope(q.flatten(0, 1), cos.repeat(b, 1), sin.repeat(b, 1)).view_as(q)
            k = apply_rope(k.flatten(0, 1), cos.repeat(b, 1), sin.repeat(b, 1)).view_as(k)
            keys.append(k)
            values.append(v)
            residual = normed if c.norm_before_residual else feature
            y = residual + self.o(self._unrolled_attention(q, keys, values).flatten(2))
            out = y + self.down(F.silu(self.gate(self._norm(y, self.post_norm)))
                                * self.up(self._norm(y, self.post_norm)))  # fmt: skip
            final = self._norm(out, self.norm)
            logits.append(self.lm_head(final))
            fed = final if c.norm_output else out
            feature = F.pad(fed[:, :-1], (0, 0, 1, 0))  # row r reads row r - 1's output
        return logits

    def _unrolled_attention(
        self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> torch.Tensor:
        """Depth s = len(keys): row r attends to depth-1 keys of rows <= r - s + 1 and to the
        depth-t key of row r - s + t for t = 2..s. q [B, R, H, D] -> [B, R, H, D]."""
        c = self.config
        s = len(keys)
        group = c.num_heads // c.num_kv_heads
        rows = q.shape[1]
        scale = c.head_dim**-0.5

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, R, KVH, D] -> [B, H, R, D]
            return x.repeat_interleave(group, dim=2).transpose(1, 2)

        qh = q.transpose(1, 2)  # [B, H, R, D]
        r = torch.arange(rows, device=q.device)
        base = (qh @ heads(keys[0]).transpose(-1, -2)) * scale  # [B, H, R, R]
        base = base.masked_fill(r[None, :] > (r[:, None] - s + 1), float("-inf"))
        diag_scores, diag_values = [], []
        for t in range(2, s + 1):
            shift = s - t  # row r reads row r - shift of depth t
            kt = F.pad(heads(keys[t - 1])[:, :, : rows - shift], (0, 0, shift, 0))
            vt = F.pad(heads(values[t - 1])[:, :, : rows - shift], (0, 0, shift, 0))
            score = (qh * kt).sum(-1, keepdim=True) * scale  # [B, H, R, 1]
            diag_scores.append(score.masked_fill((r < shift)[:, None], float("-inf")))
            diag_values.append(vt)
        scores = torch.cat([base, *diag_scores], dim=-1)  # [B, H, R, R + s - 1]
        # Rows with no visible key at all (r < s - 1) are never trained on; keep them finite.
        probs = torch.nan_to_num(scores.softmax(dim=-1))
        out = probs[..., :rows] @ heads(values[0])  # [B, H, R, D]
        for i, vt in enumerate(diag_values):
            out = out + probs[..., rows + i : rows + i + 1] * vt
        return out.transpose(1, 2)  # [B, R, H, D]

    def state_for_export(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors under the EAGLE-3 names (verispec/models/eagle_config.py)."""
        m = "midlayer."
        n = len(self.fused_norms)
        names = ["input_norm.weight"] if self.config.norm_before_fc else [
            f"fc_norm.{i}.weight" for i in range(n)]  # fmt: skip
        return {
            **dict(zip(names, self.fused_norms, strict=True)),
            "fc.weight": self.fc.weight, f"{m}input_layernorm.weight": self.input_norm,
            f"{m}hidden_norm.weight": self.hidden_norm,
            f"{m}self_attn.q_proj.weight": self.q.weight,
            f"{m}self_attn.k_proj.weight": self.k.weight,
            f"{m}self_attn.v_proj.weight": self.v.weight,
            f"{m}self_attn.o_proj.weight": self.o.weight,
            f"{m}post_attention_layernorm.weight": self.post_norm,
            f"{m}mlp.gate_proj.weight": self.gate.weight, f"{m}mlp.up_proj.weight": self.up.weight,
            f"{m}mlp.down_proj.weight": self.down.weight, "norm.weight": self.norm,
            "lm_head.weight": self.lm_head.weight,
            "d2t": draft_offsets(self.draft_ids),
        }  # fmt: skip


def draft_offsets(draft_ids: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's d2t: target id minus draft id of each draft token, e.g. [3, 5, 9] -> [3, 4, 7]."""
    return draft_ids - torch.arange(len(draft_ids), device=draft_ids.device)


def soft_targets(
    to_draft: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k distribution restricted to the draft vocabulary and renormalised:
    draft ids [..., k] (0 where outside it) and weights [..., k] (0 there; rows whose whole
    top-k lies outside get all zeros). E.g. ids [7, 9] with probs [0.6, 0.2], 9 not a draft
    token -> weights [1.0, 0.0]."""
    ids = to_draft[top_ids.long()]  # [..., k]
    weights = torch.where(ids >= 0, top_probs.float(), 0.0)
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-12)
    return ids.clamp(min=0), weights


def head_loss(
    logits: list[torch.Tensor],
    draft_ids: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    decay: float = 0.8,
) -> tuple[torch.Tensor, list[float]]:
    """Soft cross-entropy summed over depths (depth s weighted decay^(s-1)), and each depth's
    top-1 agreement with the target's most probable draft-vocabulary token.

    logits[s] [B, R, Vd]; draft_ids/weights [B, R, k] (row r: the target's distribution of
    token r + 2); mask [B, R] bool (rows trained on)."""
    total = torch.zeros((), device=mask.device)
    agreement = []
    best = draft_ids.gather(-1, weights.argmax(-1, keepdim=True)).squeeze(-1)  # [B, R]
    known = weights.sum(-1) > 0  # [B, R] rows whose target top-k reaches the draft vocabulary
    for s, lg in enumerate(logits):
        valid = mask & known
        valid[:, :s] = False  # row r < s has no true feature s steps back
        logp = F.log_softmax(lg.float(), dim=-1).gather(-1, draft_ids)  # [B, R, k]
        ce = -(weights * logp).sum(-1)  # [B, R]
        n = valid.sum().clamp(min=1)
        total = total + decay**s * (ce * valid).sum() / n
        hit = (lg.argmax(-1) == best) & valid
        agreement.append(float(hit.sum()) / float(n))
    return total, agreement
