"""GGUF metadata cache: the first load of a GGUF file writes its small metadata under
cache_dir()/gguf/, so later loads read a saved tokenizer instead of rebuilding the tokenizer from
the file's vocabulary arrays (for a 49k-token vocabulary that is most of a load's time). The
weights are never cached: they are read from the GGUF file itself (gguf.GGUFWeights).

An entry holds config.json, TENSORS_FILE (each tensor's type, shape and byte range), the
tokenizer as transformers saves it (its tokenizer.json as BACKEND_FILE), generation_config.json (the
tokenizer's EOS id) and SOURCE_FILE; entries of CACHE_FORMAT 1 also held every weight as
float32 (model.safetensors, often gigabytes); the next entry written removes them.
Its name digests the GGUF's resolved path, size, mtime_ns and inode (not its
sha256: hashing a multi-gigabyte file would cost about what the cache saves) and the versions
of the converting libraries, so a rewritten file gets a new entry (and its old one is removed).
An entry appears complete or not at all: it is built in a temporary directory, then renamed
into place. When the cache cannot be written, or VERISPEC_NO_GGUF_CACHE=1, callers load from
the GGUF file directly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verispec.models.weights.gguf import describe
from verispec.models.weights.gguf_config import gguf_config_json, open_gguf
from verispec.paths import cache_dir

log = logging.getLogger("verispec")

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CACHE_FORMAT = 4
"""Part of every entry's name: bump it when what an entry holds changes."""
BACKEND_FILE = "backend_tokenizer.json"
"""The saved tokenizer.json, under a name transformers' from_pretrained does not look for:
given it, it parses the file three times and copies the backend although cached_tokenizer
hands it one (1.3 s of a 151k-token Qwen vocabulary's 2 s load)."""
CONVERTING_PACKAGES = ("gguf", "safetensors", "tokenizers", "transformers")
DISABLE_ENV = "VERISPEC_NO_GGUF_CACHE"
SOURCE_FILE = "verispec_source.json"
"""In each entry: the GGUF it came from, and the tokenizer flags transformers does not save."""
TENSORS_FILE = "gguf_tensors.json"
"""In each entry: the architecture and where each tensor lies in the file (gguf.describe)."""
TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token")
"""transformers leaves these out of tokenizer_config.json; passed again, they rebuild the
post-processor exactly as loading the GGUF did."""


def gguf_cache_root() -> Path:
    """Where entries live: <cache_dir()>/gguf."""
    return cache_dir() / "gguf"


def entry_name(path: Path) -> str:
    """<file stem>-<16 hex digits naming this version of the file and of the converters>,
    e.g. "SmolLM2-135M-Instruct.Q4_1-3f9c0e1a2b4d6e8f"."""
    resolved = path.resolve()
    stat = resolved.stat()
    facts = [CACHE_FORMAT, str(resolved), stat.st_size, stat.st_mtime_ns, stat.st_ino]
    facts += [f"{name}=={version(name)}" for name in CONVERTING_PACKAGES]
    return f"{resolved.stem}-{hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]}"


