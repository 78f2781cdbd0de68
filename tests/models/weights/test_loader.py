"""Checkpoint loading: sharded weights, path and dtype resolution, and their errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.harness import Runner, native_model, random_ids
from verispec import LLM
from verispec.models.kernels.backends import choose_backend
from verispec.models.weights.loader import load_model, resolve_dtype, resolve_model_path

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


VOCAB_IDS = torch.tensor([0, 1, 2, *range(40, 320, 7)])
"""A reduced vocabulary of the 320-token checkpoints: 43 ids, not a multiple of 16 rows."""


@pytest.mark.parametrize("backend", ["torch", "auto"])  # auto: the native kernel where it runs
def test_a_head_cut_to_vocab_ids_scores_those_ids(family_checkpoint, backend: str) -> None:
    """The LM head keeps the rows of vocab_ids only (a tied head too, its embedding table
    whole): logits [n, N] are the whole head's at those ids."""
    path, _ = family_checkpoint
    whole = load_model(path, torch.float32, CPU, backend)
    cut = load_model(path, torch.float32, CPU, backend, vocab_ids=VOCAB_IDS)
    assert cut.lm_head.out_features == len(VOCAB_IDS) and whole.vocab_ids is None
    assert torch.equal(cut.vocab_ids, VOCAB_IDS) and torch.equal(cut.embed, whole.embed)
    ids = random_ids(12, 320, seed=3)
    expected = Runner(whole).prefill(ids, num_logits=12)[:, VOCAB_IDS]
    assert_close(Runner(cut).prefill(ids, num_logits=12), expected, atol=1e-5, rtol=0)
    skipped = cut.without_layers([0])  # self-speculation's view keeps the reduced head
    assert skipped.lm_head is cut.lm_head and skipped.vocab_ids is cut.vocab_ids


@pytest.mark.parametrize(
    "ids", [[0, 2, 1], [0, 1, 1], [0, 320], [-1, 5], [], [0.0, 1.0]],
    ids=["unsorted", "repeated", "past-the-end", "negative", "empty", "float"],
)  # fmt: skip
def test_bad_vocab_ids_are_refused(llama_checkpoint, ids: list) -> None:
    with pytest.raises(ValueError, match=r"vocabulary ids must be distinct token ids in "
                       r"ascending order within \[0, 320\)"):  # fmt: skip
        load_model(llama_checkpoint, torch.float32, CPU, vocab_ids=torch.tensor(ids))


