"""A GGUF file's metadata as a Hugging Face config.json dict (`gguf_config_json`): llama.cpp's
{arch}.* keys mapped to config fields, with the architectures, tokenizer keys and RoPE scaling
verispec can load checked first (ValueError otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType

from verispec.models.config import MODEL_TYPES

# general.architecture values we load; llama.cpp writes Mistral checkpoints as "llama".
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

def open_gguf(path: Path) -> GGUFReader:
    """A reader over the file (memory-mapped: nothing is dequantized yet)."""
    try:
        return GGUFReader(path)
    except (OSError, ValueError, IndexError, KeyError) as e:
        raise ValueError(f"GGUF file {path} is truncated or not a GGUF file ({e})") from e


def gguf_config_json(reader: GGUFReader, path: Path) -> dict[str, Any]:
    """The config.json dict (architectures included) that llama.cpp's metadata keys
    ({arch}.block_count, ...) describe; ModelConfig.from_dict parses it like any checkpoint's."""
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF file {path} has unsupported architecture {arch!r}; "
            f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    _check_tokenizer_metadata(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise ValueError(
            f"GGUF file {path} has per-dimension RoPE frequency factors (rope_freqs.weight, "
            "written for Llama 3.1-style rope scaling), which verispec does not support"
        )
    if "token_embd.weight" not in tensors:
        raise ValueError(f"GGUF file {path} lacks tensor 'token_embd.weight'")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF file {path} lacks metadata key {arch}.{name!r}")
        if isinstance(value, list):
            raise ValueError(f"GGUF file {path}: per-layer {arch}.{name} is not supported")
        return value

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    is_mistral = arch == "llama" and "mistral" in str(meta.get("general.name", "")).lower()
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    model_type = "mistral" if is_mistral else arch
    return {
        "architectures": [MODEL_TYPES[model_type]],
        "model_type": model_type,
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),  # GGUF shapes are reversed
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length", hidden // heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": key("context_length", 2048),
        "rope_theta": key("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(meta, arch),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "sliding_window": meta.get(f"{arch}.attention.sliding_window"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(i for i in eos if i is not None)),
    }  # fmt: skip


def _metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every metadata value but the tokenizer's arrays (vocabulary, merges: slow to unpack)."""
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if not (name.startswith("tokenizer.") and field.types[:1] == [GGUFValueType.ARRAY])
    }


def _check_tokenizer_metadata(reader: GGUFReader, path: Path) -> None:
    missing = [
        k for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens") if k not in reader.fields
    ]
    if missing:
        raise ValueError(f"GGUF file {path} has no tokenizer: missing {', '.join(missing)}")


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict[str, Any] | None:
    """config.json's rope_scaling from {arch}.rope.scaling.* (none, linear; others rejected)."""
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    return {"rope_type": kind, "factor": meta.get(f"{arch}.rope.scaling.factor", 1.0)}