def cached_checkpoint(path: Path, progress: bool = False) -> Path | None:
    """The cache entry (a checkpoint directory) for GGUF file path, converted on first use;
    None when the cache is off or cannot be written. ValueError for a GGUF verispec cannot
    load (the same errors as reading it directly)."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None
    try:
        entry = gguf_cache_root() / entry_name(path)
    except OSError:  # the file is gone or unreadable: reading it directly says so
        return None
    if entry.is_dir():
        return entry
    remove_float32_entries(entry.parent)
    return write_entry(path, entry, progress)


def remove_float32_entries(root: Path) -> int:
    """Delete the entries an older verispec wrote with every weight in float32 (CACHE_FORMAT
    1's model.safetensors), which nothing reads any more; logs what was freed. Returns bytes."""
    freed = 0
    try:
        stale = [e for e in root.iterdir() if (e / "model.safetensors").is_file()]
    except OSError:
        return 0
    for entry in stale:
        size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
        aside = entry.with_name(f".{entry.name}.stale")
        try:
            os.replace(entry, aside)
        except OSError:
            continue
        shutil.rmtree(aside, ignore_errors=True)
        freed += size
    if freed:
        log.warning("removed %.1f GB of float32 weights that an older verispec cached in %s "
                    "(GGUF weights are now read from the file itself)", freed / 1e9,
                    root)  # fmt: skip
    return freed


def write_entry(path: Path, entry: Path, progress: bool = False) -> Path | None:
    """Convert GGUF file path into entry (built aside, then renamed in); None if the cache
    cannot be written. A concurrent writer's entry for the same file is kept as it is."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".partial",
                                        dir=entry.parent))  # fmt: skip
    except OSError:
        return None
    try:
        _convert(path, partial, progress)
        partial.chmod(0o755)  # mkdtemp makes it private; a cache entry is ordinary data
        os.replace(partial, entry)
    except OSError:
        if not entry.is_dir():  # unless another writer got there first: disk full, etc.
            return None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _remove_older_entries(entry)
    return entry


def cached_description(
    path: Path, progress: bool = False
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(config.json dict, gguf.describe) of GGUF file path from its cache entry (written on
    first use), or None when the cache is off or unusable: gguf.gguf_weights then parses the
    file's metadata itself."""
    entry = cached_checkpoint(path, progress)
    try:
        return (json.loads((entry / "config.json").read_text()),
                json.loads((entry / TENSORS_FILE).read_text())) if entry else None  # fmt: skip
    except (OSError, ValueError):
        return None


def gguf_tokenizer(path: Path, model_type: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer transformers builds from a GGUF file's metadata (seconds).

    Given the file's model_type (config.json's), the tokenizer class AutoTokenizer picks for
    it is used directly: AutoTokenizer would first parse the whole file again to learn it.
    """
    from transformers import AutoTokenizer

    try:
        if model_type is None:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        cls = _tokenizer_class(model_type)
        return cls.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load a tokenizer from {path}: {e}") from e


def cached_tokenizer(entry: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a cache entry, equal to gguf_tokenizer's for its GGUF: the same class,
    built around its tokenizer.json as saved (BACKEND_FILE). (AutoTokenizer would not do: the
    class it picks for some families, Qwen2Tokenizer, rebuilds its pre-tokenizer from the
    vocabulary on load.)"""
    from tokenizers import Tokenizer as Backend
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    try:
        flags = json.loads((entry / SOURCE_FILE).read_text())["tokenizer_flags"]
        name = json.loads((entry / "tokenizer_config.json").read_text())["tokenizer_class"]
        backend = Backend.from_file(str(entry / BACKEND_FILE))
        cls = tokenizer_class_from_name(name) or TokenizersBackend
        return cls.from_pretrained(str(entry), tokenizer_object=backend, **flags)
    except Exception as e:  # tokenizers raises a plain Exception for a broken BACKEND_FILE
        raise ValueError(f"cannot load a tokenizer from {entry}: {e}") from e


def _tokenizer_class(model_type: str) -> type[PreTrainedTokenizerBase]:
    """The class AutoTokenizer gives a GGUF of this model_type (its registered tokenizer, else
    TokenizersBackend; MistralCommonBackend only for Mistral's own files, never a GGUF's)."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    name = TOKENIZER_MAPPING_NAMES.get(model_type)
    cls = tokenizer_class_from_name(name) if name else None
    if cls is None or cls.__name__ == "MistralCommonBackend":
        return TokenizersBackend
    return cls


def _convert(path: Path, out: Path, progress: bool) -> None:
    """Write the checkpoint directory of GGUF file path into out (an empty directory)."""
    reader = open_gguf(path)
    config_json = gguf_config_json(reader, path)
    _write_json(out / TENSORS_FILE, describe(reader))
    del reader
    _write_json(out / "config.json", config_json)
    tokenizer = gguf_tokenizer(path, config_json["model_type"])
    tokenizer.save_pretrained(str(out))
    os.replace(out / "tokenizer.json", out / BACKEND_FILE)
    eos = tokenizer.eos_token_id
    _write_json(out / "generation_config.json", {
        "bos_token_id": config_json["bos_token_id"], "eos_token_id": [] if eos is None else [eos],
    })  # fmt: skip
    stat = path.stat()
    _write_json(out / SOURCE_FILE, {
        "gguf": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
        "tokenizer_flags": {k: tokenizer.init_kwargs[k] for k in TOKENIZER_FLAGS
                            if k in tokenizer.init_kwargs},
    })  # fmt: skip


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def _remove_older_entries(entry: Path) -> None:
    """Delete the other entries converted from entry's GGUF path (older versions of the file):
    each is first renamed aside, so no half-deleted directory keeps an entry's name."""
    source = _source_of(entry)
    if source is None:
        return
    for other in entry.parent.iterdir():
        if other == entry or other.name.startswith(".") or _source_of(other) != source:
            continue
        aside = other.with_name(f".{other.name}.stale")
        try:
            os.replace(other, aside)
        except OSError:  # another process removed it first
            continue
        shutil.rmtree(aside, ignore_errors=True)


def _source_of(entry: Path) -> str | None:
    """The GGUF path an entry was converted from; None if unreadable."""
    try:
        return str(json.loads((entry / SOURCE_FILE).read_text())["gguf"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
