"""The speculators format: how the `speculators` package, vLLM's standard for speculator
checkpoints, stores an EAGLE-3 head; read and written beside the EAGLE-3 layout
(models/eagle_config.py), with the same weights.

config.json: `speculators_model_type` "eagle3", `architectures` ["Eagle3Speculator"],
`transformer_layer_config` (the draft layer's own Llama config: hidden_size, heads, head_dim,
intermediate_size, rms_norm_eps, rope settings, max_position_embeddings, num_hidden_layers 1 and
vocab_size, the verifier's), `draft_vocab_size`, `eagle_aux_hidden_state_layer_ids` (numbered as
in the EAGLE-3 layout; absent: the default layers of the target), `target_hidden_size` (None:
the layer's), the switches for variants of the layer (norm_before_residual, norm_before_fc,
fc_norm, norm_output: EagleConfig's; embed_requires_grad, a head with its own embedding, which
verispec does not run), and `speculators_config` {algorithm, proposal_methods [{proposal_type
"greedy", speculative_tokens, ...}], default_proposal_method, verifier {name_or_path,
architectures}}.
Tensors: the EAGLE-3 layout's, `layers.0.` in place of `midlayer.`, plus `t2d` [vocab] bool
(True at the target ids of the draft vocabulary); a head over the whole vocabulary may leave out
d2t and t2d. A stored `embed_tokens.weight` is the verifier's own and is not read: the head
embeds with the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verispec.models.config import ModelConfig
from verispec.models.eagle_config import VARIANTS, EagleConfig, default_layers

MODEL_TYPE = "eagle3"
"""The speculators_model_type verispec runs."""
ARCHITECTURE = "Eagle3Speculator"
LAYER_PREFIX, EAGLE3_PREFIX = "layers.0.", "midlayer."


@dataclass(frozen=True, slots=True)
class SpeculatorsMeta:
    """What the speculators format records about a head besides its shapes."""

    verifier: str | None
    """The target's name or path (speculators_config.verifier.name_or_path)."""
    architectures: tuple[str, ...] = ()
    """The target's architectures, as its config.json names them."""
    speculative_tokens: int = 3
    """Draft length of the greedy proposal method (vLLM's default num_speculative_tokens)."""

    def __post_init__(self) -> None:
        if self.speculative_tokens < 1:
            raise ValueError(f"speculative_tokens must be >= 1, got {self.speculative_tokens}")


def is_speculators(cfg: dict[str, Any]) -> bool:
    """Whether a head's config.json is in the speculators format (it names its model type)."""
    return "speculators_model_type" in cfg


def from_speculators(
    cfg: dict[str, Any], target: ModelConfig
) -> tuple[EagleConfig, SpeculatorsMeta]:
    """The head a speculators config.json describes, for `target` (whose default layers it
    reads when the config names none); ValueError for a model type or layer verispec does not
    run, a malformed speculators_config, or a verifier of another hidden size or vocabulary."""
    kind = cfg.get("speculators_model_type")
    if kind != MODEL_TYPE:
        raise ValueError(f"speculators model type {kind!r} is not one verispec runs; supported: "
                         f"{MODEL_TYPE!r} (EAGLE-3 heads)")  # fmt: skip
    meta = _meta(cfg.get("speculators_config"))
    layer = _layer(cfg.get("transformer_layer_config"))
    _check_switches(cfg, layer)
    if "draft_vocab_size" not in cfg:
        raise ValueError("speculators eagle3 config lacks draft_vocab_size")
    layers = cfg.get("eagle_aux_hidden_state_layer_ids") or default_layers(target.num_layers)
    config = EagleConfig(
        hidden_size=layer.hidden_size, num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads,
        head_dim=layer.head_dim, intermediate_size=layer.intermediate_size,
        vocab_size=layer.vocab_size, draft_vocab_size=int(cfg["draft_vocab_size"]),
        feature_layers=tuple(int(i) for i in layers), rms_norm_eps=layer.rms_norm_eps,
        rope_theta=layer.rope_theta, rope_scaling=layer.rope_scaling,
        max_position_embeddings=layer.max_position_embeddings,
        **{name: bool(cfg.get(name)) for name in VARIANTS},
    )  # fmt: skip
    own, its = (config.hidden_size, config.vocab_size), (target.hidden_size, target.vocab_size)
    if own != its:
        raise ValueError(f"speculators head for verifier {meta.verifier!r} (hidden {own[0]}, "
                         f"vocab {own[1]}) does not fit the target (hidden {its[0]}, vocab "
                         f"{its[1]}): use a head trained for this target")  # fmt: skip
    return config, meta


