"""Loading a Hugging Face checkpoint (local directory or hub id) into a LlamaModel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from verispec.models.catalog.default import shipped_head
from verispec.models.catalog.hub import named_model_path
from verispec.models.config import ModelConfig
from verispec.models.kernels.affine import AffineCodes
from verispec.models.kernels.backends import choose_backend, native_usable
from verispec.models.kernels.ffi import release_freed_memory
from verispec.models.kernels.linear import Linear, pack_together
from verispec.models.llama import DecoderLayer, LlamaModel
from verispec.models.weights.gguf import (
    BlockEmbedding,
    GGUFWeights,
    Weight,
    gguf_weights,
    is_gguf,
    read_gguf,
)
from verispec.models.weights.gguf_blocks import CODED_TYPES, stacked
from verispec.models.weights.gguf_cache import cached_description
from verispec.models.weights.gguf_config import open_gguf
from verispec.types.numerics import AUTO_NUMERICS, LinearBackend, check_compile, check_quantization

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


# Any one of these gives the vocabulary; transformers builds the tokenizer from it.
VOCABULARY_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))


def check_tokenizer_files(path: Path) -> None:
    """ValueError naming the missing files when a checkpoint directory has no tokenizer.

    Cheap (it only looks at file names), so a missing tokenizer is reported before the weights
    are read. A GGUF file carries its tokenizer in its metadata; gguf_config.py checks that.
    """
    if is_gguf(path):
        return
    if any(all((path / name).is_file() for name in files) for files in VOCABULARY_FILES):
        return
    first, *others = (" + ".join(files) for files in VOCABULARY_FILES)
    missing = f"{first} (or {', or '.join(others)})"
    if not (path / "tokenizer_config.json").is_file():
        missing += " and tokenizer_config.json"
    raise ValueError(f"model directory {path} has no tokenizer: missing {missing}")


def resolve_model_path(model: str | Path) -> Path:
    """The checkpoint to load: a Hugging Face directory, a .gguf file (or a directory holding
    exactly one and no config.json), a named model (models/catalog/hub.py: fetched once into the
    cache), or a hub id fetched with huggingface_hub (online only).

    Also checks that a directory has tokenizer files, so a missing tokenizer is reported before
    gigabytes of weights are read.
    """
    text = str(model)
    if not text:
        raise ValueError("model must be a path or a name, got an empty string")
    path = Path(text).expanduser()
    if path.is_file():
        if not is_gguf(path):
            raise ValueError(
                f"model file {path} is not a .gguf file; pass a checkpoint directory "
                "(config.json, *.safetensors, tokenizer.json) or a .gguf file"
            )
        return path
    if path.is_dir():
        return _checkpoint_in(path)
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or is_gguf(path)
    if looks_like_path:
        raise ValueError(f"model path {text!r} does not exist")
    named = named_model_path(text)  # a verispec name (fetched once into the cache)
    if named is not None:
        return named if named.is_file() else _checkpoint_in(named)
    return _checkpoint_in(_download(text))


def resolve_head_path(head: str | Path) -> Path:
    """A drafter head's directory (config.json and *.safetensors, no tokenizer of its own):
    a local directory, a named head shipped with verispec (models/catalog/hub.py), or a hub id."""
    text = str(head)
    if not text:
        raise ValueError("a drafter head must be a directory or a name, got an empty string")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"drafter head directory {path} has no config.json")
        return path
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise ValueError(f"drafter head {text!r} is not a directory (config.json + safetensors)")
    shipped = shipped_head(text)
    if shipped is not None:
        return shipped[0]
    named = named_model_path(text)
    return named if named is not None else _download(text)


def _checkpoint_in(path: Path) -> Path:
    """path if it is a Hugging Face checkpoint directory, else its only .gguf file."""
    if (path / "config.json").is_file():
        check_tokenizer_files(path)
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        names = ", ".join(f.name for f in ggufs)
        raise ValueError(f"model directory {path} holds several .gguf files ({names}); pass one")
    raise ValueError(
        f"model directory {path} has no config.json and no .gguf file; expected a Hugging Face "
        "checkpoint (config.json, *.safetensors, tokenizer.json) or a .gguf file"
    )


def _download(repo_id: str) -> Path:
    """A hub checkpoint's local snapshot; a one-line ValueError when it cannot be fetched."""
    from huggingface_hub import errors, snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=HUB_FILES))
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
        reason = "nor a model on the Hugging Face hub (or it is private or gated)"
    except errors.HFValidationError:
        reason = "nor a valid Hugging Face model id"
    except Exception as e:  # offline, DNS, proxy, timeouts: the hub client raises many kinds
        reason = (
            f"and the Hugging Face hub could not be reached to fetch it "
            f"({type(e).__name__}; offline?)"
        )
    raise ValueError(
        f"model {repo_id!r} is not a local file or directory, {reason}; pass the path of a "
        "checkpoint directory or of a .gguf file"
    )


