"""Checkpoint loading: sharded weights, path and dtype resolution, and their errors."""

from __future__ import annotations

import shutil

import pytest
import torch

from verispec.models.linear import choose_backend
from verispec.models.loader import load_model, resolve_dtype, resolve_model_path

from .harness import Runner, native_model, random_ids

CPU = torch.device("cpu")


def test_sharded_checkpoint_loads_like_the_single_file(family_checkpoint, tmp_path) -> None:
    path, hf_model = family_checkpoint
    hf_model.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded = load_model(tmp_path, torch.float32, CPU, "torch")
    ids = random_ids(12, hf_model.config.vocab_size, seed=7)
    expected = Runner(native_model(path)).prefill(ids, num_logits=12)
    assert torch.equal(Runner(sharded).prefill(ids, num_logits=12), expected)


def test_missing_directory(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path(tmp_path / "absent")


def test_directory_without_config(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        resolve_model_path(tmp_path)


def test_directory_without_safetensors(llama_checkpoint, tmp_path) -> None:
    shutil.copy(llama_checkpoint / "config.json", tmp_path)
    assert resolve_model_path(tmp_path) == tmp_path
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_model(tmp_path, torch.float32, CPU)


def test_hub_id_offline_names_the_hub(tmp_path, monkeypatch) -> None:
    import huggingface_hub.constants

    # huggingface_hub reads HF_HUB_OFFLINE once, at import, so patch the constant too.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="Hugging Face hub") as error:
        resolve_model_path("someorg/somemodel")
    assert "someorg/somemodel" in str(error.value)


@pytest.mark.parametrize("dtype", ["float64", "fp32", torch.float64])
def test_unknown_dtype_lists_the_allowed_ones(dtype) -> None:
    with pytest.raises(ValueError, match="auto, float32, float16, bfloat16"):
        resolve_dtype(dtype, CPU)


def test_dtype_resolution() -> None:
    assert resolve_dtype("auto", CPU) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16
    assert resolve_dtype(torch.float16, CPU) == torch.float16


def test_onednn_backend_needs_float32(llama_checkpoint) -> None:
    with pytest.raises(ValueError, match="onednn linear backend needs float32"):
        load_model(llama_checkpoint, torch.float16, CPU, "onednn")


def test_backend_choice() -> None:
    assert choose_backend("auto", CPU, torch.float32) == "auto"  # decided per weight
    assert choose_backend("auto", CPU, torch.bfloat16) == "torch"
    assert choose_backend("torch", CPU, torch.float32) == "torch"
    with pytest.raises(ValueError, match="auto, torch, onednn, fp16"):
        choose_backend("mkl", CPU, torch.float32)  # type: ignore[arg-type]


def test_missing_tensor_is_named(family_checkpoint, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    path, _ = family_checkpoint
    weights = load_file(path / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    shutil.copy(path / "config.json", tmp_path)
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_model(tmp_path, torch.float32, CPU)
