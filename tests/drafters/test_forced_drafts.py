"""Grammar-forced tokens as free drafts (docs/design.md, 3) stay lossless with every drafter:
greedy answers equal plain constrained decoding token for token, and seeded sampled answers
equal plain seeded ones (coupled verification makes them the same tokens). The sampled
distribution, and forced drafts the target rejects (a grammar that allows two tokenizations of
a forced string), are checked in test_sampling_distribution.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from tests.helpers.eagle_heads import random_head
from verispec import LLM, SamplingParams, SpecConfig, StructuredOutputsParams
from verispec.engine.step_drafts import StepDrafts
from verispec.models.eagle import EagleConfig, save_eagle_head
from verispec.models.weights.loader import load_model
from verispec.sample.grammar import JSON_FORMAT
from verispec.types.outputs import RequestOutput

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["customer_name", "order_number", "items_delivered"],
    "properties": {"customer_name": {"type": "string", "maxLength": 8},
                   "order_number": {"type": "integer", "minimum": 0, "maximum": 999},
                   "items_delivered": {"type": "array", "maxItems": 2,
                                       "items": {"enum": ["lamp", "desk", "chair"]}}},
}  # fmt: skip
ARGUMENTS = {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "x-guidance": JSON_FORMAT,
}  # fmt: skip
OPENING = '<tool_call>\n{"name": "lookup_weather", "arguments": '
TOOL_CALL = f"start: {json.dumps(OPENING)} args {json.dumps(chr(10) + '}</tool_call>')}\n" \
            f"args: %json {json.dumps(ARGUMENTS)}\n"  # fmt: skip
"""A forced tool call: its opening, the function's name and the argument keys are forced."""
CONSTRAINTS = [StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(grammar=TOOL_CALL)]
PROMPTS = ["def add(a, b):\n", "Order 12 for Ann:", "for i in"]
LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path, Path]:
    """(target, draft, EAGLE head): a sharp tiny Llama over the 320-token byte-level BPE, a
    perturbed copy as its draft model, and a random head over its features."""
    target = tmp_path_factory.mktemp("forced-target")
    draft = tmp_path_factory.mktemp("forced-draft")
    head = tmp_path_factory.mktemp("forced-head")
    model = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0)
    make_perturbed_copy(draft, model, tokenizer, 0.03)
    loaded = load_model(target, torch.float32, torch.device("cpu"), "torch")
    config = EagleConfig.for_target(loaded.config, 256, LAYERS)
    trainable = random_head(config, loaded.embed, torch.arange(64, 320))
    save_eagle_head(config, trainable.state_for_export(), head, torch.float32)
    return target, draft, head


def spec_of(method: str, pair: tuple[Path, Path, Path]) -> SpecConfig:
    """Each drafter family, with settings that draft several tokens a step."""
    _, draft, head = pair
    return {
        "draft_model": SpecConfig(method="draft_model", model=str(draft),
                                  num_speculative_tokens=3),
        "ngram": SpecConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_min=1),
        "suffix": SpecConfig(method="suffix", num_speculative_tokens=4),
        "self": SpecConfig(method="self", num_speculative_tokens=3, self_skip_layers=(1,)),
        "eagle": SpecConfig(method="eagle", model=str(head), num_speculative_tokens=3),
        "eagle_tree": SpecConfig(method="eagle", model=str(head), num_speculative_tokens=8,
                                 tree_topk=2, tree_depth=3),
    }[method]  # fmt: skip


def requests(temperature: float) -> tuple[list[str], list[SamplingParams]]:
    prompts, params = [], []
    for i, spec in enumerate(CONSTRAINTS):
        for j, prompt in enumerate(PROMPTS):
            prompts.append(prompt)
            params.append(SamplingParams(temperature=temperature, max_tokens=120,
                                         seed=10 * i + j, structured_outputs=spec))  # fmt: skip
    return prompts, params


@pytest.fixture(scope="module")
def plain(pair: tuple[Path, Path, Path]) -> dict[float, list[RequestOutput]]:
    """Plain constrained decoding of the target, greedy and seeded at T = 1."""
    llm = LLM(model=str(pair[0]), batch_invariant=True, speculative=None)
    out = {t: llm.generate(*requests(t)) for t in (0.0, 1.0)}
    assert llm.engine.spec_stats.num_forced_tokens == 0  # plain decoding drafts nothing
    return out


