"""GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them, from tiny
transformers models: the models tests read them, and the bench tests give them to llama.cpp."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN_TYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32}
"""Tensor types the writer stores as numpy values; every other type is quantized."""
WriteGGUF = Callable[..., dict[str, torch.Tensor]]


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: each head's two rotary halves interleaved row by row."""
    rest = weight.shape[1:]
    halves = weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *rest)
    return halves.swapaxes(1, 2).reshape(weight.shape)


def write_gguf_file(
    path: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    qtype: str = "F16",
    arch: str | None = None,
    tokenizer_metadata: bool = True,
) -> dict[str, torch.Tensor]:
    cfg = model.config
    family = "llama" if cfg.model_type == "mistral" else cfg.model_type  # as llama.cpp writes it
    writer = gguf.GGUFWriter(str(path), arch or family)
    writer.add_name(f"tiny-{cfg.model_type}")  # transformers spots Mistral by this name
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    if getattr(cfg, "head_dim", None):  # llama.cpp writes these only when config.json has it
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    if tokenizer_metadata:
        _add_tokenizer(writer, tokenizer)
    stored = _add_tensors(writer, model, qtype, family)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def _add_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerFast) -> None:
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_ids)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHATML)


def data_type(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name]


def _add_tensors(
    writer: gguf.GGUFWriter, model: PreTrainedModel, qtype: str, family: str
) -> dict[str, torch.Tensor]:
    cfg = model.config
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == family)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    permute = family == "llama"  # llama.cpp permutes q/k for llama (Mistral included) only
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    stored = {}
    for seed, (name, tensor) in enumerate(model.state_dict().items()):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for tied embeddings
        base, suffix = name.rsplit(".", 1)
        kind = qtype if tensor.dim() == 2 else "F32"
        values = tensor.float().numpy()
        if kind in PLAIN_TYPES:
            data = values.astype(PLAIN_TYPES[kind])
            stored[name] = torch.from_numpy(data.astype(np.float32))
        else:
            data = _quantized(values, kind, seed)
            stored[name] = torch.from_numpy(gguf.quants.dequantize(data, data_type(kind)))
        proj = base.rsplit(".", 1)[-1]
        if permute and proj in heads:
            data = llama_cpp_permute(data, heads[proj])
        raw = None if kind in PLAIN_TYPES else data_type(kind)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", data, raw_dtype=raw)
    return stored


# Byte offsets of the float16 scales in one block of the K-quants gguf cannot quantize to.
K_QUANT_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
K_QUANT_STD = 0.15
"""Standard deviation of the random K-quant weights: large enough for varied greedy text."""


def _quantized(values: np.ndarray, kind: str, seed: int) -> np.ndarray:
    """values [rows, cols] quantized to kind; for the K-quants, whose quantizers gguf lacks,
    random blocks (from seed) with their scales set for zero mean and K_QUANT_STD spread."""
    if kind not in K_QUANT_SCALES:
        return gguf.quants.quantize(values, data_type(kind))
    rows, cols = values.shape
    block_bytes = gguf.GGML_QUANT_SIZES[data_type(kind)][1]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, cols // 256, block_bytes), dtype=np.uint8)
    count = len(K_QUANT_SCALES[kind])
    parts = []  # the values with one scale (d or dmin) 1 and the others 0
    for i in range(count):
        _set_scales(blocks, kind, [float(j == i) for j in range(count)])
        parts.append(gguf.quants.dequantize(blocks.reshape(rows, -1), data_type(kind)))
    mix = [1.0] + [-parts[0].mean() / part.mean() for part in parts[1:]]
    spread = sum(m * part for m, part in zip(mix, parts, strict=True)).std()
    _set_scales(blocks, kind, [m * K_QUANT_STD / spread for m in mix])
    return blocks.reshape(rows, -1)


def _set_scales(blocks: np.ndarray, kind: str, scales: list[float]) -> None:
    for offset, scale in zip(K_QUANT_SCALES[kind], scales, strict=True):
        blocks[:, :, offset : offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
