"""LLM: the offline API end to end on a tiny random Llama (outputs, stopping, bad input) and
the default demo model."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from verispec import LLM, SamplingParams, SpecConfig
from verispec.spec.resolve import resolve_speculative

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
LONG = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPT = "for i in range(10):"


@pytest.fixture(scope="module")
def llm(llama_checkpoint: Path) -> LLM:
    return LLM(model=str(llama_checkpoint))


def decode(llm: LLM, ids: list[int]) -> str:
    return llm.engine.tokenizer.decode(ids)


def test_request_output_fields(llm: LLM) -> None:
    (out,) = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert out.prompt == PROMPT
    assert out.prompt_token_ids == llm.tokenizer.encode(PROMPT)
    assert out.prompt_token_ids[0] == 0  # BOS
    assert len(out.token_ids) == 5 and all(0 <= t < 320 for t in out.token_ids)
    assert out.text == decode(llm, out.token_ids)
    assert out.finish_reason == "length" and out.finished
    m = out.metrics
    assert (m.num_prompt_tokens, m.num_output_tokens) == (len(out.prompt_token_ids), 5)
    assert m.ttft_s is not None and m.ttft_s > 0
    assert isinstance(m.itl_s, list) and len(m.itl_s) == 4 and all(g >= 0 for g in m.itl_s)
    assert m.e2e_s == pytest.approx(m.ttft_s + sum(m.itl_s))
    assert m.tokens_per_s == pytest.approx(5 / m.e2e_s)
    assert m.to_dict()["tokens_per_s"] == m.tokens_per_s


def test_prompt_forms(llm: LLM) -> None:
    ids = llm.tokenizer.encode(PROMPT)
    from_text = llm.generate(PROMPT, GREEDY)
    assert len(from_text) == 1
    from_ids = llm.generate(ids, GREEDY)  # a flat list of ints is one prompt
    assert len(from_ids) == 1 and from_ids[0].prompt is None
    assert from_ids[0].token_ids == from_text[0].token_ids
    both = llm.generate([PROMPT, ids, "class"], GREEDY)
    assert [o.token_ids for o in both[:2]] == [from_text[0].token_ids] * 2
    assert [o.prompt for o in both] == [PROMPT, None, "class"]
    assert len({o.request_id for o in both}) == 3


def test_default_params_and_progress_bar(llm: LLM) -> None:
    outputs = llm.generate(["class", "def"], use_tqdm=True)
    assert len(outputs) == 2
    assert all(len(o.token_ids) <= SamplingParams().max_tokens for o in outputs)
    assert all(o.finished for o in outputs)


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_is_honoured(llm: LLM, max_tokens: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=1)
    for out in llm.generate([PROMPT, "def", [0, 9]], [params, sampled, params]):
        assert (len(out.token_ids), out.finish_reason) == (max_tokens, "length")


def test_per_prompt_params(llm: LLM) -> None:
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    outputs = llm.generate([PROMPT, PROMPT], [short, LONG])
    assert [len(o.token_ids) for o in outputs] == [2, 24]
    assert outputs[1].token_ids[:2] == outputs[0].token_ids


@pytest.fixture(scope="module")
def eos_case(llm: LLM) -> tuple[list[int], list[int]]:
    """A prompt whose greedy continuation ends with EOS (id 1) within 20 tokens, and it."""
    prompts = [[0, i] for i in range(3, 24)]
    params = SamplingParams(temperature=0.0, max_tokens=20)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        if out.finish_reason == "stop" and len(out.token_ids) >= 3:
            return prompt, out.token_ids
    pytest.fail("no prompt in [[0, 3] .. [0, 23]] makes the tiny model emit EOS")


def test_eos_stops_generation(llm: LLM, eos_case: tuple[list[int], list[int]]) -> None:
    prompt, ids = eos_case
    assert ids[-1] == 1 and 1 not in ids[:-1]
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=30))[0]
    assert out.token_ids == ids and out.finish_reason == "stop"
    assert out.text == decode(llm, ids[:-1])


def test_ignore_eos_generates_past_eos(llm: LLM, eos_case: tuple[list[int], list[int]]) -> None:
    prompt, ids = eos_case
    params = SamplingParams(temperature=0.0, max_tokens=len(ids) + 5, ignore_eos=True)
    out = llm.generate(prompt, params)[0]
    assert out.token_ids[: len(ids)] == ids
    assert (len(out.token_ids), out.finish_reason) == (len(ids) + 5, "length")


def test_stop_token_ids(llm: LLM) -> None:
    full = llm.generate(PROMPT, LONG)[0].token_ids
    index = next(i for i in range(2, len(full)) if full[i] not in full[:i])
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[full[index], 319])
    out = llm.generate(PROMPT, params)[0]
    assert (out.token_ids, out.finish_reason) == (full[: index + 1], "stop")
    assert out.text == decode(llm, full[:index])


def test_stop_token_id_can_force_an_eos_like_stop(llm: LLM) -> None:
    full = llm.generate(PROMPT, LONG)[0].token_ids
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[full[0]])
    out = llm.generate(PROMPT, params)[0]
    assert (out.token_ids, out.text, out.finish_reason) == ([full[0]], "", "stop")


def stop_string_case(llm: LLM, ids: list[int]) -> tuple[str, int]:
    """A two-character stop string made of the last character of token i and the first of
    token i + 1 (both printable ASCII), absent from every earlier prefix; returns (stop, i + 1)."""
    pieces = [decode(llm, [t]) for t in ids]
    for i in range(len(ids) - 1):
        a, b = pieces[i], pieces[i + 1]
        if not (a and b and a[-1].isascii() and b[0].isascii()):
            continue
        stop = a[-1] + b[0]
        if stop.isprintable() and all(stop not in decode(llm, ids[:j]) for j in range(i + 2)):
            if stop in decode(llm, ids[: i + 2]):
                return stop, i + 1
    pytest.fail(f"no two-token ASCII stop string in {pieces!r}")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_two_tokens(llm: LLM, include: bool) -> None:
    full = llm.generate(PROMPT, LONG)[0].token_ids
    stop, last = stop_string_case(llm, full)
    params = SamplingParams(
        temperature=0.0, max_tokens=24, stop=[stop, "never appears"],
        include_stop_str_in_output=include,
    )  # fmt: skip
    out = llm.generate(PROMPT, params)[0]
    assert (out.token_ids, out.finish_reason) == (full[: last + 1], "stop")
    text = decode(llm, full[: last + 1])
    end = text.index(stop) + (len(stop) if include else 0)
    assert out.text == text[:end]
    assert out.text.endswith(stop) == include


def test_stop_string_that_never_appears_runs_to_max_tokens(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, stop="\u2603", ignore_eos=True)
    out = llm.generate(PROMPT, params)[0]
    assert (len(out.token_ids), out.finish_reason) == (8, "length")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([0] + [5] * 300, "max_model_len"),
        ([0] + [5] * 255, "max_model_len"),  # 256 tokens leave no room for an output token
        ([], "empty"),
        ([0, 320], "outside the vocabulary"),
        ([0, -1], "outside the vocabulary"),
        ([0, 1.5], "integer token ids"),
        ([0, "a"], "integer token ids"),
        ([0, True], "integer token ids"),
    ],
)
def test_bad_token_prompt_is_a_value_error(llm: LLM, prompt: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], GREEDY)


@pytest.mark.parametrize("prompts", [42, None, 3.5, [3.5], [(0, 5)], [b"bytes"], ["a", {"b": 1}]])
def test_prompt_that_is_neither_text_nor_ids_is_a_value_error(llm: LLM, prompts: object) -> None:
    with pytest.raises(ValueError, match="prompt"):
        llm.generate(prompts, GREEDY)  # type: ignore[arg-type]


def test_no_prompts_is_a_value_error(llm: LLM) -> None:
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([], GREEDY)


def test_wrong_number_of_params_is_a_value_error(llm: LLM) -> None:
    with pytest.raises(ValueError, match="got 3 SamplingParams for 2 prompts"):
        llm.generate(["a", "b"], [GREEDY] * 3)
    with pytest.raises(ValueError, match="got 1 SamplingParams for 2 prompts"):
        llm.generate(["a", "b"], [GREEDY])


def test_failed_generate_leaves_nothing_queued(llm: LLM) -> None:
    """A bad prompt late in a batch must not leave the good ones queued for the next call."""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([PROMPT, "class", [0, 999]], GREEDY)
    assert not llm.engine.has_unfinished()
    assert llm.engine.allocator.num_used == 0
    (out,) = llm.generate(PROMPT, LONG)
    assert out.token_ids == llm.generate(PROMPT, LONG)[0].token_ids


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_sampling_params_are_value_errors(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_size": 4, "num_blocks": 15, "max_model_len": 64}, "needs 16 blocks"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"kv_cache_memory": 0}, "kv_cache_memory must be a number of bytes"),
        ({"kv_cache_memory": 2.5e6}, "kv_cache_memory must be a number of bytes"),
        ({"kv_cache_memory": 1000, "max_model_len": 64}, r"kv_cache_memory=1000 .* cannot hold "
         r"one sequence of max_model_len=64: that needs 4 blocks"),
        ({"kv_cache_memory": 2**20, "num_blocks": 16}, "num_blocks or kv_cache_memory, not both"),
        ({"kv_cache_memory": 2**60}, "of memory are available on cpu; give a smaller "
         "kv_cache_memory"),
        ({"block_size": 0}, "block_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"max_model_len": 1}, "max_model_len"),
        ({"dtype": "float8"}, "dtype"),
        ({"device": "tpu:x"}, "device"),
    ],
)
def test_bad_engine_options_are_value_errors(
    llama_checkpoint: Path, options: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(model=str(llama_checkpoint), **options)


def test_the_kv_pool_is_sized_from_its_memory_budget(llama_checkpoint: Path) -> None:
    """A budget gives as many whole blocks as fit, committed and reported; without one, the
    tiny model's max_num_seqs sequences of max_model_len (far below a tenth of the RAM)."""
    llm = LLM(model=str(llama_checkpoint), kv_cache_memory=1_000_000, max_model_len=64)
    engine = llm.engine
    block_bytes = engine.model.kv_token_bytes * 16
    assert engine.allocator.num_blocks == 1_000_000 // block_bytes
    memory = engine.kv_memory
    assert memory.target_bytes == engine.allocator.num_blocks * block_bytes <= 1_000_000
    assert memory.num_tokens == engine.allocator.num_blocks * 16 and memory.drafter_bytes == 0
    assert "committed" in memory.describe()
    assert len(llm.generate([PROMPT, "class"], GREEDY)) == 2
    default = LLM(model=str(llama_checkpoint), max_model_len=64, max_num_seqs=3).engine
    assert default.allocator.num_blocks == 3 * 4