def test_missing_directory(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path(tmp_path / "absent")


def test_directory_without_config(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json and no \.gguf file"):
        resolve_model_path(tmp_path)


def test_directory_without_safetensors(llama_checkpoint, tmp_path) -> None:
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_checkpoint / name, tmp_path)
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
    for name in ("someorg/somemodel", "nosuchmodel"):
        with pytest.raises(ValueError, match="Hugging Face hub could not be reached") as error:
            resolve_model_path(name)
        message = str(error.value)
        assert f"model {name!r} is not a local file or directory" in message
        assert "\n" not in message and len(message) < 250  # one line, no hub client dump


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


def copy_checkpoint(source: Path, target: Path) -> Path:
    """A copy of a checkpoint directory that a test may damage."""
    shutil.copytree(source, target)
    return target


def test_empty_model_name() -> None:
    with pytest.raises(ValueError, match="model must be a path or a name, got an empty string"):
        resolve_model_path("")


def test_model_file_that_is_not_gguf(llama_checkpoint) -> None:
    with pytest.raises(ValueError, match=r"config\.json is not a \.gguf file"):
        resolve_model_path(llama_checkpoint / "config.json")


def test_config_with_model_type_but_no_architectures(llama_checkpoint, tmp_path) -> None:
    path = copy_checkpoint(llama_checkpoint, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    del config["architectures"]
    (path / "config.json").write_text(json.dumps(config))
    ids = random_ids(10, config["vocab_size"], seed=3)
    logits = Runner(load_model(path, torch.float32, CPU, "torch")).prefill(ids, num_logits=10)
    assert torch.equal(logits, Runner(native_model(llama_checkpoint)).prefill(ids, num_logits=10))


def test_truncated_safetensors_names_the_file(llama_checkpoint, tmp_path) -> None:
    path = copy_checkpoint(llama_checkpoint, tmp_path / "ckpt")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=rf"checkpoint file {weights} is corrupt or truncated"):
        load_model(path, torch.float32, CPU)


@pytest.mark.parametrize("index", ["{not json", '{"metadata": {}}', "[1, 2]"])
def test_bad_safetensors_index_names_the_file(family_checkpoint, tmp_path, index) -> None:
    _, hf_model = family_checkpoint
    hf_model.save_pretrained(str(tmp_path), max_shard_size="20KB")
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json is not valid") as error:
        load_model(tmp_path, torch.float32, CPU)
    assert "weight_map" in str(error.value)


def test_shapes_are_checked_at_load(llama_checkpoint, tmp_path) -> None:
    path = copy_checkpoint(llama_checkpoint, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 96  # the weights have 128
    (path / "config.json").write_text(json.dumps(config))
    expected = (
        r"tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[128, 64\], "
        r"but the config implies \[96, 64\]"
    )
    with pytest.raises(ValueError, match=expected):
        load_model(path, torch.float32, CPU)


@pytest.mark.parametrize(
    ("key", "value", "tensor"),
    [
        ("vocab_size", 300, "model.embed_tokens.weight"),
        ("num_key_value_heads", 4, "model.layers.0.self_attn.k_proj.weight"),
        ("hidden_size", 32, "model.layers.0.self_attn.q_proj.weight"),
    ],
)
def test_each_shape_mismatch_names_its_tensor(llama_checkpoint, tmp_path, key, value, tensor):
    path = copy_checkpoint(llama_checkpoint, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config[key] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"tensor '{tensor}' has shape"):
        load_model(path, torch.float32, CPU)


@pytest.mark.parametrize(
    "removed", [["tokenizer.json"], ["tokenizer.json", "tokenizer_config.json"]]
)
def test_missing_tokenizer_is_named_before_loading(llama_checkpoint, tmp_path, removed) -> None:
    path = copy_checkpoint(llama_checkpoint, tmp_path / "ckpt")
    for name in removed:
        (path / name).unlink()
    (path / "model.safetensors").write_bytes(b"not read: the tokenizer check comes first")
    with pytest.raises(ValueError, match=r"has no tokenizer: missing tokenizer\.json") as error:
        resolve_model_path(path)
    assert ("tokenizer_config.json" in str(error.value)) == ("tokenizer_config.json" in removed)


def test_auto_numerics_are_a8_for_quantized_gguf_files_only(
    tmp_path: Path, tokenizer, smollm2_path: Path
) -> None:
    """quantization "auto": a GGUF file of quantized blocks (the default model's Q4_1) runs a8
    on the CPU; a float checkpoint, the same file on another dtype, and an explicit None keep
    exact float inputs; the engine's config and the settings say what ran."""
    from verispec.models.kernels.backends import native_usable
    from verispec.models.kernels.quantization import numerics_name
    from verispec.models.weights.loader import resolve_quantization

    cpu = torch.device("cpu")
    make_checkpoint(tmp_path / "hf", "llama", tokenizer)
    source = tmp_path / "hf"
    expected = "a8" if native_usable() else None
    assert resolve_quantization("auto", smollm2_path, cpu, torch.float32) == expected
    assert resolve_quantization("auto", smollm2_path, cpu, torch.bfloat16) is None
    assert resolve_quantization("auto", smollm2_path, cpu, torch.float32, compile=True) is None
    assert resolve_quantization("auto", source, cpu, torch.float32) is None
    assert resolve_quantization(None, smollm2_path, cpu, torch.float32) is None
    assert resolve_quantization("w8a8", source, cpu, torch.float32) == "w8a8"
    llm = LLM(model=str(source), speculative=None, quantization="auto", max_model_len=64)
    assert llm.engine.config.quantization is None
    assert numerics_name(None) == "exact float inputs"
    assert numerics_name("a8").startswith("a8")


def test_the_default_numerics_are_a8_for_a_k_quant_file_and_exact_for_a_checkpoint(
    tmp_path: Path, tokenizer, write_gguf
) -> None:
    """With no quantization given, a GGUF file of K-quant blocks runs a8 on the CPU (where the
    native kernel runs) and a safetensors checkpoint of the same model exact float inputs; the
    engine's config, and so `--json` settings and the start line, hold what ran."""
    from verispec.config import EngineConfig
    from verispec.models.kernels.backends import native_usable

    assert EngineConfig().quantization == "auto"
    source = make_checkpoint(tmp_path / "hf", "llama", tokenizer, hidden_size=256,
                             intermediate_size=512)  # fmt: skip
    path = tmp_path / "model.gguf"
    write_gguf(path, source, tokenizer, "Q4_K")
    k_quant = LLM(model=str(path), speculative=None, max_model_len=64)
    assert k_quant.engine.config.quantization == ("a8" if native_usable() else None)
    checkpoint = LLM(model=str(tmp_path / "hf"), speculative=None, max_model_len=64)
    assert checkpoint.engine.config.quantization is None