def resolve_device(device: str) -> torch.device:
    """ "auto" = the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {device!r}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is available")
    return resolved


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


def resolve_quantization(
    requested: str | None, path: Path, device: torch.device, dtype: torch.dtype,
    linear_backend: LinearBackend = "auto", compile: bool = False,
) -> str | None:  # fmt: skip
    """The numerics a model runs with: `requested`, or for AUTO_NUMERICS "a8" where a GGUF file's
    linear weights are quantized blocks (CODED_TYPES) that the native kernel computes here (a
    float32 CPU model, backend "auto" or "native", not compiled), else None (exact float
    inputs). Example: SmolLM2's Q4_1 file on a CPU -> "a8"; a safetensors checkpoint, an F16
    GGUF file, or the Q4_1 file on a GPU -> None."""
    if requested != AUTO_NUMERICS:
        return requested
    if not is_gguf(path) or device.type != "cpu" or dtype != torch.float32 or compile:
        return None
    if linear_backend not in ("auto", "native") or not native_usable():
        return None
    described = cached_description(path)
    if described is None:
        reader = open_gguf(path)
        kinds = {int(t.tensor_type) for t in reader.tensors}
        del reader
    else:
        kinds = {int(t["kind"]) for t in described[1]["tensors"]}
    return "a8" if kinds & {int(t) for t in CODED_TYPES} else None


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    linear_backend: LinearBackend = "auto",
    progress: bool = False,
    batch_invariant: bool = False,
    quantization: str | None = None,
    compile: bool = False,
    vocab_ids: torch.Tensor | None = None,
) -> LlamaModel:
    """Build a LlamaModel from a checkpoint directory's config.json and safetensors files, or
    from a GGUF file, read one tensor at a time from the file itself: on a float32 CPU model its
    quantized blocks go straight into the native kernel's codes (gguf.gguf_weights), elsewhere
    they are dequantized, then cast to dtype like safetensors weights.

    quantization (None, "fp16", "int8", "q8_0", ...) rounds every linear layer's weight, the LM
    head included; the embedding table stays as stored; "auto" is resolve_quantization's.
    compile runs the decoder stack through torch.compile (models/kernels/compiled.py).
    vocab_ids: keep only these rows of the LM head (build_model).
    """
    check_quantization(quantization, extra=(AUTO_NUMERICS,))
    check_compile(compile, batch_invariant)
    quantization = resolve_quantization(quantization, path, device, dtype, linear_backend, compile)
    backend = choose_backend(linear_backend, device, dtype, compile)
    weights: GGUFWeights | dict[str, torch.Tensor]
    if is_gguf(path) and device.type == "cpu" and dtype == torch.float32:
        config, weights = gguf_weights(path, progress, cached_description(path, progress))
        source = f"GGUF file {path}"
    elif is_gguf(path):  # other devices and dtypes compute with the float values, cast
        config, weights = read_gguf(path, dtype, device, progress)
        source = f"GGUF file {path}"
    else:
        config = ModelConfig.from_file(path / "config.json")
        weights = _read_safetensors(path, dtype, device, progress)
        source = f"checkpoint {path}"
    model = build_model(config, weights, backend, batch_invariant, quantization, source,
                        vocab_ids)  # fmt: skip
    if compile:
        model.compile()
    return model


def build_model(
    config: ModelConfig,
    weights: GGUFWeights | dict[str, torch.Tensor] | dict[str, Weight],
    backend: str,
    batch_invariant: bool = False,
    quantization: str | None = None,
    source: str = "checkpoint",
    vocab_ids: torch.Tensor | None = None,
) -> LlamaModel:
    """A LlamaModel from Hugging Face tensor names -> weights (consumed: float tensors, or a
    GGUF file's codes and embedding blocks); backend as returned by choose_backend. Every
    weight's shape is checked against the config here, at load time. source names the weights
    in error messages. vocab_ids [N] (ascending token ids): the LM head keeps those rows only,
    cut before it is packed (a draft's reduced vocabulary: logits [n, N], LlamaModel.vocab_ids);
    a tied embedding table stays whole."""
    shapes = config.tensor_shapes()

    def linear(weight: Weight, bias: torch.Tensor | None) -> Linear:
        return Linear(weight, bias, backend, batch_invariant, quantization)

    def take(name: str) -> Any:
        tensor = maybe(name)
        if tensor is None:
            raise ValueError(f"{source} lacks tensor {name!r}")
        return tensor

    def maybe(name: str) -> Any:
        tensor = weights.pop(name, None)
        shape = None if tensor is None else weight_shape(tensor)
        if shape is not None and shape != shapes[name]:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {list(shape)}, but the config "
                f"implies {list(shapes[name])}"
            )
        return tensor

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        qkv_names = [f"{p}self_attn.{n}_proj" for n in "qkv"]
        qkv_w = stacked([take(n + ".weight") for n in qkv_names])
        qkv_b = torch.cat([take(n + ".bias") for n in qkv_names]) if config.qkv_bias else None
        gate_up = stacked([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")])
        layers.append(
            DecoderLayer(
                input_norm=take(f"{p}input_layernorm.weight"),
                qkv=linear(qkv_w, qkv_b),
                q_norm=take(f"{p}self_attn.q_norm.weight") if config.qk_norm else None,
                k_norm=take(f"{p}self_attn.k_norm.weight") if config.qk_norm else None,
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
    if vocab_ids is not None:
        check_vocab_ids(vocab_ids, config.vocab_size, source)
        head = head_rows(head, vocab_ids)
        vocab_ids = vocab_ids.to(embed.device, torch.int64).contiguous()
    elif isinstance(head, BlockEmbedding):
        head = head.codes()
    final_norm = take("model.norm.weight")
    lm_head = linear(head, None)
    pack_together([lin for la in layers for lin in (la.qkv, la.o, la.gate_up, la.down)] + [lm_head])
    release_freed_memory()
    return LlamaModel(config, embed, layers, final_norm, lm_head, batch_invariant, vocab_ids)


def head_rows(weight: Weight, ids: torch.Tensor) -> torch.Tensor | AffineCodes:
    """Rows ids [N] of an LM head's weight, in the form it packs from: float rows, or the
    codes of those rows only (a GGUF file's, or its embedding table's blocks decoded row by
    row), so the packed head never holds the other rows."""
    if isinstance(weight, AffineCodes):
        return weight.rows(ids.cpu())
    if isinstance(weight, BlockEmbedding):
        return weight.codes(ids)
    return weight.index_select(0, ids.to(weight.device))


def check_vocab_ids(ids: torch.Tensor, vocab_size: int, source: str) -> None:
    """A reduced vocabulary's ids: a non-empty 1-D integer tensor, strictly ascending (so the
    first largest logit is the lowest id, as over the whole vocabulary), within the vocabulary."""
    valid = (
        ids.dim() == 1 and len(ids) > 0 and ids.dtype in (torch.int32, torch.int64)
        and int(ids[0]) >= 0 and int(ids[-1]) < vocab_size and bool((ids.diff() > 0).all())
    )  # fmt: skip
    if not valid:
        raise ValueError(f"{source}: the LM head's vocabulary ids must be distinct token ids in "
                         f"ascending order within [0, {vocab_size}), got {ids!r}")  # fmt: skip


def weight_shape(weight: Weight) -> tuple[int, ...]:
    """[out, in] of a weight in any of the forms a checkpoint loads as."""
    if isinstance(weight, AffineCodes):
        return tuple(weight.codes.shape)
    return tuple(weight.shape)


def _read_safetensors(
    path: Path, dtype: torch.dtype, device: torch.device, progress: bool
) -> dict[str, torch.Tensor]:
    """Every tensor of a single-file or sharded (model.safetensors.index.json) checkpoint."""
    files = _safetensors_files(path)
    weights: dict[str, torch.Tensor] = {}
    handles = []
    for file in files:
        try:
            handles.append((file, safe_open(str(file), framework="pt", device="cpu")))
        except (OSError, SafetensorError) as e:
            raise ValueError(f"checkpoint file {file} is corrupt or truncated ({e})") from e
    total = sum(len(h.keys()) for _, h in handles)
    with tqdm(total=total, desc=f"loading {path.name}", unit="tensor", disable=not progress,
              leave=False) as bar:  # fmt: skip
        for file, handle in handles:
            for name in handle.keys():
                try:
                    tensor = handle.get_tensor(name)
                except (OSError, SafetensorError) as e:
                    raise ValueError(f"checkpoint file {file} is corrupt or truncated ({e})") from e
                weights[name] = tensor.to(device=device, dtype=dtype)
                bar.update()
    return weights


def _safetensors_files(path: Path) -> list[Path]:
    """The shards model.safetensors.index.json lists, else every *.safetensors file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shard_names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"checkpoint index {index} is not valid: expected JSON with a "
                f'"weight_map" of tensor name -> shard file ({type(e).__name__}: {e})'
            ) from e
        files = [path / n for n in shard_names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"checkpoint index {index} lists missing shards: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model directory {path} has no *.safetensors weights")
    return files
