"""The GGUF metadata cache: it holds the config and tokenizer, never weights (an older
verispec's float32 entries are removed); a load through it equals a direct load from the GGUF
file, later loads never rebuild the tokenizer, entries appear whole or not at all, a rewritten
file gets a fresh entry, and an unusable cache falls back to the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from transformers import PreTrainedModel

from tests.helpers.checkpoints import CORPUS, make_checkpoint
from tests.helpers.harness import Runner, random_ids
from verispec.models.config import ModelConfig
from verispec.models.llama import LlamaModel
from verispec.models.weights import gguf_cache
from verispec.models.weights.gguf import read_gguf
from verispec.models.weights.gguf_cache import cached_checkpoint, gguf_cache_root, write_entry
from verispec.models.weights.loader import load_model
from verispec.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
TEXTS = [*CORPUS[:3], "<s>hi</s><pad> there", "<|im_start|>user\nhi<|im_end|>\n", ""]
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty verispec cache (the user's is never touched), with the GGUF cache on."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gguf_cache.DISABLE_ENV, raising=False)
    return tmp_path / "cache"


def write_family_gguf(
    root: Path, family: str, tokenizer, write_gguf, seed: int = 0
) -> tuple[Path, PreTrainedModel]:
    source = make_checkpoint(root / f"hf-{family}-{seed}", family, tokenizer, seed=seed)
    path = root / f"{family}.gguf"
    write_gguf(path, source, tokenizer, "Q8_0")
    return path, source


def direct(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LlamaModel, Tokenizer]:
    """Model and tokenizer read from the GGUF file itself, as before the cache existed."""
    with monkeypatch.context() as m:
        m.setenv(gguf_cache.DISABLE_ENV, "1")
        return load_model(path, torch.float32, CPU, "torch"), Tokenizer(path)


def refuse(*args: object) -> NoReturn:
    """Stands in for what parses a GGUF file, where the cache entry must serve instead."""
    raise AssertionError("the GGUF file was parsed again")


def entries(cache: Path) -> list[str]:
    """Every name under the GGUF cache root, temporary ones included."""
    root = cache / "gguf"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def assert_same_logits(a: LlamaModel, b: LlamaModel) -> None:
    ids = random_ids(12, a.config.vocab_size, seed=3)
    assert torch.equal(Runner(a).prefill(ids, 12), Runner(b).prefill(ids, 12))  # [T, vocab]


def assert_same_tokenizer(a: Tokenizer, b: Tokenizer) -> None:
    assert type(a.hf) is type(b.hf)
    assert a.hf.backend_tokenizer.to_str() == b.hf.backend_tokenizer.to_str()
    for text in TEXTS:
        assert a.encode(text) == b.encode(text)
        assert (
            a.hf(text, add_special_tokens=False).input_ids
            == b.hf(text, add_special_tokens=False).input_ids
        )
        assert a.decode(a.encode(text)) == b.decode(a.encode(text))
    assert a.chat_template == b.chat_template
    assert a.hf.apply_chat_template(MESSAGES, tokenize=False) == b.hf.apply_chat_template(
        MESSAGES, tokenize=False
    )
    assert a.eos_token_ids == b.eos_token_ids
    assert (a.hf.bos_token_id, a.hf.pad_token_id, a.hf.add_bos_token, a.vocab_size) == (
        b.hf.bos_token_id, b.hf.pad_token_id, b.hf.add_bos_token, b.vocab_size,
    )  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_load_equals_direct_load(
    family, cache, tmp_path, monkeypatch, tokenizer, write_gguf
) -> None:
    path, _ = write_family_gguf(tmp_path, family, tokenizer, write_gguf)
    model, tok = direct(path, monkeypatch)
    assert entries(cache) == []
    first = load_model(path, torch.float32, CPU, "torch")  # converts
    Tokenizer(path)  # writes the entry
    [name] = entries(cache)
    entry = cache / "gguf" / name
    config, _ = read_gguf(path, torch.float32, CPU)
    assert not list(entry.glob("*.safetensors")), "weights are never cached"
    assert ModelConfig.from_file(entry / "config.json") == config == first.config
    later = load_model(path, torch.float32, CPU, "torch")  # reads the entry
    assert_same_logits(first, model)
    assert_same_logits(later, model)
    assert_same_tokenizer(Tokenizer(path), tok)
    assert entries(cache) == [name]


def test_later_loads_never_rebuild_the_tokenizer(
    cache, tmp_path, monkeypatch, tokenizer, write_gguf
) -> None:
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    Tokenizer(path)
    monkeypatch.setattr(gguf_cache, "gguf_tokenizer", refuse)
    monkeypatch.setattr("verispec.tokenizer.gguf_tokenizer", refuse)
    assert load_model(path, torch.bfloat16, CPU).dtype == torch.bfloat16
    assert Tokenizer(path).eos_token_ids == [1]


def test_tokenizer_first_converts_for_the_model_too(
    cache, tmp_path, monkeypatch, tokenizer, write_gguf
) -> None:
    path, _ = write_family_gguf(tmp_path, "qwen2", tokenizer, write_gguf)
    model, tok = direct(path, monkeypatch)
    assert_same_tokenizer(Tokenizer(path), tok)  # a draft model loads its tokenizer first
    assert_same_logits(load_model(path, torch.float32, CPU, "torch"), model)


def test_a_failed_write_leaves_no_entry(cache, tmp_path, monkeypatch, tokenizer, write_gguf):
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    model, _ = direct(path, monkeypatch)

    def disk_full(target: Path, value: dict) -> None:
        target.write_text("{half a fi")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(gguf_cache, "_write_json", disk_full)
        assert Tokenizer(path).encode("hi") == direct(path, monkeypatch)[1].encode("hi")
    assert entries(cache) == []  # neither an entry nor its temporary directory
    assert_same_logits(load_model(path, torch.float32, CPU, "torch"), model)
    Tokenizer(path)
    assert len(entries(cache)) == 1  # the next load writes it


def test_a_bad_gguf_raises_and_leaves_nothing(cache, tmp_path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ValueError, match=rf"GGUF file {path} is truncated or not a GGUF file"):
        load_model(path, torch.float32, CPU)
    assert entries(cache) == []


def test_a_concurrent_writer_keeps_its_entry(cache, tmp_path, monkeypatch, tokenizer, write_gguf):
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    entry = gguf_cache_root() / gguf_cache.entry_name(path)
    convert = gguf_cache._convert
    theirs: list[int] = []

    def race(gguf: Path, out: Path, progress: bool) -> None:
        convert(gguf, out, progress)  # ours is ready, but another process publishes first
        with monkeypatch.context() as m:
            m.setattr(gguf_cache, "_convert", convert)
            assert write_entry(gguf, entry) == entry
        theirs.append((entry / "config.json").stat().st_ino)

    monkeypatch.setattr(gguf_cache, "_convert", race)
    assert write_entry(path, entry) == entry
    assert (entry / "config.json").stat().st_ino == theirs[0]  # theirs stays in place
    assert entries(cache) == [entry.name]  # and no temporary directory is left
    assert Tokenizer(path).encode("hi") == direct(path, monkeypatch)[1].encode("hi")


def test_a_rewritten_gguf_gets_a_new_entry(
    cache, tmp_path, monkeypatch, tokenizer, write_gguf
) -> None:
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf, seed=0)
    Tokenizer(path)
    [old] = entries(cache)
    size = path.stat().st_size
    write_family_gguf(tmp_path, "llama", tokenizer, write_gguf, seed=1)  # same size, new values
    assert path.stat().st_size == size
    model, _ = direct(path, monkeypatch)
    assert_same_logits(load_model(path, torch.float32, CPU, "torch"), model)
    Tokenizer(path)
    [new] = entries(cache)  # the stale entry is gone
    assert new != old


def test_an_unwritable_cache_loads_from_the_gguf(
    tmp_path, monkeypatch, tokenizer, write_gguf
) -> None:
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    model, tok = direct(path, monkeypatch)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("VERISPEC_CACHE", str(blocker))  # <cache>/gguf cannot be made
    assert cached_checkpoint(path) is None
    assert_same_logits(load_model(path, torch.float32, CPU, "torch"), model)
    assert_same_tokenizer(Tokenizer(path), tok)


def test_the_cache_can_be_turned_off(cache, tmp_path, monkeypatch, tokenizer, write_gguf):
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    monkeypatch.setenv(gguf_cache.DISABLE_ENV, "1")
    load_model(path, torch.float32, CPU)
    Tokenizer(path)
    assert not (cache / "gguf").exists()  # (the native kernel's build may live in cache/kernels)


def test_entry_records_its_source(cache, tmp_path, tokenizer, write_gguf) -> None:
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    entry = cached_checkpoint(path)
    assert entry is not None and entry.name.startswith("llama-")
    source = json.loads((entry / gguf_cache.SOURCE_FILE).read_text())
    assert source["gguf"] == str(path.resolve())
    assert source["tokenizer_flags"] == {"add_bos_token": True}  # write_gguf sets it
    assert json.loads((entry / "generation_config.json").read_text())["eos_token_id"] == [1]


def test_an_older_float32_cache_is_removed_and_said(
    cache, tmp_path, tokenizer, write_gguf, caplog: pytest.LogCaptureFixture
) -> None:
    old = cache / "gguf" / "SomeModel.Q4_K_M-0123456789abcdef"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(bytes(1000))
    (old / "config.json").write_text("{}")
    path, _ = write_family_gguf(tmp_path, "llama", tokenizer, write_gguf)
    with caplog.at_level("WARNING", logger="verispec"):
        Tokenizer(path)
    assert not old.exists()
    assert "float32 weights that an older verispec cached" in caplog.text
    assert len(entries(cache)) == 1


@pytest.mark.slow
def test_smollm2_cached_equals_direct(smollm2_path, cache, monkeypatch) -> None:
    """The real 49k-token vocabulary, merges and chat template survive the round trip."""
    with monkeypatch.context() as m:
        m.setenv(gguf_cache.DISABLE_ENV, "1")
        tok = Tokenizer(smollm2_path)
    entry = cached_checkpoint(smollm2_path)
    assert entry is not None and entry.parent == cache / "gguf"
    config, _ = read_gguf(smollm2_path, torch.float32, CPU)
    assert not list(entry.glob("*.safetensors"))
    # the saved tokenizer.json under a name from_pretrained does not parse again
    assert (entry / gguf_cache.BACKEND_FILE).is_file() and not (entry / "tokenizer.json").exists()
    assert ModelConfig.from_file(entry / "config.json") == config
    cached = Tokenizer(smollm2_path)
    assert_same_tokenizer(cached, tok)
    assert cached.eos_token_ids == [2]  # <|im_end|>
