"""ModelConfig parsing (both transformers config layouts) and RoPE inverse frequencies."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from torch.testing import assert_close
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from verispec.models.config import MODEL_TYPES, SUPPORTED_ARCHITECTURES, ModelConfig
from verispec.models.rope import inverse_frequencies

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def config(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **changes}


def as_transformers_4(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same config in the 4.x layout: rope_theta and rope_scaling at the top level."""
    old = copy.deepcopy(cfg)
    params = old.pop("rope_parameters")
    old["rope_theta"] = params.pop("rope_theta")
    old["rope_scaling"] = None if params["rope_type"] == "default" else params
    return old


def test_unsupported_architecture_is_named_with_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as error:
        ModelConfig.from_dict(config(architectures=["GPT2LMHeadModel"]))
    assert all(name in str(error.value) for name in SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("model_type", list(MODEL_TYPES))
def test_model_type_stands_in_for_missing_architectures(model_type: str) -> None:
    cfg = config(model_type=model_type)
    del cfg["architectures"]
    arch = MODEL_TYPES[model_type]
    assert ModelConfig.from_dict(cfg) == ModelConfig.from_dict(config(architectures=[arch]))


def test_unsupported_model_type_lists_the_supported_ones() -> None:
    cfg = config(model_type="gpt2")
    del cfg["architectures"]
    with pytest.raises(ValueError, match="model_type 'gpt2'") as error:
        ModelConfig.from_dict(cfg)
    assert all(name in str(error.value) for name in [*SUPPORTED_ARCHITECTURES, *MODEL_TYPES])


def test_tensor_shapes_follow_the_config() -> None:
    shapes = ModelConfig.from_dict(config(head_dim=32)).tensor_shapes()
    assert shapes["model.embed_tokens.weight"] == (320, 64)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (128, 64)  # 4 heads of 32
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (64, 64)  # 2 KV heads of 32
    assert shapes["model.layers.1.self_attn.o_proj.weight"] == (64, 128)
    assert shapes["model.layers.1.mlp.down_proj.weight"] == (64, 128)
    assert shapes["model.layers.1.self_attn.q_norm.weight"] == (32,)
    assert "model.layers.2.input_layernorm.weight" not in shapes  # 2 layers


def test_unsupported_rope_type_is_rejected() -> None:
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_dict(config(rope_parameters=rope))


def test_unreadable_config_file(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read model config"):
        ModelConfig.from_file(tmp_path / "config.json")


def test_both_transformers_layouts_parse_alike(family_checkpoint) -> None:
    new = json.loads((family_checkpoint[0] / "config.json").read_text())
    assert "rope_parameters" in new  # written by transformers 5
    assert ModelConfig.from_dict(as_transformers_4(new)) == ModelConfig.from_dict(new)


def test_legacy_rope_scaling_type_key() -> None:
    """Old 4.x checkpoints spell rope_type as "type"."""
    old = config(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
    new = config(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert ModelConfig.from_dict(old) == ModelConfig.from_dict(new)
    assert ModelConfig.from_dict(new).rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_family_traits(family_checkpoint) -> None:
    path, hf_model = family_checkpoint
    hf = hf_model.config
    cfg = ModelConfig.from_file(path / "config.json")
    assert cfg.architecture == type(hf_model).__name__
    assert cfg.qkv_bias == (hf.model_type == "qwen2")
    assert cfg.qk_norm == (hf.model_type == "qwen3")
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    window = hf.sliding_window if hf.model_type == "mistral" else None
    assert cfg.sliding_windows == [window] * hf.num_hidden_layers
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (0, [1])
    rope = dict(hf.rope_parameters)
    assert cfg.rope_theta == rope.pop("rope_theta")
    assert cfg.rope_scaling == (None if rope["rope_type"] == "default" else rope)


@pytest.mark.parametrize(
    ("extra", "windows"),
    [
        ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}, [8, None]),
        ({"use_sliding_window": False, "sliding_window": 8}, [None, None]),
        ({"sliding_window": 8}, [8, 8]),
        ({}, [None, None]),
    ],
)
def test_sliding_windows_per_layer(extra: dict[str, Any], windows: list[int | None]) -> None:
    assert ModelConfig.from_dict(config(**extra)).sliding_windows == windows


def test_eos_token_id_list() -> None:
    assert ModelConfig.from_dict(config(eos_token_id=[1, 7])).eos_token_ids == [1, 7]


def test_inverse_frequencies_docstring_example() -> None:
    assert_close(inverse_frequencies(4, 10000.0, None), torch.tensor([1.0, 0.01]))


def transformers_inv_freq(rope: dict[str, Any], head_dim: int) -> torch.Tensor:
    hf = LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim, rope_parameters=rope
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
    return inv_freq.float()


def ours(rope: dict[str, Any], head_dim: int) -> torch.Tensor:
    hidden = {"hidden_size": head_dim * 4, "num_attention_heads": 4, "head_dim": head_dim}
    cfg = ModelConfig.from_dict(config(rope_parameters=rope, **hidden))
    return inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


@pytest.mark.parametrize(
    ("head_dim", "theta", "factor", "original"),
    [(128, 500000.0, 8.0, 8192), (16, 10000.0, 8.0, 64), (64, 10000.0, 32.0, 512)],
)
def test_llama3_scaling_matches_transformers(head_dim, theta, factor, original) -> None:
    rope = {
        "rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": original,
    }  # fmt: skip
    got = ours(rope, head_dim)
    assert_close(got, transformers_inv_freq(rope, head_dim))
    plain = inverse_frequencies(head_dim, theta, None)
    # All three bands are present: kept (high), divided by factor (low), blended (middle).
    kept, divided = got == plain, torch.isclose(got, plain / factor)
    assert kept.any() and divided.any() and (~kept & ~divided).any()


def test_linear_scaling_matches_transformers() -> None:
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    assert_close(ours(rope, 32), transformers_inv_freq(rope, 32))
    assert_close(ours(rope, 32), inverse_frequencies(32, 10000.0, None) / 4.0)
