"""Loading a Hugging Face checkpoint (local directory or hub id) into a LlamaModel."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from verispec.models.config import ModelConfig
from verispec.models.linear import Linear, LinearBackend, choose_backend
from verispec.models.llama import DecoderLayer, LlamaModel
from verispec.models.quantization import check_quantization

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def resolve_model_path(model: str | Path) -> Path:
    """A local checkpoint directory, or a hub id downloaded with huggingface_hub (online only)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model directory {path} has no config.json; expected a Hugging Face "
                "checkpoint (config.json, *.safetensors, tokenizer.json)"
            )
        return path
    text = str(model)
    looks_like_path = text.startswith((".", "/", "~")) or path.exists() or text.count("/") > 1
    if looks_like_path:
        raise ValueError(f"model directory {text!r} does not exist (or is not a directory)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=text, allow_patterns=HUB_FILES))
    except Exception as e:
        raise ValueError(
            f"model {text!r} is not a local directory and could not be fetched from the "
            f"Hugging Face hub ({type(e).__name__}: {e}). "
            "Pass a checkpoint directory, or go online."
        ) from e


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """ "auto" = float32 on the CPU (fast there), bfloat16 on an accelerator."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype}")
        return dtype
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    linear_backend: LinearBackend = "auto",
    progress: bool = False,
    batch_invariant: bool = False,
    quantization: str | None = None,
) -> LlamaModel:
    """Build a LlamaModel from a checkpoint directory's config.json and safetensors files.

    quantization (None, "fp16", "int8") rounds every linear layer's weight, the LM head
    included; the embedding table stays as stored.
    """
    config = ModelConfig.from_file(path / "config.json")
    check_quantization(quantization)
    backend = choose_backend(linear_backend, device, dtype)
    weights = _read_safetensors(path, dtype, device, progress)
    source = f"checkpoint {path}"
    return build_model(config, weights, backend, batch_invariant, quantization, source)


def build_model(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    backend: str,
    batch_invariant: bool = False,
    quantization: str | None = None,
    source: str = "checkpoint",
) -> LlamaModel:
    """A LlamaModel from Hugging Face tensor names -> tensors (consumed); backend as returned
    by choose_backend. source names the weights in error messages."""

    def linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        return Linear(weight, bias, backend, batch_invariant, quantization)

    def take(name: str) -> torch.Tensor:
        try:
            return weights.pop(name)
        except KeyError:
            raise ValueError(f"{source} lacks tensor {name!r}") from None

    def maybe(name: str) -> torch.Tensor | None:
        return weights.pop(name, None)

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        qkv_names = [f"{p}self_attn.{n}_proj" for n in "qkv"]
        qkv_w = torch.cat([take(n + ".weight") for n in qkv_names])
        qkv_b = torch.cat([take(n + ".bias") for n in qkv_names]) if config.qkv_bias else None
        gate_up = torch.cat([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")])
        layers.append(
            DecoderLayer(
                input_norm=take(f"{p}input_layernorm.weight"),
                qkv=linear(qkv_w, qkv_b),
                q_norm=maybe(f"{p}self_attn.q_norm.weight") if config.qk_norm else None,
                k_norm=maybe(f"{p}self_attn.k_norm.weight") if config.qk_norm else None,
                o=linear(take(f"{p}self_attn.o_proj.weight"), maybe(f"{p}self_attn.o_proj.bias")),
                post_norm=take(f"{p}post_attention_layernorm.weight"),
                gate_up=linear(gate_up, None),
                down=linear(take(f"{p}mlp.down_proj.weight"), None),
                window=config.sliding_windows[i] if config.sliding_windows else None,
            )
        )
    embed = take("model.embed_tokens.weight")
    head = maybe("lm_head.weight")
    if head is None:
        if not config.tie_word_embeddings:
            raise ValueError(f"{source} lacks tensor 'lm_head.weight'")
        head = embed
    final_norm = take("model.norm.weight")
    return LlamaModel(config, embed, layers, final_norm, linear(head, None), batch_invariant)


def _read_safetensors(
    path: Path, dtype: torch.dtype, device: torch.device, progress: bool
) -> dict[str, torch.Tensor]:
    """Every tensor of a single-file or sharded (model.safetensors.index.json) checkpoint."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in shard_names]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model directory {path} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    try:
        handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    except OSError as e:
        raise ValueError(f"cannot read weights in {path}: {e}") from e
    total = sum(len(h.keys()) for h in handles)
    with tqdm(total=total, desc=f"loading {path.name}", unit="tensor", disable=not progress,
              leave=False) as bar:  # fmt: skip
        for handle in handles:
            for name in handle.keys():
                weights[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
                bar.update()
    return weights
