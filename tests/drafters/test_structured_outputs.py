"""Structured output stays lossless with speculation (docs/design.md, 3): every answer matches
its constraint, greedy answers with drafts equal those without, and after every step a
request's matcher is where a fresh one that consumed its output would be, however many drafts
were rejected. The sampled distribution under a grammar is checked in
test_sampling_distribution.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from tests.helpers.drafting import assert_partial
from verispec import LLM, SamplingParams, SpecConfig, StructuredOutputsParams
from verispec.engine.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
     "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}}},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
     "properties": {"name": {"type": "string", "maxLength": 6},
                    "tags": {"type": "array", "maxItems": 2,
                             "items": {"type": "string", "maxLength": 3}}}},
    {"type": "object", "additionalProperties": False, "required": ["point"],
     "properties": {"point": {"type": "object", "additionalProperties": False,
                              "required": ["x", "y"],
                              "properties": {"x": {"type": "number", "minimum": -9,
                                                   "maximum": 9},
                                             "y": {"enum": [1, 2, 3]}}}}},
]  # fmt: skip
REGEX = r"(def|class) [a-z_]{1,8}\((x|y)?\):"
CHOICE = ["return a + b", "return a - b", "pass"]
PROMPTS = ["def add(a, b):\n", "class Point:\n    def __init__(self, x, y):\n", "for i in"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """A sharp tiny Llama over the 320-token byte-level BPE, and a perturbed draft."""
    target = tmp_path_factory.mktemp("so-target")
    draft = tmp_path_factory.mktemp("so-draft")
    model = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0)
    make_perturbed_copy(draft, model, tokenizer, 0.03)
    return target, draft


def constraints() -> list[StructuredOutputsParams]:
    return [*(StructuredOutputsParams(json=s) for s in SCHEMAS),
            StructuredOutputsParams(json_object=True), StructuredOutputsParams(regex=REGEX),
            StructuredOutputsParams(choice=CHOICE)]  # fmt: skip


def check(text: str, finish_reason: str | None, spec: StructuredOutputsParams) -> None:
    """The answer is complete and matches; json_object's (any object) only when it finished,
    since a random tiny model may write one key for ever."""
    if spec.json_object and finish_reason == "length":
        return
    assert finish_reason == "stop", (text, spec)
    if spec.json is not None:
        jsonschema.validate(json.loads(text), spec.json)
    elif spec.json_object:
        assert isinstance(json.loads(text), dict), text
    elif spec.regex is not None:
        assert re.fullmatch(spec.regex, text), text
    else:
        assert text in CHOICE, text


def requests(temperature: float) -> tuple[list[str], list[SamplingParams]]:
    prompts, params = [], []
    for i, spec in enumerate(constraints()):
        for j, prompt in enumerate(PROMPTS):
            prompts.append(prompt)
            params.append(SamplingParams(temperature=temperature, max_tokens=160,
                                         seed=10 * i + j, structured_outputs=spec))  # fmt: skip
    return prompts, params


def spec_of(method: str, draft: Path) -> SpecConfig:
    if method == "draft_model":
        return SpecConfig(method=method, model=str(draft), num_speculative_tokens=3)
    return SpecConfig(method=method, num_speculative_tokens=4, prompt_lookup_min=1)


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_greedy_constrained_output_with_drafts_equals_plain_and_matches(
    pair: tuple[Path, Path], method: str
) -> None:
    prompts, params = requests(0.0)
    plain = LLM(model=str(pair[0]), batch_invariant=True, speculative=None)
    ref = plain.generate(prompts, params)
    llm = LLM(model=str(pair[0]), batch_invariant=True, speculative=spec_of(method, pair[1]))
    out = llm.generate(prompts, params)
    for o, r, p in zip(out, ref, params, strict=True):
        assert o.token_ids == r.token_ids
        check(o.text, o.finish_reason, p.structured_outputs)
    assert_partial(llm)


def test_sampled_constrained_output_with_drafts_matches(pair: tuple[Path, Path]) -> None:
    prompts, params = requests(1.0)
    llm = LLM(model=str(pair[0]), speculative=spec_of("draft_model", pair[1]))
    for o, p in zip(llm.generate(prompts, params), params, strict=True):
        check(o.text, o.finish_reason, p.structured_outputs)
    assert_partial(llm)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_matcher_after_each_step_is_where_plain_decoding_leaves_it(
    pair: tuple[Path, Path], temperature: float
) -> None:
    """After every step (drafts accepted, rejected and rolled back, or cut), each live
    request's next mask equals a fresh matcher's after the request's output."""
    llm = LLM(model=str(pair[0]), speculative=spec_of("draft_model", pair[1]))
    engine: Engine = llm.engine
    prompts, params = requests(temperature)
    live = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        for r in live:
            if r.finished:
                continue
            assert r.grammar is not None and r.params.structured_outputs is not None
            fresh = engine.grammars.matcher(r.params.structured_outputs)
            for token in r.output_token_ids:
                fresh.advance(token)
            assert (r.grammar.masks([[]]) == fresh.masks([[]])).all(), (steps, r.request_id)
    assert steps > 5
    assert_partial(llm)


def test_a_bad_constraint_is_refused_when_added(pair: tuple[Path, Path]) -> None:
    llm = LLM(model=str(pair[0]), speculative=None)
    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed"))
    with pytest.raises(ValueError, match="regex is invalid"):
        llm.generate(["def"], bad)
    assert not llm.engine.has_unfinished()
