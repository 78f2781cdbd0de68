"""GGUF checkpoints (llama.cpp's single-file format): a ModelConfig from the metadata, and the
weights under Hugging Face tensor names for loader.build_model: quantized blocks as the affine
codes they store (gguf_blocks.py, read one tensor at a time from the memory-mapped file, never
a float32 model), the embedding table as rows dequantized on lookup, everything else float32.
gguf_config.py reads the metadata into a config."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize
from tqdm import tqdm

from verispec.models.config import ModelConfig
from verispec.models.kernels.affine import AffineCodes
from verispec.models.kernels.ffi import madvise
from verispec.models.weights.gguf_blocks import CODED_TYPES, block_codes, permuted_rows
from verispec.models.weights.gguf_config import gguf_config_json, open_gguf

log = logging.getLogger("verispec")

PERMUTED_ARCHITECTURES = ("llama", "mistral")
"""llama.cpp's converter reorders these families' q/k rows for its rotary kernel."""

# GGUF tensor name (without blk.N. and .weight/.bias) -> Hugging Face name.
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
MODEL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def is_gguf(path: Path) -> bool:
    """Whether path names a GGUF file (a .gguf suffix) rather than a checkpoint directory."""
    return path.suffix.lower() == ".gguf" and not path.is_dir()


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where one tensor lies in a GGUF file: its llama.cpp name, GGML type, GGUF shape
    (innermost dimension first, as the file lists it) and byte range."""

    name: str
    kind: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def describe(reader: GGUFReader) -> dict[str, Any]:
    """What gguf_weights needs of a file besides its config, small enough to cache: the
    architecture and every tensor's TensorInfo (as JSON-ready dicts)."""
    return {
        "architecture": str(reader.fields["general.architecture"].contents()),
        "tensors": [asdict(TensorInfo(t.name, int(t.tensor_type), tuple(int(n) for n in t.shape),
                                      int(t.data_offset), int(t.n_bytes)))
                    for t in reader.tensors],
    }  # fmt: skip


def gguf_weights(
    path: Path, progress: bool = False, cached: tuple[dict[str, Any], dict[str, Any]] | None = None
) -> tuple[ModelConfig, GGUFWeights]:
    """The config and the file's weights, read on demand (GGUFWeights). cached: the file's
    config.json dict and `describe` from the metadata cache, which spares parsing the file's
    metadata (its vocabulary arrays are most of that). Every check runs before this returns
    (ValueError), with a warning naming quantized types that have no native kernel (they
    load as float32)."""
    if cached is None:
        reader = open_gguf(path)
        config_json, described = gguf_config_json(reader, path), describe(reader)
        del reader
    else:
        config_json, described = cached
    config = ModelConfig.from_dict(config_json)
    infos = [TensorInfo(**{**t, "shape": tuple(t["shape"])}) for t in described["tensors"]]
    _check_types({GGMLQuantizationType(t.kind): t.name for t in reversed(infos)}, path)
    slow = sorted({GGMLQuantizationType(t.kind).name for t in infos
                   if t.kind not in (*CODED_TYPES, *FLOAT_TYPES)})  # fmt: skip
    if slow:
        log.warning("GGUF file %s: tensor types %s have no native kernel; they load as float32 "
                    "(4 bytes a weight)", path, ", ".join(slow))  # fmt: skip
    permuted = described["architecture"] in PERMUTED_ARCHITECTURES
    return config, GGUFWeights(infos, permuted, config, path, progress)


FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


