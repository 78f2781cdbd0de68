"""EAGLE-3 head checkpoints: the saved head computes what the trainable head computes, and every
malformed or mismatched head directory is refused with a ValueError that says what is wrong."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.eagle_heads import copy_head, random_head, tiny_target
from verispec import LLM, SpecConfig
from verispec.kv import BlockAllocator, BlockTable
from verispec.models.batch import ForwardBatch
from verispec.models.eagle import EagleConfig, load_eagle_head, save_eagle_head
from verispec.models.eagle_config import ARCHITECTURE, VARIANTS
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.rope import inverse_frequencies
from verispec.models.weights.loader import resolve_head_path
from verispec.train.distill import sequence_features
from verispec.train.eagle import TrainableEagle

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = (0, 1, 2)
DRAFT_IDS = torch.arange(3, 320, 2)  # 159 draft ids: d2t offsets 3, 4, 5, ... (not all zero)
SEQUENCE = [0, 17, 99, 3, 250, 41, 41, 7, 300, 12, 8, 19, 64, 5]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, LlamaModel]:
    return tiny_target(tmp_path_factory.mktemp("eagle-target"), tokenizer)


@pytest.fixture(scope="module")
def saved(
    target: tuple[Path, LlamaModel], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, TrainableEagle]:
    """(head dir saved in float32, the trainable head it came from)."""
    model = target[1]
    config = EagleConfig.for_target(model.config, len(DRAFT_IDS), LAYERS)
    head = random_head(config, model.embed, DRAFT_IDS)
    path = tmp_path_factory.mktemp("head")
    save_eagle_head(config, head.state_for_export(), path, torch.float32)
    return path, head


@pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param("native", marks=pytest.mark.skipif(
            not isinstance(native_kernel(), NativeKernel), reason="no native kernel here")),
    ],
)  # fmt: skip
def test_loaded_head_computes_the_trainable_heads_depth_1_logits(
    target: tuple[Path, LlamaModel], saved: tuple[Path, TrainableEagle], backend: str
) -> None:
    """Row r (token r + 1 at position r, true features of position r) of the inference head,
    all rows in one causal forward, equals the trainable head's depth-1 row r; with the native
    kernel the head's step runs in native code (native_layer.py)."""
    model = target[1]
    path, trained = saved
    head = load_eagle_head(path, model, backend)
    assert (head.native is not None) == (backend == "native")
    assert head.config == trained.config
    assert torch.equal(head.draft_to_target, DRAFT_IDS)
    features = sequence_features(PagedModel(model, 16, 4), [SEQUENCE], LAYERS, 4)[0][0]
    features = features.float()  # [T, 3 * hidden], float16 on disk as in training data
    table = BlockTable(BlockAllocator(16), 4)
    rows = len(SEQUENCE) - 1
    chunk = append_chunk(table, SEQUENCE[1:], num_logits=rows)
    _, logits = head.forward(ForwardBatch.build([chunk], 4), head.new_kv_cache(16, 4),
                             head.fuse(features[:rows]))  # fmt: skip
    with torch.no_grad():
        want = trained(torch.tensor([SEQUENCE]), features[None], 1)[0][0]  # [rows, draft vocab]
    assert logits.dtype == torch.float32 and logits.shape == (rows, len(DRAFT_IDS))
    # native: other exp and summation orders, amplified by weights scaled up 25x (logits to 17)
    torch.testing.assert_close(logits, want, atol=1e-5 if backend == "torch" else 1e-4, rtol=0)
    assert logits.std(dim=0).mean() > 1.0  # the rows really differ: attention and MLP at work


def test_checkpoint_format(saved: tuple[Path, TrainableEagle], tmp_path: Path) -> None:
    """config.json as vLLM/SGLang read EAGLE-3 heads; floats in the chosen dtype, d2t int64."""
    _, trained = saved
    save_eagle_head(trained.config, trained.state_for_export(), tmp_path)  # default float16
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == [ARCHITECTURE]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert (cfg["vocab_size"], cfg["draft_vocab_size"], cfg["hidden_size"]) == (320, 159, 64)
    assert EagleConfig.from_dict(cfg) == trained.config
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert set(weights) == set(trained.config.tensor_shapes())
    assert weights["d2t"].dtype == torch.int64
    assert torch.equal(weights["d2t"] + torch.arange(159), DRAFT_IDS)
    assert {w.dtype for k, w in weights.items() if k != "d2t"} == {torch.float16}
    with pytest.raises(ValueError, match="head tensors must be exactly"):
        state = trained.state_for_export()
        del state["norm.weight"]
        save_eagle_head(trained.config, state, tmp_path / "bad")