def check(out: RequestOutput, params: SamplingParams) -> None:
    """A finished answer matches its constraint."""
    assert out.finish_reason == "stop", out.text
    spec = params.structured_outputs
    assert spec is not None
    if spec.json is not None:
        jsonschema.validate(json.loads(out.text), spec.json)
    else:
        assert out.text.startswith(OPENING) and out.text.endswith("\n}</tool_call>")
        arguments = json.loads(out.text.removeprefix(OPENING).removesuffix("\n}</tool_call>"))
        jsonschema.validate(arguments, ARGUMENTS)


METHODS = ["draft_model", "ngram", "suffix", "self", "eagle", "eagle_tree"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
def test_answers_with_forced_drafts_equal_plain_constrained_decoding(
    pair: tuple[Path, Path, Path], plain: dict[float, list[RequestOutput]], method: str,
    temperature: float,
) -> None:  # fmt: skip
    prompts, params = requests(temperature)
    llm = LLM(model=str(pair[0]), batch_invariant=True, speculative=spec_of(method, pair))
    out = llm.generate(prompts, params)
    for o, r, p in zip(out, plain[temperature], params, strict=True):
        assert o.token_ids == r.token_ids, (method, o.text, r.text)
        check(o, p)
    stats = llm.engine.spec_stats
    assert stats.num_forced_tokens > 0 and stats.num_accepted_forced_tokens > 0
    assert stats.num_draft_tokens > stats.num_forced_tokens  # the drafter drafted as well


def test_drafters_that_read_only_tokens_draft_on_after_forced_tokens(
    pair: tuple[Path, Path, Path],
) -> None:
    """The draft model (and prompt lookup) are handed the history with the forced tokens
    appended: some step verifies forced drafts followed by the drafter's own."""
    llm = LLM(model=str(pair[0]), speculative=spec_of("draft_model", pair))
    engine = llm.engine
    assert engine.capabilities.continues_forced is not None
    steps: list[StepDrafts] = []
    propose = engine._propose
    engine._propose = lambda plan: steps.append(propose(plan)) or steps[-1]  # type: ignore[method-assign]
    llm.generate(*requests(0.0))
    both = sum(0 < f < len(ids) for d in steps
               for f, ids in zip(d.forced(range(len(d.token_ids))), d.token_ids, strict=True))
    assert both > 0


def test_a_feature_drafter_drafts_only_where_nothing_is_forced(
    pair: tuple[Path, Path, Path],
) -> None:
    llm = LLM(model=str(pair[0]), speculative=spec_of("eagle", pair))
    assert llm.engine.capabilities.continues_forced is None
    prompts, params = requests(0.0)
    llm.generate(prompts, params)
    assert llm.engine.spec_stats.num_forced_tokens > 0


def test_a_request_with_speculation_off_gets_no_forced_drafts(
    pair: tuple[Path, Path, Path], plain: dict[float, list[RequestOutput]],
) -> None:  # fmt: skip
    llm = LLM(model=str(pair[0]), batch_invariant=True, speculative=spec_of("ngram", pair))
    prompts, params = requests(0.0)
    off = [replace(p, speculative=False) for p in params]
    out = llm.generate(prompts, off)
    assert [o.token_ids for o in out] == [r.token_ids for r in plain[0.0]]
    assert llm.engine.spec_stats.num_draft_tokens == 0


def test_logprobs_with_forced_drafts_are_plain_decodings(
    pair: tuple[Path, Path, Path],
) -> None:
    """Each emitted token's logprob and top alternatives, forced drafts on, are the ones plain
    constrained decoding reports (batch-invariant rows: equal, not close)."""
    prompts, params = requests(0.0)
    params = [replace(p, logprobs=3) for p in params]
    plain = LLM(model=str(pair[0]), batch_invariant=True, speculative=None)
    spec = LLM(model=str(pair[0]), batch_invariant=True, speculative=spec_of("ngram", pair))
    for o, r in zip(spec.generate(prompts, params), plain.generate(prompts, params), strict=True):
        assert o.token_ids == r.token_ids and o.logprobs == r.logprobs
    assert spec.engine.spec_stats.num_accepted_forced_tokens > 0