def _meta(spec: Any) -> SpeculatorsMeta:
    """speculators_config, checked as vLLM and the package read it."""
    if not isinstance(spec, dict):
        raise ValueError("speculators config lacks speculators_config (its proposal methods "
                         "and verifier)")  # fmt: skip
    methods = spec.get("proposal_methods")
    if not isinstance(methods, list) or not methods or not all(isinstance(m, dict)
                                                               for m in methods):  # fmt: skip
        raise ValueError("speculators_config.proposal_methods must be a non-empty list of "
                         f"proposal methods, got {methods!r}")  # fmt: skip
    kinds = [m.get("proposal_type") for m in methods]
    default = spec.get("default_proposal_method")
    if default not in kinds:
        raise ValueError(f"speculators_config.default_proposal_method {default!r} is not the "
                         f"proposal_type of any proposal method ({kinds})")  # fmt: skip
    tokens = methods[kinds.index(default)].get("speculative_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"speculators_config: proposal method {default!r} needs "
                         f"speculative_tokens >= 1, got {tokens!r}")  # fmt: skip
    verifier = spec.get("verifier")
    if not isinstance(verifier, dict) or "name_or_path" not in verifier:
        raise ValueError("speculators_config.verifier must name the verifier (name_or_path, "
                         f"architectures), got {verifier!r}")  # fmt: skip
    name = verifier["name_or_path"]
    return SpeculatorsMeta(None if name is None else str(name),
                           tuple(verifier.get("architectures") or ()), tokens)  # fmt: skip


def _layer(layer: Any) -> ModelConfig:
    """transformer_layer_config, which must be one plain Llama layer (what EagleHead runs)."""
    if not isinstance(layer, dict):
        raise ValueError("speculators config lacks transformer_layer_config (the draft layer's "
                         "shapes)")  # fmt: skip
    try:
        parsed = ModelConfig.from_dict(layer)
    except KeyError as e:
        raise ValueError(f"transformer_layer_config lacks {e.args[0]!r}") from e
    except ValueError as e:
        raise ValueError(f"transformer_layer_config: {e}") from e
    if parsed.num_layers != 1:
        raise ValueError(f"transformer_layer_config has {parsed.num_layers} layers; verispec "
                         "runs EAGLE-3 heads of one layer")  # fmt: skip
    extras = {
        "q/k/v biases": parsed.qkv_bias,
        "q/k norms": parsed.qk_norm,
        "MLP biases": bool(layer.get("mlp_bias")),
        "sliding windows": any(w is not None for w in parsed.sliding_windows),
        f"activation {layer.get('hidden_act')!r}": layer.get("hidden_act", "silu") != "silu",
    }
    found = [name for name, on in extras.items() if on]  # fmt: skip
    if found:
        raise ValueError(
            f"transformer_layer_config has {', '.join(found)}; verispec's EAGLE "
            "head is a plain Llama layer (SiLU MLP, no biases, full attention)"
        )
    return parsed


def _check_switches(cfg: dict[str, Any], layer: ModelConfig) -> None:
    """The top-level switches must describe a layer verispec runs, as wide as the target."""
    if "norm_before_residual" not in cfg:
        raise ValueError("speculators eagle3 config lacks norm_before_residual (vLLM reads a "
                         "missing one as true, the speculators package as false)")  # fmt: skip
    if cfg.get("embed_requires_grad"):
        raise ValueError("speculators eagle3 config sets embed_requires_grad: the head trained "
                         "its own token embedding, and verispec's heads embed with the "
                         "target's")  # fmt: skip
    wide = cfg.get("target_hidden_size")
    if wide is not None and int(wide) != layer.hidden_size:
        raise ValueError(f"speculators head fuses target features of width {wide} into a "
                         f"layer of {layer.hidden_size}; verispec runs heads as wide as their "
                         "target (target_hidden_size null or equal to hidden_size)")  # fmt: skip