def test_rope_scaling_round_trips_to_the_heads_rotary_frequencies(
    target: tuple[Path, LlamaModel], saved: tuple[Path, TrainableEagle], tmp_path: Path
) -> None:
    """A target's scaled rotary positions (llama3) are written to config.json, read back, and
    rotate the loaded head's queries and keys."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    config = replace(saved[1].config, rope_scaling=scaling)
    save_eagle_head(config, saved[1].state_for_export(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["rope_scaling"] == scaling and EagleConfig.from_dict(cfg) == config
    head = load_eagle_head(tmp_path, target[1], "torch")
    scaled = inverse_frequencies(config.head_dim, config.rope_theta, scaling)
    assert torch.equal(head.inv_freq, scaled)
    assert not torch.equal(scaled, inverse_frequencies(config.head_dim, config.rope_theta, None))


def test_layer_variants_round_trip(saved: tuple[Path, TrainableEagle], tmp_path: Path) -> None:
    """The variant switches are written at config.json's top level as vLLM reads them (also
    read from eagle_config, where some writers keep them), with the fused features' norms."""
    config = replace(saved[1].config, norm_before_residual=True, fc_norm=True, norm_output=True)
    save_eagle_head(config, random_head(config, torch.randn(320, 64), DRAFT_IDS)
                    .state_for_export(), tmp_path)  # fmt: skip
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert [cfg[k] for k in VARIANTS] == [True, False, True, True]  # residual, fc, fc_norm, out
    assert EagleConfig.from_dict(cfg) == config
    stored = load_file(tmp_path / "model.safetensors")
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(stored)
    nested = {k: v for k, v in cfg.items() if k not in ("fc_norm", "norm_output")}
    nested["eagle_config"] = {**cfg["eagle_config"], "fc_norm": True, "norm_output": True}
    assert EagleConfig.from_dict(nested) == config


def _drop_architecture(cfg: dict) -> None:
    cfg["architectures"] = ["LlamaForCausalLM"]


def _drop_layer_ids(cfg: dict) -> None:
    del cfg["eagle_config"]


def _drop_tensor(w: dict) -> None:
    del w["midlayer.self_attn.k_proj.weight"]


def _reshape_tensor(w: dict) -> None:
    w["fc.weight"] = w["fc.weight"][:, :128].contiguous()


def _d2t_outside(w: dict) -> None:
    w["d2t"][-1] += 1  # the last draft id (317 + 2) now maps to 320, past the vocabulary


def _d2t_twice(w: dict) -> None:
    w["d2t"][1] = w["d2t"][0] - 1  # draft ids 0 and 1 both map to target id 3


BAD_HEADS = {
    "architecture": (_drop_architecture, None, "not an EAGLE-3 head.*LlamaForCausalLMEagle3"),
    "layer-ids": (_drop_layer_ids, None, "lacks eagle_config.eagle_aux_hidden_state_layer_ids"),
    "missing-tensor": (None, _drop_tensor, "lacks tensor 'midlayer.self_attn.k_proj.weight'"),
    "shape": (None, _reshape_tensor, r"'fc.weight' has shape \[64, 128\].*implies \[64, 192\]"),
    "d2t-outside": (None, _d2t_outside, r"outside the target vocabulary \[0, 320\)"),
    "d2t-twice": (None, _d2t_twice, "two draft ids to the same target id"),
}


@pytest.mark.parametrize("case", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_malformed_heads_are_refused(
    case: tuple, target: tuple[Path, LlamaModel], saved: tuple[Path, TrainableEagle],
    tmp_path: Path,
) -> None:  # fmt: skip
    config, tensors, message = case
    path = copy_head(saved[0], tmp_path, config, tensors)
    with pytest.raises(ValueError, match=message):
        load_eagle_head(path, target[1], "torch")


def head_for(config: EagleConfig, path: Path) -> Path:
    """Save a random head of `config` (any shapes: its own random embedding) to path."""
    embed = torch.randn(config.vocab_size, config.hidden_size)
    head = random_head(config, embed, torch.arange(config.draft_vocab_size))
    save_eagle_head(config, head.state_for_export(), path, torch.float32)
    return path


MISMATCHES = {
    "hidden": (dict(hidden_size=32, num_heads=2, num_kv_heads=1), "hidden 32, vocab 320.*does not "
               "fit the target \\(hidden 64, vocab 320\\)"),
    "vocab": (dict(vocab_size=400), "hidden 64, vocab 400.*does not fit"),
    "layers": (dict(feature_layers=(0, 1, 5)), r"feature layers \[5\] are outside 0..2"),
}  # fmt: skip


@pytest.mark.parametrize("case", MISMATCHES.values(), ids=MISMATCHES.keys())
def test_a_head_for_another_target_is_refused(
    case: tuple, target: tuple[Path, LlamaModel], tmp_path: Path
) -> None:
    changes, message = case
    config = EagleConfig.for_target(target[1].config, 100, LAYERS)
    for name, value in changes.items():
        setattr(config, name, value)
    path = head_for(config, tmp_path / "head")
    with pytest.raises(ValueError, match=message):
        load_eagle_head(path, target[1], "torch")


def test_the_engine_refuses_a_head_for_another_target(
    target: tuple[Path, LlamaModel], tmp_path: Path
) -> None:
    config = EagleConfig.for_target(target[1].config, 100, LAYERS)
    config.vocab_size = 400
    spec = SpecConfig(method="eagle", model=str(head_for(config, tmp_path / "head")))
    with pytest.raises(ValueError, match="does not fit the target"):
        LLM(model=str(target[0]), speculative=spec)


def test_resolve_head_path(saved: tuple[Path, TrainableEagle], tmp_path: Path) -> None:
    assert resolve_head_path(saved[0]) == saved[0]
    assert resolve_head_path(str(saved[0])) == saved[0]
    with pytest.raises(ValueError, match="got an empty string"):
        resolve_head_path("")
    with pytest.raises(ValueError, match="'/no/such/head' is not a directory"):
        resolve_head_path("/no/such/head")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"drafter head directory .*empty has no config\.json"):
        resolve_head_path(tmp_path / "empty")
    (tmp_path / "file.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_head_path(tmp_path / "file.safetensors")


def test_load_needs_config_json(target: tuple[Path, LlamaModel], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"has no config\.json"):
        load_eagle_head(tmp_path, target[1], "torch")
