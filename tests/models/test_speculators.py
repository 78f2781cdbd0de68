"""EAGLE-3 heads in the speculators layout: a head written in it reads back to the tensors of
its EAGLE-3 copy and drafts what that copy drafts, the layout is told apart by config.json
alone, config.json holds what the speculators package and vLLM read, and every speculators
head verispec cannot run is refused with a ValueError that says why. The layer variants it
records (norm_before_residual, ...) draft as the trainable head computes them:
tests/train/test_eagle_training.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from tests.helpers.eagle_heads import copy_head, random_head, tiny_target
from verispec import LLM, SamplingParams, SpecConfig
from verispec.models.config import ModelConfig
from verispec.models.eagle import load_eagle_head, read_eagle_head, save_eagle_head
from verispec.models.eagle_config import EagleConfig
from verispec.models.llama import LlamaModel
from verispec.models.speculators import (
    SpeculatorsMeta,
    from_speculators,
    is_speculators,
    speculators_name,
    to_speculators,
)

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = (0, 1, 2)
DRAFT_IDS = torch.arange(3, 320, 2)  # 159 draft ids: d2t offsets 3, 4, 5, ... (not all zero)
META = SpeculatorsMeta("tiny-llama", ("LlamaForCausalLM",), speculative_tokens=4)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[0, 17, 99, 3, 250], [0, 41, 41, 7], [0, 300, 12, 8, 19, 64, 5]]
DROP = object()
"""edit(key, DROP) deletes the key."""


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, LlamaModel]:
    return tiny_target(tmp_path_factory.mktemp("speculators-target"), tokenizer)


@pytest.fixture(scope="module")
def heads(
    target: tuple[Path, LlamaModel], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """(EAGLE-3 dir, speculators dir): one random head saved in float32 in either layout."""
    model = target[1]
    config = EagleConfig.for_target(model.config, len(DRAFT_IDS), LAYERS)
    state = random_head(config, model.embed, DRAFT_IDS).state_for_export()
    root = tmp_path_factory.mktemp("heads")
    save_eagle_head(config, state, root / "eagle3", torch.float32)
    save_eagle_head(config, state, root / "speculators", torch.float32, speculators=META)
    return root / "eagle3", root / "speculators"


def read_config(head: Path) -> dict[str, Any]:
    return json.loads((head / "config.json").read_text())


def test_a_head_round_trips_to_identical_tensors(
    target: tuple[Path, LlamaModel], heads: tuple[Path, Path]
) -> None:
    eagle3_config, eagle3 = read_eagle_head(heads[0], target[1].config)
    config, weights = read_eagle_head(heads[1], target[1].config)
    assert config == eagle3_config and weights.keys() == eagle3.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, eagle3[name]), name
    assert torch.equal(weights["d2t"] + torch.arange(len(DRAFT_IDS)), DRAFT_IDS)
    assert from_speculators(read_config(heads[1]), target[1].config) == (config, META)


def test_checkpoint_format(heads: tuple[Path, Path]) -> None:
    """config.json carries the keys the speculators package and vLLM read; the tensors are the
    EAGLE-3 ones under layers.0., plus t2d marking the draft vocabulary's target ids."""
    cfg = read_config(heads[1])
    assert is_speculators(cfg) and not is_speculators(read_config(heads[0]))
    assert (cfg["speculators_model_type"], cfg["architectures"]) == ("eagle3", ["Eagle3Speculator"])
    assert (cfg["draft_vocab_size"], cfg["eagle_aux_hidden_state_layer_ids"]) == (159, [0, 1, 2])
    assert cfg["norm_before_residual"] is False and cfg["target_hidden_size"] is None
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"] == [
        {"proposal_type": "greedy", "speculative_tokens": 4, "verifier_accept_k": 1}
    ]
    assert spec["verifier"] == {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}
    layer = LlamaConfig(**cfg["transformer_layer_config"])  # how the package builds the layer
    assert (layer.hidden_size, layer.num_attention_heads, layer.num_key_value_heads) == (64, 4, 2)
    assert (layer.head_dim, layer.vocab_size, layer.num_hidden_layers) == (16, 320, 1)
    assert layer.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    weights = load_file(str(heads[1] / "model.safetensors"))
    eagle3 = load_file(str(heads[0] / "model.safetensors"))
    assert set(weights) == {speculators_name(name) for name in eagle3} | {"t2d"}
    assert not any(name.startswith("midlayer.") for name in weights)
    assert "layers.0.self_attn.q_proj.weight" in weights and "fc.weight" in weights
    assert weights["t2d"].dtype == torch.bool and weights["d2t"].dtype == torch.int64
    assert torch.equal(weights["t2d"].nonzero().flatten(), DRAFT_IDS)