def to_speculators(config: EagleConfig, meta: SpeculatorsMeta) -> dict[str, Any]:
    """The speculators config.json of a head (the inverse of from_speculators)."""
    c = config
    rope = {"rope_type": "default", **(c.rope_scaling or {}), "rope_theta": c.rope_theta}
    layer = {
        "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "hidden_act": "silu", "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling, "rope_parameters": rope,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }  # fmt: skip
    greedy = {"proposal_type": "greedy", "speculative_tokens": meta.speculative_tokens,
              "verifier_accept_k": 1}  # fmt: skip
    return {
        "speculators_model_type": MODEL_TYPE, "architectures": [ARCHITECTURE],
        "transformer_layer_config": layer, "draft_vocab_size": c.draft_vocab_size,
        **{name: getattr(c, name) for name in VARIANTS}, "embed_requires_grad": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
        "speculators_config": {
            "algorithm": MODEL_TYPE, "proposal_methods": [greedy],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": meta.verifier, "architectures": list(meta.architectures)},
        },
    }  # fmt: skip


def speculators_name(name: str) -> str:
    """An EAGLE-3 tensor name in the speculators layout, e.g. midlayer.mlp.up_proj.weight ->
    layers.0.mlp.up_proj.weight; fc.weight stays fc.weight."""
    return (
        LAYER_PREFIX + name.removeprefix(EAGLE3_PREFIX) if name.startswith(EAGLE3_PREFIX) else name
    )


def tensor_shapes(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a speculators checkpoint must hold, by their names there, and their shapes."""
    return {speculators_name(k): shape for k, shape in config.tensor_shapes().items()}


def whole_vocab_offsets(config: EagleConfig) -> dict[str, torch.Tensor]:
    """The d2t a head over the whole vocabulary may leave out (every offset 0), else nothing."""
    if config.draft_vocab_size != config.vocab_size:
        return {}
    return {"d2t": torch.zeros(config.draft_vocab_size, dtype=torch.int64)}


def eagle3_tensors(
    config: EagleConfig, weights: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A speculators checkpoint's tensors under the EAGLE-3 names (what EagleHead reads); a
    stored t2d must mark exactly the target ids d2t maps to."""
    out = {name: weights[speculators_name(name)] for name in config.tensor_shapes()}
    t2d = weights.get("t2d")
    if t2d is not None:
        draft_ids = torch.arange(config.draft_vocab_size) + out["d2t"].long()  # [draft vocab]
        if tuple(t2d.shape) != (config.vocab_size,):
            raise ValueError(f"speculators head: t2d has shape {list(t2d.shape)}, the config "
                             f"implies [{config.vocab_size}]")  # fmt: skip
        if not torch.equal(t2d.bool().nonzero().flatten(), draft_ids.sort().values):
            raise ValueError("speculators head: t2d marks other target ids than d2t maps the "
                             "draft vocabulary to")  # fmt: skip
    return out


def speculators_tensors(
    config: EagleConfig, tensors: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[int, ...]]]:
    """(tensors, shapes) to write in the speculators layout: renamed, with t2d; d2t and t2d
    left out for a head over the whole vocabulary in its own order, as the package does."""
    shapes = tensor_shapes(config)
    out = {speculators_name(name): t for name, t in tensors.items()}
    d2t = tensors["d2t"].long()  # [draft vocab]
    if whole_vocab_offsets(config) and not d2t.any():
        del out["d2t"], shapes["d2t"]
        return out, shapes
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)  # [vocab]
    t2d[torch.arange(len(d2t)) + d2t] = True
    out["t2d"], shapes["t2d"] = t2d, (config.vocab_size,)
    return out, shapes
