"""LlamaModel: a native decoder for the Llama family (Llama 1-3, Mistral, Qwen2/2.5, Qwen3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from verispec.kv.cache import KVCache, token_bytes
from verispec.models.attention import AttentionLayout, attend
from verispec.models.batch import ForwardBatch
from verispec.models.config import ModelConfig
from verispec.models.kernels import native_layer
from verispec.models.kernels.compiled import CompiledStack
from verispec.models.kernels.linear import Linear, kernels_in_use
from verispec.models.rope import apply_rope, inverse_frequencies, rope_cos_sin
from verispec.types.numerics import check_compile


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32 then back to x's dtype, as transformers computes it.

    float32 takes torch's rms_norm (one call instead of eight from Python, the same values);
    other dtypes keep transformers' order, which rounds to x's dtype before scaling by weight.
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@dataclass(slots=True)
class DecoderLayer:
    """Weights of one decoder layer; q/k/v and gate/up are fused into one product each."""

    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # hidden -> (heads + 2 * kv_heads) * head_dim
    q_norm: torch.Tensor | None  # [head_dim], Qwen3 only
    k_norm: torch.Tensor | None  # [head_dim], Qwen3 only
    o: Linear  # heads * head_dim -> hidden
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear  # intermediate -> hidden
    window: int | None  # sliding attention window, None = full


class LlamaModel:
    """Forward over a ragged batch with a paged KV cache; returns logits of the requested rows."""

    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor,
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: Linear,
        batch_invariant: bool = False,
        vocab_ids: torch.Tensor | None = None,
    ) -> None:
        self.config = config
        self.embed = embed  # [vocab, hidden]
        self.layers = layers
        self.final_norm = final_norm  # [hidden]
        self.lm_head = lm_head
        self.vocab_ids = vocab_ids
        """[N] int64, ascending: the token id each row of lm_head scores, where the head covers
        a reduced vocabulary (a draft's: loader.build_model cuts it); None = row i scores
        token i. The embedding table stays whole: the model reads any token."""
        self.dtype = embed.dtype
        self.device = embed.device
        self.inv_freq = inverse_frequencies(
            config.head_dim, config.rope_theta, config.rope_scaling
        ).to(self.device)
        self.windows = {layer.window for layer in layers}
        self.batch_invariant = batch_invariant
        """Attention row by row over exactly its visible keys (see Linear.row_wise)."""
        self.compiled: CompiledStack | None = None
        """The decoder stack under torch.compile (see compile); None = eager."""
        self.native: native_layer.NativeStack | None = None
        """Where set, eager forwards run the whole stack in native code (native_layer.py: the
        same values within float32 rounding, one call); None = the torch operators below."""
        if native_layer.supported(layers, config, embed):
            self.native = native_layer.NativeStack(layers, config, self.inv_freq, final_norm)

    def linears(self) -> list[Linear]:
        """Every linear layer, in the order a forward runs them (the LM head last)."""
        layers = [lin for la in self.layers for lin in (la.qkv, la.o, la.gate_up, la.down)]
        return [*layers, self.lm_head]

    def kernels(self) -> dict[str, str]:
        """Which kernel each weight format of this model runs with (linear.kernels_in_use)."""
        return kernels_in_use(self.linears())

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of one token's keys and values in a cache of this model (new_kv_cache)."""
        c = self.config
        return token_bytes(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype)

    def new_kv_cache(self, num_blocks: int, block_size: int) -> KVCache:
        """A KV cache for num_blocks * block_size tokens, in this model's dtype and device."""
        c = self.config
        return KVCache(
            c.num_layers,
            num_blocks,
            block_size,
            c.num_kv_heads,
            c.head_dim,
            self.dtype,
            self.device,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Write the new tokens' keys/values into kv and return logits [L, vocab] float32
        for the rows in batch.logits_indices (vocab: lm_head's rows, see vocab_ids)."""
        if self.native is not None and native_layer.can_fold_head(self):
            x = self.embed.index_select(0, batch.input_ids)  # [T, hidden]
            return self.native.logits(batch, kv, x, self.lm_head)
        hidden, _ = self.hidden_states(batch, kv)  # [T, hidden]
        return self.logits(hidden.index_select(0, batch.logits_indices))

    @torch.inference_mode()
    def forward_with_features(
        self, batch: ForwardBatch, kv: KVCache, feature_layers: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As forward, plus the features a feature-level drafter reads, for every new token:
        logits [L, vocab] and features [T, len(feature_layers) * hidden] (see hidden_states)."""
        hidden, features = self.hidden_states(batch, kv, feature_layers)
        logits = self.logits(hidden.index_select(0, batch.logits_indices))
        return logits, torch.cat(features, dim=-1)

    def hidden_states(
        self, batch: ForwardBatch, kv: KVCache, feature_layers: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final-normed hidden states [T, hidden] of every new token, and the residual stream
        entering each layer in feature_layers ([T, hidden] each; index num_layers = after the
        last layer, before the final norm), as EAGLE-3 reads its low, middle and high layers."""
        self.check_feature_layers(feature_layers)
        if self.native is not None and self.compiled is None:
            x = self.embed.index_select(0, batch.input_ids)  # [T, hidden]
            return self.native.run(batch, kv, x, feature_layers)
        layout = AttentionLayout.build(batch, self.windows, self.batch_invariant,
                                       grouped=self.compiled is None)  # fmt: skip
        stack = self.compiled or self.decoder_stack
        return stack(batch.input_ids, batch.positions, batch.slot_mapping, layout, kv,
                     tuple(feature_layers))  # fmt: skip

    def decoder_stack(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        layout: AttentionLayout,
        kv: KVCache,
        feature_layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """hidden_states after the layout is built: embed, every layer, final norm; the part
        `compile` traces into one graph (input_ids, positions, slot_mapping [T] each)."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)  # [T, head_dim] each
        inputs = LayerInputs(slot_mapping, kv, layout, cos, sin)
        x = self.embed.index_select(0, input_ids)  # [T, hidden]
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in feature_layers:
                captured[i] = x
            x = decoder_layer(self.config, i, layer, x, inputs)
        captured[len(self.layers)] = x
        return rms_norm(x, self.final_norm, self._eps), [captured[i] for i in feature_layers]

    def without_layers(self, skip: Sequence[int]) -> LlamaModel:
        """This model with the decoder layers in `skip` left out, as a model of its own that
        shares every weight tensor (nothing is copied). Its layers are numbered 0..kept - 1,
        so it needs a KV cache of its own (new_kv_cache) with one layer per kept layer."""
        skipped = set(skip)
        keep = [layer for i, layer in enumerate(self.layers) if i not in skipped]
        windows = [layer.window for layer in keep] if self.config.sliding_windows else []
        config = replace(self.config, num_layers=len(keep), sliding_windows=windows)
        return LlamaModel(config, self.embed, keep, self.final_norm, self.lm_head,
                          self.batch_invariant, self.vocab_ids)  # fmt: skip

    def compile(self, backend: str | Callable = "inductor") -> None:
        """Run the decoder stack through torch.compile from now on (models/kernels/compiled.py).
        Batch-invariant mode stays eager: its row-by-row products are the exactness reference."""
        check_compile(True, self.batch_invariant)
        self.compiled = CompiledStack(self.decoder_stack, backend)

    def check_feature_layers(self, feature_layers: Sequence[int]) -> None:
        """Feature layer ids must name residual streams this model has: 0..num_layers."""
        bad = [i for i in feature_layers if not 0 <= i <= len(self.layers)]
        if bad:
            raise ValueError(
                f"feature layers {bad} are outside 0..{len(self.layers)} (this model has "
                f"{len(self.layers)} layers; {len(self.layers)} = the last layer's output)"
            )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [L, hidden] -> logits [L, vocab] float32."""
        return self.lm_head(hidden).float()

    @property
    def _eps(self) -> float:
        return self.config.rms_norm_eps


class LayerInputs(NamedTuple):
    """What every layer of one forward reads besides its residual stream: where the new keys
    and values go, the paged cache, the attention layout and the rotary tables."""

    slot_mapping: torch.Tensor
    """[T] the cache slot of each new token."""
    kv: KVCache
    layout: AttentionLayout
    cos: torch.Tensor
    """[T, head_dim] (sin likewise)."""
    sin: torch.Tensor


def decoder_layer(
    config: ModelConfig, index: int, layer: DecoderLayer, x: torch.Tensor, inputs: LayerInputs
) -> torch.Tensor:
    """The residual stream x [T, hidden] through layer `index` (its keys and values written at
    kv layer `index`): x + attention(norm(x)), then + MLP(norm(.))."""
    eps = config.rms_norm_eps
    normed = rms_norm(x, layer.input_norm, eps)
    x = x + self_attention(config, index, layer, normed, inputs)
    h = layer.gate_up(rms_norm(x, layer.post_norm, eps))  # [T, 2 * inter]
    gate, up = h.chunk(2, dim=-1)
    return x + layer.down(F.silu(gate) * up)


def self_attention(
    config: ModelConfig, index: int, layer: DecoderLayer, x: torch.Tensor, inputs: LayerInputs
) -> torch.Tensor:
    """Self-attention of layer `index` for its normed input x [T, in] -> [T, hidden]: project,
    rotate, write the new keys/values into kv, attend over the paged cache, project back."""
    slot_mapping, kv, layout, cos, sin = inputs
    c = config
    num_tokens = x.shape[0]
    qk_heads = c.num_heads + c.num_kv_heads
    qkv = layer.qkv(x)  # [T, (H + 2 * KVH) * D]
    qk = qkv[:, : qk_heads * c.head_dim].reshape(num_tokens, qk_heads, c.head_dim)
    v = qkv[:, qk_heads * c.head_dim :].reshape(num_tokens, c.num_kv_heads, c.head_dim)
    if layer.q_norm is not None and layer.k_norm is not None:
        q, k = qk.split([c.num_heads, c.num_kv_heads], dim=1)
        qk = torch.cat(
            [rms_norm(q, layer.q_norm, c.rms_norm_eps), rms_norm(k, layer.k_norm, c.rms_norm_eps)],
            1,
        )
    qk = apply_rope(qk, cos, sin)  # queries and keys rotated in one pass
    q, k = qk.split([c.num_heads, c.num_kv_heads], dim=1)  # [T, H, D], [T, KVH, D]
    kv.write(index, slot_mapping, k, v)  # slot_mapping [T]
    out = attend(q, kv, index, layout, layer.window, c.head_dim**-0.5)  # [T, H * D]
    return layer.o(out)
