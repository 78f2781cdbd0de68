"""EagleHead: an EAGLE-3 style draft head (one decoder layer over the target's own features).

Checkpoint format (a directory, the layout vLLM and SGLang read for EAGLE-3 heads; the
speculators package's layout of the same head is read and written too, models/speculators.py):
config.json with `architectures: ["LlamaForCausalLMEagle3"]`, the layer's Llama shapes
(hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
rms_norm_eps, rope_theta, rope_scaling, max_position_embeddings), `vocab_size` (the target's),
`draft_vocab_size`, and `eagle_config.eagle_aux_hidden_state_layer_ids` (the target layers whose
input residual stream is fused; see LlamaModel.hidden_states); and model.safetensors with
`fc.weight` [hidden, n_features * hidden], `midlayer.{input_layernorm,hidden_norm,
post_attention_layernorm}.weight`, `midlayer.self_attn.{q,k,v,o}_proj.weight` (q/k/v read
2 * hidden inputs: the normed token embedding, then the normed feature), `midlayer.mlp.
{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight` [draft_vocab_size, hidden] and
`d2t` [draft_vocab_size] (target id = draft id + d2t[draft id]). Token embeddings are the
target's own (frozen), so the head never stores them.

One head step for row r (token x_{r+1} at rotary position r, feature f):
  e = norm(embed(x_{r+1})); h = norm(f); a = attention(concat(e, h)); y = f + a;
  out = y + mlp(norm(y)); logits = lm_head(norm(out)) predicts x_{r+2}.
f is fc(target features of position r) when they are known, else the head's own `out` of the
row before (drafting deeper than the target has seen).
Variants (EagleConfig's switches, as vLLM and the speculators package run them):
norm_before_residual adds a to h instead of f; norm_before_fc norms the fused features
(input_norm.weight), fc_norm each fused layer's (fc_norm.{i}.weight), before fc; norm_output
feeds the next row norm(out) instead of out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F

from verispec.kv.cache import KVCache
from verispec.models.attention import AttentionLayout
from verispec.models.batch import ForwardBatch
from verispec.models.config import ModelConfig
from verispec.models.eagle_config import EagleConfig
from verispec.models.head_files import (
    check_tensor_names,
    read_head_config,
    read_head_tensors,
    write_head_dir,
)
from verispec.models.kernels import native_layer
from verispec.models.kernels.compiled import CompiledStack
from verispec.models.kernels.linear import Linear, pack_together
from verispec.models.llama import (
    DecoderLayer,
    LayerInputs,
    LlamaModel,
    rms_norm,
    self_attention,
)
from verispec.models.rope import inverse_frequencies, rope_cos_sin
from verispec.models.speculators import (
    SpeculatorsMeta,
    eagle3_tensors,
    from_speculators,
    is_speculators,
    speculators_tensors,
    tensor_shapes,
    to_speculators,
    whole_vocab_offsets,
)
from verispec.types.numerics import check_compile

WHAT = "EAGLE head"
FUSED = ("input_norm.", "fc_norm.")
"""Name prefixes of the norms over the fused features (EagleConfig.tensor_shapes)."""


class EagleHead:
    """Inference-time head: frozen weights, the target's embedding, a one-layer paged KV cache."""

    def __init__(
        self,
        config: EagleConfig,
        weights: dict[str, torch.Tensor],
        target: LlamaModel,
        backend: str,
        batch_invariant: bool = False,
        quantization: str | None = None,
    ) -> None:
        check_head_fits(config, target)
        self.config = config
        self.layer_config = config.layer_config()
        self.batch_invariant = batch_invariant
        self.embed = target.embed  # [vocab, hidden], shared with the target
        self.dtype, self.device = target.dtype, target.device
        w = {k: v.to(self.device) for k, v in weights.items()}
        floats = {k: v.to(self.dtype) for k, v in w.items() if k != "d2t"}

        def linear(name: str) -> Linear:
            return make_linear(floats[name])

        def make_linear(weight: torch.Tensor) -> Linear:
            return Linear(weight, None, backend, batch_invariant, quantization)

        m = "midlayer."
        qkv = torch.cat([floats[f"{m}self_attn.{n}_proj.weight"] for n in "qkv"])
        gate_up = torch.cat([floats[f"{m}mlp.gate_proj.weight"], floats[f"{m}mlp.up_proj.weight"]])
        self.fc = linear("fc.weight")
        self.fused_norms = [floats[k] for k in config.tensor_shapes() if k.startswith(FUSED)]
        """norm_before_fc: [the fused features' norm]; fc_norm: one per fused layer; else []."""
        self.hidden_norm = floats[f"{m}hidden_norm.weight"]
        self.layer = DecoderLayer(
            input_norm=floats[f"{m}input_layernorm.weight"],
            qkv=make_linear(qkv), q_norm=None, k_norm=None,
            o=linear(f"{m}self_attn.o_proj.weight"),
            post_norm=floats[f"{m}post_attention_layernorm.weight"],
            gate_up=make_linear(gate_up),
            down=linear(f"{m}mlp.down_proj.weight"), window=None,
        )  # fmt: skip
        self.norm = floats["norm.weight"]
        self.lm_head = linear("lm_head.weight")
        la = self.layer
        pack_together([self.fc, la.qkv, la.o, la.gate_up, la.down, self.lm_head])
        offsets = w["d2t"].to(torch.int64)  # [draft vocab]
        self.draft_to_target = torch.arange(len(offsets), device=self.device) + offsets
        """[draft vocab] int64: the target id of each draft id."""
        check_draft_ids(self.draft_to_target, config.vocab_size)
        self.inv_freq = inverse_frequencies(
            config.head_dim, config.rope_theta, config.rope_scaling
        ).to(self.device)
        self.compiled: CompiledStack | None = None
        """The head's step under torch.compile (see compile); None = eager."""
        self.native: native_layer.NativeStack | None = None
        """Where set, eager steps run the layer in native code (native_layer.py)."""
        if native_layer.supported([self.layer], self.layer_config, self.embed):
            self.native = native_layer.NativeStack([self.layer], self.layer_config,
                                                   self.inv_freq, self.norm)  # fmt: skip

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.config.feature_layers

    def new_kv_cache(self, num_blocks: int, block_size: int) -> KVCache:
        c = self.config
        return KVCache(1, num_blocks, block_size, c.num_kv_heads, c.head_dim, self.dtype,
                       self.device)  # fmt: skip

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [n, n_layers * hidden] -> the head's input feature [n, hidden]
        (normed first, whole or per layer, where the config says so)."""
        x = features.to(self.dtype)
        if self.fused_norms:
            parts = x.chunk(len(self.fused_norms), dim=-1)
            pairs = zip(parts, self.fused_norms, strict=True)
            x = torch.cat([rms_norm(p, w, self.config.rms_norm_eps) for p, w in pairs], dim=-1)
        return self.fc(x)

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, kv: KVCache, feature: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head step over a ragged batch; feature [T, hidden] per row (fused target
        features or the head's own output). Returns out [T, hidden] (the next rows' feature)
        and draft logits [L, draft vocab] float32 for batch.logits_indices."""
        if self.native is not None and self.compiled is None:
            return self.native_step(batch, kv, feature)
        layout = AttentionLayout.build(batch, {None}, self.batch_invariant,
                                       grouped=self.compiled is None)  # fmt: skip
        step = self.compiled or self.step
        return step(batch.input_ids, batch.positions, batch.slot_mapping, layout, kv, feature,
                    batch.logits_indices)  # fmt: skip

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        layout: AttentionLayout,
        kv: KVCache,
        feature: torch.Tensor,
        logits_indices: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward after the layout is built; what `compile` traces (input_ids, positions,
        slot_mapping [T]; feature [T, hidden]; logits_indices [L])."""
        eps = self.config.rms_norm_eps
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)  # [T, head_dim]
        x, residual = self.layer_input(input_ids, feature)  # [T, 2 * hidden], [T, hidden]
        inputs = LayerInputs(slot_mapping, kv, layout, cos, sin)
        y = residual + self_attention(self.layer_config, 0, self.layer, x, inputs)
        gate, up = self.layer.gate_up(rms_norm(y, self.layer.post_norm, eps)).chunk(2, dim=-1)
        out = y + self.layer.down(F.silu(gate) * up)  # [T, hidden]
        if self.config.norm_output:  # the next rows read the normed output
            out = rms_norm(out, self.norm, eps)
            return out, self.lm_head(out.index_select(0, logits_indices)).float()
        rows = out.index_select(0, logits_indices)
        return out, self.lm_head(rms_norm(rows, self.norm, eps)).float()

    def native_step(
        self, batch: ForwardBatch, kv: KVCache, feature: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """step's values (within float32 rounding) with the layer in one native call: the
        normed embedding and feature side by side are its first input, the residual its
        residual stream."""
        first, residual = self.layer_input(batch.input_ids, feature)
        out = residual.clone(memory_format=torch.contiguous_format)  # [T, hidden], updated
        stack = cast(native_layer.NativeStack, self.native)
        normed, _ = stack.run(batch, kv, out, first_input=first)  # [T, hidden]
        logits = self.lm_head(normed.index_select(0, batch.logits_indices)).float()
        return normed if self.config.norm_output else out, logits

    def layer_input(
        self, input_ids: torch.Tensor, feature: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the head's q/k/v read, the normed token embedding and the normed feature side
        by side [T, 2 * hidden]; and the residual the attention adds to [T, hidden]: the
        feature, or the normed feature where norm_before_residual."""
        eps = self.config.rms_norm_eps
        e = rms_norm(self.embed.index_select(0, input_ids), self.layer.input_norm, eps)
        h = rms_norm(feature, self.hidden_norm, eps)
        return torch.cat([e, h], dim=-1), h if self.config.norm_before_residual else feature

    def compile(self, backend: str | Callable = "inductor") -> None:
        """Run the head's step through torch.compile from now on (models/kernels/compiled.py)."""
        check_compile(True, self.batch_invariant)
        self.compiled = CompiledStack(self.step, backend)


