"""ModelConfig: the architecture facts the runtime needs, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Architecture name in config.json -> family traits. The only place architectures are listed.
SUPPORTED_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "MistralForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "Qwen2ForCausalLM": {"qkv_bias": True, "qk_norm": False},
    "Qwen3ForCausalLM": {"qkv_bias": False, "qk_norm": True},
}
# config.json model_type -> architecture, for configs that name no (supported) architecture.
MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True)
class ModelConfig:
    """Shapes and options of one Llama-family decoder."""

    architecture: str
    """Hugging Face architecture name, e.g. "LlamaForCausalLM"."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    """Fewer than num_heads means grouped-query attention."""
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    """Context length the model was trained for; the default max_model_len."""
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """None, or {"rope_type": "linear"|"llama3", ...} as in config.json."""
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    """Qwen2 has biases on the q, k and v projections."""
    qk_norm: bool = False
    """Qwen3 RMS-normalises q and k per head before RoPE."""
    sliding_windows: list[int | None] = field(default_factory=list)
    """Per layer: attention window in tokens, or None for full attention."""
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Parse a config.json dict (transformers 4.x or 5.x layout); ValueError if unsupported."""
        arch = _architecture(cfg)
        traits = SUPPORTED_ARCHITECTURES[arch]
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        num_layers = int(cfg["num_hidden_layers"])
        rope = rope_settings(cfg)
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rope_theta=rope[0],
            rope_scaling=rope[1],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=traits["qkv_bias"] or bool(cfg.get("attention_bias") or False),
            qk_norm=traits["qk_norm"],
            sliding_windows=_sliding_windows(cfg, num_layers),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_id_list(cfg.get("eos_token_id")),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read and parse a config.json file."""
        try:
            cfg = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read model config {path}: {e}") from e
        return cls.from_dict(cfg)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Hugging Face tensor name -> the shape this config implies (weights are [out, in]).

        E.g. hidden 64 with 2 KV heads of 16: "model.layers.0.self_attn.k_proj.weight" -> (32, 64).
        """
        hidden, inter, head_dim = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * head_dim, self.num_kv_heads * head_dim
        layer = {
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
            "self_attn.q_proj.weight": (q, hidden),
            "self_attn.k_proj.weight": (kv, hidden),
            "self_attn.v_proj.weight": (kv, hidden),
            "self_attn.q_proj.bias": (q,),
            "self_attn.k_proj.bias": (kv,),
            "self_attn.v_proj.bias": (kv,),
            "self_attn.o_proj.weight": (hidden, q),
            "self_attn.o_proj.bias": (hidden,),
            "self_attn.q_norm.weight": (head_dim,),
            "self_attn.k_norm.weight": (head_dim,),
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
        }
        shapes = {
            "model.embed_tokens.weight": (self.vocab_size, hidden),
            "lm_head.weight": (self.vocab_size, hidden),
            "model.norm.weight": (hidden,),
        }
        for i in range(self.num_layers):
            shapes.update({f"model.layers.{i}.{name}": shape for name, shape in layer.items()})
        return shapes


def _architecture(cfg: dict[str, Any]) -> str:
    """The supported architecture a config names, or the one its model_type implies when it
    names none (as transformers does); ValueError listing the supported ones otherwise."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None and not archs:
        arch = MODEL_TYPES.get(cfg.get("model_type") or "")
    if arch is None:
        named = ", ".join(archs) if archs else f"model_type {cfg.get('model_type')!r}"
        raise ValueError(
            f"unsupported model architecture {named}; supported architectures: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (model types {', '.join(MODEL_TYPES)})"
        )
    return arch


def _as_id_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def rope_settings(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None); transformers 5 nests theta in rope_parameters."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling type {rope_type!r}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    params["rope_type"] = rope_type
    params.pop("type", None)  # the 4.x spelling of rope_type
    params.pop("rope_theta", None)  # 5.x nests it here; it lives in ModelConfig.rope_theta
    return theta, params


def _sliding_windows(cfg: dict[str, Any], num_layers: int) -> list[int | None]:
    """Per-layer attention window: from layer_types (Qwen) or a global sliding_window (Mistral)."""
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types:
        return [window if t == "sliding_attention" else None for t in layer_types]
    if cfg.get("use_sliding_window") is False:
        return [None] * num_layers
    return [window] * num_layers