class GGUFWeights:
    """A GGUF file's tensors by Hugging Face name, each read from the memory-mapped file when
    popped: quantized types the native kernel computes (gguf_blocks.CODED_TYPES) as affine
    codes decoded from their blocks, the token embedding as a BlockEmbedding over the file,
    others dequantized to float32; q/k rows back in Hugging Face order. Popping in any order
    keeps one tensor's decoding in memory at a time; each read tensor's pages are released."""

    def __init__(self, infos: list[TensorInfo], permuted: bool, config: ModelConfig, path: Path,
                 progress: bool) -> None:  # fmt: skip
        self.path = path
        self.tensors = {hf_tensor_name(t.name, path): t for t in infos}
        self.file = np.memmap(path, dtype=np.uint8, mode="r")
        self.permuted = permuted
        self.rotary_heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
        self.bar = tqdm(total=len(self.tensors), desc=f"reading {path.name}", unit="tensor",
                        disable=not progress, leave=False)  # fmt: skip

    def pop(self, name: str, default: None = None) -> Weight | None:
        """The weight called name, read now and forgotten here; default when there is none."""
        info = self.tensors.pop(name, None)
        if info is None:
            return default
        self.bar.update()
        kind = GGMLQuantizationType(info.kind)
        part = info.name.split(".")[-2]  # "blk.0.attn_q.weight" -> "attn_q"
        permute = self.permuted and part in self.rotary_heads
        rows = info.shape[1] if len(info.shape) == 2 else 0
        columns = info.shape[0]
        if info.offset + info.nbytes > len(self.file):
            raise ValueError(f"GGUF file {self.path} is truncated: tensor {info.name!r} ends "
                             "past the end of the file")  # fmt: skip
        raw = self.file[info.offset : info.offset + info.nbytes]
        if not self.tensors:  # the last one: the mapping goes once its views are gone
            self.bar.close()
            self.file = np.empty(0, dtype=np.uint8)
        if name == "model.embed_tokens.weight" and kind in CODED_TYPES:
            return BlockEmbedding(self.path, info.offset, kind, rows, columns)
        if rows and kind in CODED_TYPES:
            codes = block_codes(raw.reshape(rows, -1), kind, rows, columns)
            _release(raw)
            if permute:
                order = unpermute_rotary_rows(torch.arange(rows), self.rotary_heads[part])
                codes = permuted_rows(codes, order)
            return codes
        values = dequantize(raw.reshape(max(rows, 1), -1), kind)
        values = torch.from_numpy(np.array(values, dtype=np.float32))  # a copy: never the file
        values = values.reshape(tuple(reversed(info.shape)))
        return unpermute_rotary_rows(values, self.rotary_heads[part]) if permute else values


