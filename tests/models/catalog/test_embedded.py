"""The embedded default pair shipped in the package: loads in verispec and transformers alike,
and speculative greedy output equals plain greedy output on held-out prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.harness import BACKENDS, Runner, hf_logits, native_model
from verispec import LLM, SamplingParams, SpecConfig
from verispec.data.corpus import corpus_files
from verispec.models.catalog.default import EMBEDDED_DIR, embedded_model_path
from verispec.spec.policy import explore_interval
from verispec.train.prompts import code_completion_prompts, spread

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

TARGET, DRAFT = embedded_model_path("target"), embedded_model_path("draft")


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    """Four short held-out code-completion prompts."""
    short = [p.text for p in code_completion_prompts(corpus_files("heldout")) if len(p.text) < 400]
    return spread(short, 4)


def test_shipped_files_are_fp16_and_share_one_tokenizer() -> None:
    for path in (TARGET, DRAFT):
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert (TARGET / "tokenizer.json").read_text() == (DRAFT / "tokenizer.json").read_text()
    target_cfg = json.loads((TARGET / "config.json").read_text())
    draft_cfg = json.loads((DRAFT / "config.json").read_text())
    assert target_cfg["architectures"] == draft_cfg["architectures"] == ["LlamaForCausalLM"]
    assert target_cfg["max_position_embeddings"] >= 512
    assert (EMBEDDED_DIR / "MODEL_CARD.md").is_file()


def test_unknown_embedded_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="target, draft"):
        embedded_model_path("medusa")


@pytest.mark.parametrize("path", [TARGET, DRAFT], ids=["target", "draft"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_agree_with_transformers(path: Path, backend: str, prompts: list[str]) -> None:
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(path))
    for text in prompts:
        ids = tok(text).input_ids
        runner = Runner(native_model(path, backend), num_blocks=64, block_size=16)
        got = runner.prefill(ids, num_logits=len(ids))  # [len(ids), vocab]
        torch.testing.assert_close(got, hf_logits(hf, ids), atol=1e-4, rtol=1e-4)


def test_speculative_greedy_equals_plain_greedy(prompts: list[str]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=48)
    plain = LLM(model=str(TARGET), speculative=None, batch_invariant=True).generate(prompts, params)
    spec = LLM(
        model=str(TARGET), batch_invariant=True,
        speculative=SpecConfig(model=str(DRAFT), num_speculative_tokens=4),
    ).generate(prompts, params)  # fmt: skip
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    accepted = sum(o.metrics.spec.num_accepted_tokens for o in spec)
    drafted = sum(o.metrics.spec.num_draft_tokens for o in spec)
    assert drafted > 0 and accepted / drafted > 0.3  # the draft is aligned with the target


def test_the_embedded_name_brings_its_draft() -> None:
    llm = LLM(model="embedded-code")
    assert llm.engine.model_path == TARGET
    spec = llm.engine.config.speculative
    assert spec is not None and spec.method == "draft_model" and spec.model == "embedded-code-draft"
    assert llm.engine.proposer.model.config.num_layers < llm.engine.model.config.num_layers
    # "auto" is adaptive: the policy may find drafts dear on a busy machine, but it explores
    # (drafts anyway) every explore_interval(1) steps: three intervals draft whatever it measured.
    params = SamplingParams(temperature=0.0, max_tokens=3 * explore_interval(1))
    (out,) = llm.generate("def add(a, b):\n", params)
    assert out.metrics.spec.num_draft_tokens > 0
    plain = LLM(model="embedded-code", speculative=None)
    assert plain.engine.config.speculative is None
    other = LLM(model=str(TARGET))
    assert other.engine.config.speculative is None  # "auto" pairs named models only