def check_head_fits(config: EagleConfig, target: LlamaModel) -> None:
    """A head must match the target's hidden size and vocabulary, and read layers it has."""
    t = target.config
    if config.hidden_size != t.hidden_size or config.vocab_size != t.vocab_size:
        raise ValueError(
            f"EAGLE head (hidden {config.hidden_size}, vocab {config.vocab_size}) does not fit "
            f"the target (hidden {t.hidden_size}, vocab {t.vocab_size}): train a head for it"
        )
    target.check_feature_layers(config.feature_layers)


def check_draft_ids(draft_to_target: torch.Tensor, vocab_size: int) -> None:
    """d2t must map every draft id to a distinct target id."""
    ids = draft_to_target
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ValueError("d2t maps two draft ids to the same target id")


def read_eagle_head(path: Path, target: ModelConfig) -> tuple[EagleConfig, dict[str, torch.Tensor]]:
    """(config, tensors under the EAGLE-3 names) of a head directory in the EAGLE-3 layout or
    the speculators one (told apart by its config.json); ValueError when it is malformed or is
    a speculators head verispec cannot run for `target`."""
    raw = read_head_config(path, WHAT)
    if not is_speculators(raw):
        config = EagleConfig.from_dict(raw)
        return config, read_head_tensors(path, WHAT, config.tensor_shapes())
    config, _ = from_speculators(raw, target)
    weights = read_head_tensors(path, WHAT, tensor_shapes(config), whole_vocab_offsets(config))
    return config, eagle3_tensors(config, weights)