class BlockEmbedding:
    """An embedding table left in the GGUF file as its blocks: looked-up rows are dequantized
    (gguf's own dequantization, so the same values as a float32 table) from a read-only mapping
    of the table's bytes alone. A table of a 150k-token vocabulary stays on disk instead of
    taking gigabytes of float32."""

    def __init__(self, path: Path, offset: int, kind: GGMLQuantizationType, rows: int,
                 columns: int) -> None:  # fmt: skip
        block, size = GGML_QUANT_SIZES[kind]
        self.kind = kind
        self.shape = torch.Size((rows, columns))
        self.dtype = torch.float32
        self.device = torch.device("cpu")
        self.blocks = np.memmap(path, dtype=np.uint8, mode="r", offset=offset,
                                shape=(rows, columns // block * size))  # fmt: skip

    def index_select(self, dim: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows ids [T] -> [T, columns] float32."""
        assert dim == 0, "an embedding table is indexed by rows"
        rows = self.blocks[ids.cpu().numpy()]
        values = dequantize(rows, self.kind).reshape(len(rows), self.shape[1])
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        return self.index_select(0, ids.reshape(-1)).view(*ids.shape, self.shape[1])

    def codes(self, rows: torch.Tensor | None = None) -> AffineCodes:
        """The table's affine codes (an LM head tied to it packs these): of rows [R] only
        when given (a head over a reduced vocabulary decodes only its own rows)."""
        blocks = np.asarray(self.blocks) if rows is None else self.blocks[rows.cpu().numpy()]
        return block_codes(blocks, self.kind, len(blocks), self.shape[1])

    def is_contiguous(self) -> bool:
        """False: there is no float32 table to point native code at."""
        return False

    def float(self) -> torch.Tensor:
        """The whole table as float32 (for training a head on this model)."""
        return self.index_select(0, torch.arange(self.shape[0]))

    def dim(self) -> int:
        return 2


Weight = torch.Tensor | AffineCodes | BlockEmbedding
"""What a GGUF tensor loads as: float32 values, affine codes, or the embedding table's blocks."""

MADV_DONTNEED = 4  # Linux


def _release(data: np.ndarray) -> None:
    """Drop the whole pages of a read tensor's mapped bytes from this process (they stay in the
    page cache), so loading a file never holds it all resident beside its packed copy."""
    page = 4096
    start = -(-data.ctypes.data // page) * page
    end = (data.ctypes.data + data.nbytes) // page * page
    if end > start:
        madvise(start, end - start, MADV_DONTNEED)


def read_gguf(
    path: Path, dtype: torch.dtype, device: torch.device, progress: bool = False
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The config and every weight (Hugging Face names, dequantized, then cast to dtype) of a
    GGUF file; ValueError for an unreadable file, architecture, tensor type or tokenizer."""
    config_json, tensors = gguf_checkpoint(path, progress)
    weights = {name: values.to(device=device, dtype=dtype) for name, values in tensors}
    return ModelConfig.from_dict(config_json), weights


def gguf_checkpoint(
    path: Path, progress: bool = False
) -> tuple[dict[str, Any], Iterator[tuple[str, torch.Tensor]]]:
    """A GGUF file as a Hugging Face checkpoint: its config.json dict, and its weights as a lazy
    stream of (Hugging Face name, float32 tensor), dequantized one at a time so a caller can
    cast or save each before the next. Every check runs before this returns (ValueError)."""
    reader = open_gguf(path)
    config_json = gguf_config_json(reader, path)
    config = ModelConfig.from_dict(config_json)
    check_tensor_types(reader, path)
    names = [hf_tensor_name(t.name, path) for t in reader.tensors]  # all known before any work
    return config_json, _float32_tensors(reader, names, config, path, progress)


def _float32_tensors(
    reader: GGUFReader, names: list[str], config: ModelConfig, path: Path, progress: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, values) per tensor: dequantized, q/k rows back in Hugging Face order."""
    permuted = reader.fields["general.architecture"].contents() in PERMUTED_ARCHITECTURES
    rotary_heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    for name, tensor in tqdm(zip(names, reader.tensors, strict=True), total=len(names),
                             desc=f"dequantizing {path.name}", unit="tensor",
                             disable=not progress, leave=False):  # fmt: skip
        values = dequantized(tensor)
        kind = tensor.name.split(".")[-2]  # "blk.0.attn_q.weight" -> "attn_q"
        if permuted and kind in rotary_heads:
            values = unpermute_rotary_rows(values, rotary_heads[kind])
        yield name, values


def check_tensor_types(reader: GGUFReader, path: Path) -> None:
    """ValueError naming a tensor whose type gguf cannot dequantize, before any is."""
    _check_types({t.tensor_type: t.name for t in reversed(reader.tensors)}, path)


def _check_types(first_of_type: dict[GGMLQuantizationType, str], path: Path) -> None:
    for kind, name in first_of_type.items():
        if not _dequantizable(kind):
            supported = [t.name for t in GGML_QUANT_SIZES if _dequantizable(t)]
            raise ValueError(
                f"GGUF file {path}: tensor {name!r} has type {kind.name}, which cannot be "
                f"dequantized; supported types: {', '.join(supported)}"
            )


def hf_tensor_name(gguf_name: str, path: Path) -> str:
    """The Hugging Face name of a llama.cpp tensor.

    >>> hf_tensor_name("blk.3.attn_q.bias", Path("m.gguf"))
    'model.layers.3.self_attn.q_proj.bias'
    """
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in MODEL_TENSORS:
        return f"{MODEL_TENSORS[parts[0]]}.{parts[1]}"
    raise ValueError(f"GGUF file {path} has tensor {gguf_name!r}, which verispec cannot place")


def unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: within each head it interleaves the two rotary halves
    (a0 b0 a1 b1 ...), where Hugging Face keeps them apart (a0 a1 ... b0 b1 ...).

    >>> unpermute_rotary_rows(torch.tensor([10, 12, 11, 13]), num_heads=1).tolist()
    [10, 11, 12, 13]
    """
    rest = weight.shape[1:]  # [in] for a weight, () for a bias
    return weight.reshape(num_heads, -1, 2, *rest).transpose(1, 2).reshape(weight.shape)


def dequantized(tensor: ReaderTensor) -> torch.Tensor:
    """float32 values of one tensor, in torch's (row-major, reversed GGUF) shape."""
    values = dequantize(tensor.data, tensor.tensor_type)
    if not values.flags.writeable:  # F32 comes back as a view of the read-only file
        values = values.copy()
    shape = tuple(int(n) for n in reversed(tensor.shape))  # e.g. [out, in]
    return torch.from_numpy(values.reshape(shape))


def _dequantizable(kind: GGMLQuantizationType) -> bool:
    """Whether gguf.quants dequantizes this type (tried on one all-zero block)."""
    block_bytes = GGML_QUANT_SIZES[kind][1]
    try:
        dequantize(np.zeros((1, block_bytes), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True