def drafted(target: Path, head: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """(outputs, every step's drafts) of greedy decoding of PROMPTS with the head as a chain."""
    spec = SpecConfig(method="eagle", model=str(head), num_speculative_tokens=3, tree_topk=1)
    llm = LLM(model=str(target), speculative=spec, batch_invariant=True)
    proposer = llm.engine.proposer
    propose = proposer.propose
    steps = []

    def recording(requests: Any, num_tokens: Any) -> Any:
        drafts = propose(requests, num_tokens)
        steps.append(drafts.token_ids)
        return drafts

    monkeypatch.setattr(proposer, "propose", recording)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], steps


def test_both_layouts_draft_the_same_tokens(
    target: tuple[Path, LlamaModel], heads: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reads the speculators directory with no flag (method eagle, the directory)
    and drafts exactly what the EAGLE-3 copy drafts; the output is plain greedy decoding's."""
    out, steps = drafted(target[0], heads[1], monkeypatch)
    want_out, want_steps = drafted(target[0], heads[0], monkeypatch)
    assert steps == want_steps and sum(len(d) for step in steps for d in step) > 0
    plain = LLM(model=str(target[0]), speculative=None, batch_invariant=True)
    assert out == want_out == [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]


def test_a_head_over_the_whole_vocabulary_leaves_out_d2t_and_t2d(
    target: tuple[Path, LlamaModel], tmp_path: Path
) -> None:
    model = target[1]
    config = EagleConfig.for_target(model.config, 320, LAYERS)
    state = random_head(config, model.embed, torch.arange(320)).state_for_export()
    save_eagle_head(config, state, tmp_path, torch.float32, speculators=META)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert "d2t" not in stored and "t2d" not in stored
    _, weights = read_eagle_head(tmp_path, model.config)
    assert torch.equal(weights["d2t"], torch.zeros(320, dtype=torch.int64))


def test_without_layer_ids_the_head_reads_the_targets_default_layers(
    target: tuple[Path, LlamaModel], heads: tuple[Path, Path], tmp_path: Path
) -> None:
    """Like vLLM and the package: a low, a middle and a high layer (2, 1, 0 of 2 layers)."""
    path = copy_head(heads[1], tmp_path, edit("eagle_aux_hidden_state_layer_ids", None))
    assert load_eagle_head(path, target[1], "torch").feature_layers == (2, 1, 0)


def test_rope_scaling_round_trips() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    config = EagleConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                         intermediate_size=128, vocab_size=320, draft_vocab_size=100,
                         feature_layers=(0, 1, 2), rope_theta=5e5, rope_scaling=scaling,
                         max_position_embeddings=131072)  # fmt: skip
    target = ModelConfig(architecture="LlamaForCausalLM", vocab_size=320, hidden_size=64,
                         intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                         head_dim=16, rms_norm_eps=1e-6,
                         max_position_embeddings=131072)  # fmt: skip
    cfg = json.loads(json.dumps(to_speculators(config, META)))
    assert from_speculators(cfg, target)[0] == config
    layer = LlamaConfig(**cfg["transformer_layer_config"])
    assert layer.rope_parameters == {**scaling, "rope_theta": 5e5}


def edit(key: str, value: Any = DROP) -> Callable[[dict], None]:
    """Sets config.json's dotted key to value (DROP: deletes it)."""

    def apply(cfg: dict) -> None:
        *parents, last = key.split(".")
        for part in parents:
            cfg = cfg[part]
        if value is DROP:
            del cfg[last]
        else:
            cfg[last] = value

    return apply


def both(first: Callable[[dict], None], second: Callable[[dict], None]) -> Callable[[dict], None]:
    """Both edits, in order."""

    def apply(cfg: dict) -> None:
        first(cfg)
        second(cfg)

    return apply


def drop_tensor(w: dict) -> None:
    del w["layers.0.self_attn.k_proj.weight"]


def eagle3_names(w: dict) -> None:
    for name in [n for n in w if n.startswith("layers.0.")]:
        w[name.replace("layers.0.", "midlayer.")] = w.pop(name)


def reshape_fc(w: dict) -> None:
    w["fc.weight"] = w["fc.weight"][:, :128].contiguous()


