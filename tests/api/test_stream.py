"""Streaming (verispec/api/stream.py): incremental detokenizing that never takes text back, deltas
per engine step that add up to generate()'s output, and early stops that free the KV cache."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from tests.helpers.chat import CONVERSATION, make_chat_checkpoint
from tests.helpers.checkpoints import SPEC_PAIRS
from verispec import LLM, SamplingParams
from verispec.api.stream import REPLACEMENT, TextStream, stable_text
from verispec.types.outputs import StreamDelta

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

PROMPT = "for i in range(10):"
LONG = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(llama_checkpoint: Path) -> LLM:
    return LLM(model=str(llama_checkpoint))


def collect(stream) -> tuple[str, list[int], list[StreamDelta]]:
    """(concatenated text, concatenated token ids, the deltas) of a whole stream."""
    deltas = list(stream)
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids], deltas


def assert_nothing_held(llm: LLM) -> None:
    assert not llm.engine.has_unfinished()
    assert llm.engine.allocator.num_used == 0


@pytest.mark.parametrize(
    ("text", "hold_back", "whitespace", "stable"),
    [
        ("caf" + REPLACEMENT, 0, False, "caf"),
        ("a" + REPLACEMENT * 2, 0, False, "a"),
        (REPLACEMENT + "b", 0, False, REPLACEMENT + "b"),  # a bad byte that stays bad
        ("say STO", 2, False, "say S"),
        ("ab", 5, False, ""),
        ("x = 1 ", 0, True, "x = 1"),
        ("x = 1 ", 0, False, "x = 1 "),
    ],
)
def test_stable_text(text: str, hold_back: int, whitespace: bool, stable: str) -> None:
    assert stable_text(text, hold_back, whitespace) == stable


def test_multibyte_characters_split_over_tokens_are_never_cut(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    text = "déjà vu: 3 € ≠ 3 ¥"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # the corpus has none of these, so they split into byte tokens
    stream = TextStream(lambda i: tokenizer.decode(i, skip_special_tokens=True))
    deltas = [stream.update(ids[:n]) for n in range(1, len(ids) + 1)]
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == text
    assert stream.finish(text) == ""


def test_finish_releases_the_rest_and_follows_a_rewritten_decode() -> None:
    stream = TextStream(lambda ids: "ab c"[: len(ids)], hold_back=1)
    assert [stream.update([0] * n) for n in (1, 2, 3)] == ["", "a", "b"]
    assert stream.finish("ab") == ""  # cut at a stop string that started with " "
    rewritten = TextStream(lambda ids: "a ,"[: len(ids)])
    assert rewritten.update([0, 0]) == "a "
    assert rewritten.finish("a,") == ","  # cannot take back " ": the rest after "a"


def test_deltas_add_up_to_the_generate_output(llm: LLM) -> None:
    (expected,) = llm.generate(PROMPT, LONG)
    text, ids, deltas = collect(llm.generate_stream(PROMPT, LONG))
    assert (text, ids) == (expected.text, expected.token_ids)
    assert all(d.token_ids for d in deltas) and len(deltas) == len(ids)  # plain: 1 per step
    *steps, last = deltas
    assert all(d.output is None and not d.finished for d in steps)
    assert last.finished and last.finish_reason == "length" and last.output is not None
    assert (last.output.text, last.output.prompt) == (expected.text, PROMPT)
    assert last.output.metrics.tokens_per_s is not None
    assert_nothing_held(llm)


def test_stop_string_is_never_streamed(llm: LLM) -> None:
    full = llm.generate(PROMPT, LONG)[0].text
    start = next(i for i in range(3, len(full) - 2) if full.find(full[i : i + 2]) == i)
    params = SamplingParams(temperature=0.0, max_tokens=24, stop=full[start : start + 2])
    text, _, deltas = collect(llm.generate_stream(PROMPT, params))
    assert text == full[:start] == deltas[-1].output.text
    assert deltas[-1].finish_reason == "stop"


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_speculative_steps_stream_all_their_accepted_tokens(spec_pair) -> None:
    target, draft = spec_pair
    llm = LLM(model=str(target), speculative={"model": str(draft), "num_speculative_tokens": 4})
    (expected,) = llm.generate(PROMPT, LONG)
    text, ids, deltas = collect(llm.generate_stream(PROMPT, LONG))
    assert (text, ids) == (expected.text, expected.token_ids)
    assert max(len(d.token_ids) for d in deltas) > 1  # accepted drafts arrive with their step
    spec = deltas[-1].output.metrics.spec
    assert spec.num_verify_steps > 0 and deltas[-1].output.metrics.acceptance_rate is not None
    # which tokens were accepted drafts: each step's drafts, then the target's own token
    assert sum(d.num_accepted for d in deltas) == spec.num_accepted_tokens > 0
    assert sum(d.num_draft_tokens for d in deltas) == spec.num_draft_tokens
    assert all(len(d.token_ids) - d.num_accepted == 1 for d in deltas)  # no step was cut short
    assert all(d.text.startswith(d.accepted_text) for d in deltas)
    assert any(d.accepted_text for d in deltas)
    assert all(d.accepted_text == "" for d in deltas if d.num_accepted == 0)


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_a_step_of_drafts_cut_by_a_stop_counts_only_what_was_emitted(spec_pair) -> None:
    target, draft = spec_pair
    llm = LLM(model=str(target), speculative={"model": str(draft), "num_speculative_tokens": 4})
    full = llm.generate(PROMPT, LONG)[0]
    stop = LONG.__class__(temperature=0.0, max_tokens=24, ignore_eos=True,
                          stop_token_ids=[full.token_ids[6]])  # fmt: skip
    text, ids, deltas = collect(llm.generate_stream(PROMPT, stop))
    assert ids == full.token_ids[: full.token_ids.index(full.token_ids[6]) + 1]
    assert all(0 <= d.num_accepted <= len(d.token_ids) for d in deltas)
    assert "".join(d.text for d in deltas) == text


def test_interleaved_streams_each_add_up(llm: LLM) -> None:
    streams = [llm.generate_stream(PROMPT, LONG), llm.generate_stream("class", LONG)]
    deltas: list[list[StreamDelta]] = [[], []]
    while not all(d and d[-1].finished for d in deltas):
        for stream, got in zip(streams, deltas, strict=True):
            if not (got and got[-1].finished):
                got.append(next(stream))
    expected = llm.generate([PROMPT, "class"], LONG)
    for got, want in zip(deltas, expected, strict=True):
        assert "".join(d.text for d in got) == want.text
        assert got[-1].output.token_ids == want.token_ids
    assert_nothing_held(llm)


def test_stopping_early_aborts_the_request(llm: LLM) -> None:
    with llm.generate_stream(PROMPT, LONG) as stream:
        for delta in stream:
            assert not delta.finished
            break
    assert_nothing_held(llm)
    stream = llm.generate_stream(PROMPT, LONG)
    next(stream)
    stream.close()
    assert list(stream) == []
    assert_nothing_held(llm)
    llm.generate_stream(PROMPT, LONG).close()  # never iterated
    assert_nothing_held(llm)
    abandoned = llm.generate_stream(PROMPT, LONG)
    next(abandoned)
    del abandoned
    gc.collect()
    assert_nothing_held(llm)
    assert llm.generate(PROMPT, LONG)[0].token_ids == collect(llm.generate_stream(PROMPT, LONG))[1]


def test_chat_stream_equals_chat(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> None:
    llm = LLM(model=str(make_chat_checkpoint(tmp_path_factory.mktemp("chat"), tokenizer)))
    (expected,) = llm.chat(CONVERSATION, LONG)
    text, ids, deltas = collect(llm.chat_stream(CONVERSATION, LONG))
    assert (text, ids) == (expected.text, expected.token_ids)
    assert deltas[-1].output.prompt == expected.prompt


def test_stream_takes_one_prompt_or_conversation(llm: LLM) -> None:
    with pytest.raises(ValueError, match="generate_stream takes one prompt, got 2"):
        llm.generate_stream(["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chat_stream takes one conversation, got 2"):
        conversation = [{"role": "user", "content": "x"}]
        llm.chat_stream([conversation, conversation])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampling_params must be one SamplingParams"):
        llm.generate_stream("a", [LONG])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got bytes"):
        llm.generate_stream(b"abc")  # type: ignore[arg-type]
    assert_nothing_held(llm)