def load_eagle_head(
    path: Path,
    target: LlamaModel,
    backend: str,
    batch_invariant: bool = False,
    quantization: str | None = None,
    compile: bool = False,
) -> EagleHead:
    """Read a head directory (read_eagle_head) for `target`; compile as for load_model."""
    config, weights = read_eagle_head(path, target.config)
    head = EagleHead(config, weights, target, backend, batch_invariant, quantization)
    if compile:
        head.compile()
    return head


def save_eagle_head(
    config: EagleConfig, tensors: dict[str, torch.Tensor], path: Path,
    dtype: torch.dtype = torch.float16, speculators: SpeculatorsMeta | None = None,
) -> None:  # fmt: skip
    """Write a head directory: config.json and model.safetensors (floats in dtype, d2t int64),
    in the EAGLE-3 layout, or in the speculators one when `speculators` says what to record."""
    check_tensor_names(tensors, config.tensor_shapes())
    offsets = tensors["d2t"].long()  # [draft vocab]
    check_draft_ids(torch.arange(len(offsets)) + offsets, config.vocab_size)
    if speculators is None:
        write_head_dir(config.to_dict(), tensors, config.tensor_shapes(), path, dtype)
        return
    stored, shapes = speculators_tensors(config, tensors)
    write_head_dir(to_speculators(config, speculators), stored, shapes, path, dtype)