def t2d_other(w: dict) -> None:
    w["t2d"][0] = True  # target id 0 is not in the draft vocabulary


def t2d_short(w: dict) -> None:
    w["t2d"] = w["t2d"][:300].clone()


LAYER = "transformer_layer_config"
SPEC = "speculators_config"
BAD_HEADS = {
    "model-type": (edit("speculators_model_type", "eagle"), None,
                   "speculators model type 'eagle' is not one verispec runs; supported: 'eagle3'"),
    "no-norm-before-residual": (edit("norm_before_residual"), None,
                                "lacks norm_before_residual .vLLM reads a missing one as true"),
    "own-embedding": (edit("embed_requires_grad", True), None,
                      "sets embed_requires_grad: the head trained its own token embedding"),
    "two-fused-norms": (both(edit("norm_before_fc", True), edit("fc_norm", True)), None,
                        "norm_before_fc and fc_norm are two ways"),
    "variant-without-its-norm": (edit("norm_before_fc", True), None,
                                 "lacks tensor 'input_norm.weight'"),
    "target-width": (edit("target_hidden_size", 128), None,
                     "fuses target features of width 128 into a layer of 64"),
    "two-layers": (edit(f"{LAYER}.num_hidden_layers", 2), None, "has 2 layers; verispec runs"),
    "qwen3-layer": (edit(f"{LAYER}.model_type", "qwen3"), None, "has q/k norms; verispec's"),
    "biases": (edit(f"{LAYER}.attention_bias", True), None, "has q/k/v biases"),
    "activation": (edit(f"{LAYER}.hidden_act", "gelu"), None, "has activation 'gelu'"),
    "rope": (edit(f"{LAYER}.rope_parameters", {"rope_type": "yarn", "factor": 4.0}), None,
             "transformer_layer_config: unsupported rope scaling type 'yarn'"),
    "no-layer": (edit(LAYER), None, "lacks transformer_layer_config"),
    "layer-lacks-key": (edit(f"{LAYER}.intermediate_size"), None,
                        "transformer_layer_config lacks 'intermediate_size'"),
    "no-draft-vocab": (edit("draft_vocab_size"), None, "lacks draft_vocab_size"),
    "no-speculators-config": (edit(SPEC), None, "lacks speculators_config"),
    "no-methods": (edit(f"{SPEC}.proposal_methods", []), None,
                   "proposal_methods must be a non-empty list"),
    "default-method": (edit(f"{SPEC}.default_proposal_method", "tree"), None,
                       r"default_proposal_method 'tree' is not the proposal_type .*\['greedy'\]"),
    "no-tokens": (edit(f"{SPEC}.proposal_methods", [{"proposal_type": "greedy"}]), None,
                  "needs speculative_tokens >= 1, got None"),
    "no-verifier": (edit(f"{SPEC}.verifier"), None, "verifier must name the verifier"),
    "verifier-vocab": (edit(f"{LAYER}.vocab_size", 400), None,
                       r"for verifier 'tiny-llama' \(hidden 64, vocab 400\) does not fit the "
                       r"target \(hidden 64, vocab 320\)"),
    "layers": (edit("eagle_aux_hidden_state_layer_ids", [0, 1, 5]), None,
               r"feature layers \[5\] are outside 0..2"),
    "missing-tensor": (None, drop_tensor, "lacks tensor 'layers.0.self_attn.k_proj.weight'"),
    "eagle3-names": (None, eagle3_names, "lacks tensor 'layers.0."),
    "shape": (None, reshape_fc, r"'fc.weight' has shape \[64, 128\].*implies \[64, 192\]"),
    "t2d": (None, t2d_other, "t2d marks other target ids than d2t maps"),
    "t2d-shape": (None, t2d_short, r"t2d has shape \[300\], the config implies \[320\]"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_heads_verispec_cannot_run_are_refused(
    case: tuple, target: tuple[Path, LlamaModel], heads: tuple[Path, Path], tmp_path: Path
) -> None:
    config, tensors, message = case
    path = copy_head(heads[1], tmp_path, config, tensors)
    with pytest.raises(ValueError, match=message):
        load_eagle_head(path, target[1], "torch")


def test_a_head_for_a_narrower_verifier_is_refused(
    target: tuple[Path, LlamaModel], tmp_path: Path
) -> None:
    config = EagleConfig.for_target(target[1].config, 100, LAYERS)
    config.hidden_size, config.num_heads, config.num_kv_heads = 32, 2, 1
    state = random_head(config, torch.randn(320, 32), torch.arange(100)).state_for_export()
    save_eagle_head(config, state, tmp_path, torch.float32, speculators=META)
    with pytest.raises(ValueError, match=r"'tiny-llama' \(hidden 32, vocab 320\) does not fit"):
        load_eagle_head(tmp_path, target[1], "torch")


def test_writing_refuses_a_d2t_outside_the_vocabulary(
    target: tuple[Path, LlamaModel], tmp_path: Path
) -> None:
    config = EagleConfig.for_target(target[1].config, len(DRAFT_IDS), LAYERS)
    state = random_head(config, target[1].embed, DRAFT_IDS).state_for_export()
    state["d2t"] = state["d2t"] + 2  # the last draft id now maps to 321
    with pytest.raises(ValueError, match=r"outside the target vocabulary \[0, 320\)"):
        save_eagle_head(config, state, tmp_path, speculators=META)
    with pytest.raises(ValueError, match="speculative_tokens must be >= 1, got 0"):
        SpeculatorsMeta("tiny-llama", speculative_tokens=0)


def test_the_speculators_package_reads_the_config(
    target: tuple[Path, LlamaModel], heads: tuple[Path, Path]
) -> None:
    """Where the package is installed: its own config class accepts what verispec writes, and
    verispec reads what that class writes back to the same head."""
    package = pytest.importorskip("speculators", reason="the speculators package is not "
                                  "installed (it pins its own torch and transformers)")  # fmt: skip
    cfg = read_config(heads[1])
    parsed = package.SpeculatorModelConfig.from_dict(cfg)
    assert (parsed.speculators_model_type, parsed.draft_vocab_size) == ("eagle3", 159)
    assert parsed.norm_before_residual is False
    assert parsed.eagle_aux_hidden_state_layer_ids == [0, 1, 2]
    assert parsed.transformer_layer_config.hidden_size == 64
    assert parsed.speculators_config.verifier.name_or_path == "tiny-llama"
    assert parsed.speculators_config.proposal_methods[0].speculative_tokens == 4
    written = json.loads(parsed.to_json_string())
    assert from_speculators(written, target[1].config) == from_speculators(cfg, target[1].config)


PACKAGE_VARIANTS = {
    "plain": {},
    "eagle-3.1": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
    "fc-norm": {"norm_before_residual": True, "fc_norm": True},
}


@pytest.mark.parametrize("variant", PACKAGE_VARIANTS.values(), ids=PACKAGE_VARIANTS.keys())
def test_the_speculators_package_drafts_what_verispec_drafts(
    variant: dict[str, bool], tmp_path: Path
) -> None:
    """Where the package is installed: its own EAGLE-3 model, built from the config.json and
    tensors verispec writes, drafts at depths 1-3 what verispec's head computes (row r of
    depth s is the package's position r - s + 1 of its step s)."""
    package = pytest.importorskip("speculators", reason="the speculators package is not "
                                  "installed (it pins its own torch and transformers)")  # fmt: skip
    from speculators.models.eagle3.core import Eagle3DraftModel

    config = EagleConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                         intermediate_size=128, vocab_size=320, draft_vocab_size=159,
                         feature_layers=(0, 1, 2), rope_theta=5e5, **variant)  # fmt: skip
    torch.manual_seed(0)
    embed = torch.randn(320, 64)
    head = random_head(config, embed, DRAFT_IDS)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 1:  # norms away from 1, so each one's place matters
                p.uniform_(0.5, 1.5)
    save_eagle_head(config, head.state_for_export(), tmp_path, torch.float32, speculators=META)
    package_config = package.SpeculatorModelConfig.from_dict(read_config(tmp_path))
    package_config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(package_config).float()
    stored = {**load_file(str(tmp_path / "model.safetensors")), "embed_tokens.weight": embed}
    assert not model.load_state_dict(stored, strict=False).unexpected_keys
    tokens, features = torch.randint(3, 320, (1, 16)), 3 * torch.randn(1, 16, 192)
    with torch.no_grad():
        ours = head(tokens, features, 3)
        theirs = model(hidden_states=features[:, :-1], input_ids=tokens[:, 1:],
                       document_ids=torch.zeros(1, 15, dtype=torch.long), ttt_steps=3)  # fmt: skip
    for s in range(3):
        assert torch.equal(ours[s][0, s:].argmax(-1), theirs[s][0, : 15 - s]), f"depth {s + 1}"