def test_smallest_cache_that_holds_one_sequence_works(llama_checkpoint: Path) -> None:
    llm = LLM(model=str(llama_checkpoint), block_size=4, num_blocks=16, max_model_len=64)
    assert len(llm.generate([PROMPT, "class"], GREEDY)) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_a_value_error(llama_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        LLM(model=str(llama_checkpoint), device="cuda")


def test_missing_model_directory_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        LLM(model=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"no config\.json"):
        LLM(model=str(tmp_path))


def test_speculative_must_be_a_spec_config_none_or_auto(llama_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="SpecConfig, None or 'auto'"):
        LLM(model=str(llama_checkpoint), speculative="eagle")
    assert LLM(model=str(llama_checkpoint)).engine.config.speculative is None


@pytest.mark.parametrize("prompt", [b"def f():", bytearray(b"x"), memoryview(b"x")])
def test_bytes_prompt_is_a_value_error_not_token_ids(llm: LLM, prompt: object) -> None:
    with pytest.raises(ValueError, match=f"got {type(prompt).__name__}; decode bytes first"):
        llm.generate(prompt, GREEDY)  # type: ignore[arg-type]
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ("abc\udc80", r"^prompt is not valid UTF-8 text \(lone surrogate at index 3\)$"),
        (["ok", "x\ud800"], r"^prompt 1 is not valid UTF-8 text \(lone surrogate at index 1\)$"),
    ],
)
def test_text_with_lone_surrogates_is_a_value_error(
    llm: LLM, prompts: str | list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, GREEDY)
    assert not llm.engine.has_unfinished()


def test_speculative_takes_vllms_dict_form(llama_checkpoint: Path) -> None:
    options = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    llm = LLM(model=str(llama_checkpoint), speculative=options)
    object_form = resolve_speculative(str(llama_checkpoint), SpecConfig(**options))
    assert llm.engine.config.speculative == object_form  # the same, resolved
    assert len(llm.generate(PROMPT, GREEDY)[0].token_ids) >= 1


def test_unknown_speculative_key_lists_the_allowed_ones(llama_checkpoint: Path) -> None:
    allowed = ", ".join(f.name for f in fields(SpecConfig))
    message = f"speculative has unknown key(s) 'k', 'draft'; allowed: {allowed}"
    with pytest.raises(ValueError, match=re.escape(message)):
        LLM(model=str(llama_checkpoint), speculative={"method": "ngram", "k": 4, "draft": "x"})


@pytest.mark.parametrize("model", ["", "  "])
def test_empty_model_name_is_a_value_error(model: str) -> None:
    with pytest.raises(ValueError, match="model must not be empty"):
        LLM(model=model)
