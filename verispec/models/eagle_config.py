"""EagleConfig: the shapes of an EAGLE-3 head and the target layers it reads, and the config.json
of the EAGLE-3 layout vLLM and SGLang load (`LlamaForCausalLMEagle3`; models/eagle.py has the
checkpoint's tensors, models/speculators.py the speculators layout of the same head)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from verispec.models.config import ModelConfig, rope_settings

ARCHITECTURE = "LlamaForCausalLMEagle3"
VARIANTS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
"""EagleConfig's switches for variants of the layer, named as in config.json (vLLM's names)."""


@dataclass(slots=True)
class EagleConfig:
    """Shapes of one EAGLE-3 head and the target layers it reads."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    """The target's vocabulary (ids the head's tokens come from)."""
    draft_vocab_size: int
    """Rows of the head's own LM head (the target's most frequent tokens)."""
    feature_layers: tuple[int, ...]
    """Target residual streams fused by fc (LlamaModel.hidden_states numbering)."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """None, or the target's {"rope_type": "linear"|"llama3", ...} (ModelConfig.rope_scaling)."""
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    """The attention's residual is the normed feature, not the feature (the speculators
    package trains heads so by default)."""
    norm_before_fc: bool = False
    """One RMSNorm (input_norm.weight [n_features * hidden]) over the fused features first."""
    fc_norm: bool = False
    """One RMSNorm per fused layer (fc_norm.{i}.weight [hidden]) first (EAGLE 3.1)."""
    norm_output: bool = False
    """The next step reads the final-normed output, not the raw one (EAGLE 3.1)."""

    def __post_init__(self) -> None:
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are two ways to norm the fused "
                             "features: set one at most")  # fmt: skip

    @classmethod
    def for_target(
        cls, target: ModelConfig, draft_vocab_size: int, feature_layers: tuple[int, ...] | None
    ) -> EagleConfig:
        """A head shaped like one of the target's layers; features by default from a low, a
        middle and a high layer (default_layers)."""
        layers = feature_layers or default_layers(target.num_layers)
        return cls(
            hidden_size=target.hidden_size, num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
            intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size, feature_layers=tuple(layers),
            rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            max_position_embeddings=target.max_position_embeddings,
        )  # fmt: skip

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> EagleConfig:
        """Parse config.json; ValueError when it is not an EAGLE-3 head."""
        if ARCHITECTURE not in (cfg.get("architectures") or []):
            raise ValueError(
                f"not an EAGLE-3 head: config.json architectures must include {ARCHITECTURE!r}, "
                f"got {cfg.get('architectures')!r}"
            )
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        layers = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if not layers:
            raise ValueError("EAGLE-3 config lacks eagle_config.eagle_aux_hidden_state_layer_ids")
        theta, scaling = rope_settings(cfg)
        nested = cfg.get("eagle_config") or {}  # some writers keep the switches there
        switches = {name: bool(cfg.get(name, nested.get(name, False))) for name in VARIANTS}
        return cls(
            hidden_size=hidden, num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
            draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
            feature_layers=tuple(int(i) for i in layers),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)), **switches,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """config.json contents (the inverse of from_dict)."""
        d = asdict(self)
        return {
            "architectures": [ARCHITECTURE], "model_type": "llama",
            "hidden_size": d["hidden_size"], "num_attention_heads": d["num_heads"],
            "num_key_value_heads": d["num_kv_heads"], "head_dim": d["head_dim"],
            "intermediate_size": d["intermediate_size"], "num_hidden_layers": 1,
            "vocab_size": d["vocab_size"], "draft_vocab_size": d["draft_vocab_size"],
            "rms_norm_eps": d["rms_norm_eps"], "rope_theta": d["rope_theta"],
            "rope_scaling": d["rope_scaling"],
            "max_position_embeddings": d["max_position_embeddings"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.feature_layers)},
            **{name: d[name] for name in VARIANTS},
        }  # fmt: skip

    def layer_config(self) -> ModelConfig:
        """The head's one decoder layer as a ModelConfig (what attention reads)."""
        return ModelConfig(
            architecture="LlamaForCausalLM", vocab_size=self.draft_vocab_size,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_layers=1, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
        )  # fmt: skip

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the checkpoint and its shape."""
        h, d, n = self.hidden_size, self.head_dim, len(self.feature_layers)
        m = "midlayer."
        fused_norms = {"input_norm.weight": (n * h,)} if self.norm_before_fc else {}
        if self.fc_norm:
            fused_norms = {f"fc_norm.{i}.weight": (h,) for i in range(n)}
        return {
            **fused_norms,
            "fc.weight": (h, n * h),
            f"{m}input_layernorm.weight": (h,), f"{m}hidden_norm.weight": (h,),
            f"{m}post_attention_layernorm.weight": (h,),
            f"{m}self_attn.q_proj.weight": (self.num_heads * d, 2 * h),
            f"{m}self_attn.k_proj.weight": (self.num_kv_heads * d, 2 * h),
            f"{m}self_attn.v_proj.weight": (self.num_kv_heads * d, 2 * h),
            f"{m}self_attn.o_proj.weight": (h, self.num_heads * d),
            f"{m}mlp.gate_proj.weight": (self.intermediate_size, h),
            f"{m}mlp.up_proj.weight": (self.intermediate_size, h),
            f"{m}mlp.down_proj.weight": (h, self.intermediate_size),
            "norm.weight": (h,), "lm_head.weight": (self.draft_vocab_size, h),
            "d2t": (self.draft_vocab_size,),
        }  # fmt: skip


def default_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default target layers: a low, a middle and a high one, e.g. 30 -> (2, 15, 27)
    (vLLM's and the speculators package's default too)."""
    n = num_layers
    return (min(2, n), n // 2, max(n - 3, 0))
