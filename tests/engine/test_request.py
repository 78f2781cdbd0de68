"""Request.append_tokens: every way a request ends, stop-string text and per-token metrics.

No model: requests are built by hand and text comes from a fake decoder, one letter per token
(token i -> chr(97 + i % 26), so 0 -> "a", 2 -> "c", 26 -> "a").
"""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from verispec.engine import request as request_module
from verispec.engine.request import Request, Status, noise_key
from verispec.kv import BlockAllocator, BlockTable
from verispec.sample.noise import NoiseKey
from verispec.types.sampling_params import SamplingParams

EOS = 99


def decode(ids: list[int]) -> str:
    return "".join(chr(97 + i % 26) for i in ids)


def make_request(
    prompt: list[int] | None = None, max_model_len: int = 64, **params: Any
) -> Request:
    return Request(
        request_id="r",
        prompt=None,
        prompt_token_ids=[0, 1, 2] if prompt is None else prompt,
        params=SamplingParams(**params),
        block_table=BlockTable(BlockAllocator(16), block_size=4),
        eos_token_ids=frozenset({EOS}),
        max_model_len=max_model_len,
    )


def test_new_request_is_waiting_and_unfinished() -> None:
    r = make_request(prompt=[5, 6, 7])
    assert r.status is Status.WAITING and not r.finished
    assert (r.num_tokens, r.all_token_ids, r.num_computed_tokens) == (3, [5, 6, 7], 0)
    out = r.output(decode)
    assert (out.text, out.token_ids, out.finish_reason, out.finished) == ("", [], None, False)


def test_tokens_accumulate_across_calls_until_max_tokens() -> None:
    r = make_request(max_tokens=4)
    r.append_tokens([3], decode)
    r.append_tokens([4, 5], decode)
    assert not r.finished and r.finish_reason is None
    assert r.output(decode).text == "def"  # unfinished: decoded on demand
    assert r.all_token_ids == [0, 1, 2, 3, 4, 5]
    r.append_tokens([6, 7, 8], decode)  # 6 is the 4th token: 7 and 8 are dropped
    assert r.finished and r.status is Status.FINISHED
    assert (r.output_token_ids, r.finish_reason, r.text) == ([3, 4, 5, 6], "length", "defg")


def test_eos_stops_and_is_excluded_from_text() -> None:
    r = make_request(max_tokens=10)
    r.append_tokens([3, 4, EOS, 5, 6], decode)
    assert (r.output_token_ids, r.finish_reason, r.text) == ([3, 4, EOS], "stop", "de")


def test_eos_as_first_token_gives_empty_text() -> None:
    r = make_request()
    r.append_tokens([EOS], decode)
    assert (r.output_token_ids, r.finish_reason, r.text) == ([EOS], "stop", "")


def test_ignore_eos_generates_through_eos() -> None:
    r = make_request(max_tokens=4, ignore_eos=True)
    r.append_tokens([3, EOS, 4, 5, 6], decode)
    assert (r.output_token_ids, r.finish_reason) == ([3, EOS, 4, 5], "length")
    assert r.text == decode([3, EOS, 4, 5])


def test_stop_token_id_stops_and_is_excluded_from_text() -> None:
    r = make_request(max_tokens=10, stop_token_ids=[7, 8])
    r.append_tokens([3, 4, 8, 7, 5], decode)
    assert (r.output_token_ids, r.finish_reason, r.text) == ([3, 4, 8], "stop", "de")


def test_stop_token_id_stops_even_with_ignore_eos() -> None:
    r = make_request(max_tokens=10, stop_token_ids=[EOS], ignore_eos=True)
    r.append_tokens([3, EOS, 4], decode)
    assert (r.output_token_ids, r.finish_reason) == ([3, EOS], "stop")


@pytest.mark.parametrize(("include", "text"), [(False, "ab"), (True, "abcd")])
def test_stop_string_spanning_two_tokens(include: bool, text: str) -> None:
    r = make_request(max_tokens=10, stop="cd", include_stop_str_in_output=include)
    r.append_tokens([0, 1, 2], decode)  # "abc": "c" alone is no stop
    assert not r.finished
    r.append_tokens([3, 4, 5], decode)  # "d" completes "cd"; 4 and 5 are dropped
    assert (r.output_token_ids, r.finish_reason, r.text) == ([0, 1, 2, 3], "stop", text)
    assert r.output(decode).text == text


def test_stop_string_inside_a_token_cuts_that_token_text() -> None:
    words = {0: "hello", 1: " wor", 2: "ld!", 3: "?"}

    def decode_words(ids: list[int]) -> str:
        return "".join(words[i] for i in ids)

    r = make_request(max_tokens=10, stop=["rl", "zz"])
    r.append_tokens([0, 1, 2, 3], decode_words)
    assert (r.output_token_ids, r.finish_reason, r.text) == ([0, 1, 2], "stop", "hello wo")


def test_earliest_stop_string_wins() -> None:
    r = make_request(max_tokens=10, stop=["ef", "de"], include_stop_str_in_output=True)
    r.append_tokens([2, 3, 4, 5], decode)  # "cdef": "de" is complete at "e", before "ef"
    assert (r.output_token_ids, r.text) == ([2, 3, 4], "cde")


def test_stop_string_on_the_last_allowed_token_is_a_stop() -> None:
    r = make_request(max_tokens=2, stop="ab")
    r.append_tokens([0, 1], decode)
    assert (r.finish_reason, r.text) == ("stop", "")


def test_eos_before_stop_string_and_max_tokens() -> None:
    r = make_request(max_tokens=1, stop="a")
    r.append_tokens([EOS], decode)
    assert (r.finish_reason, r.text) == ("stop", "")


def test_max_model_len_ends_with_length() -> None:
    r = make_request(prompt=[0, 1, 2, 3, 4], max_model_len=8, max_tokens=100)
    r.append_tokens([5, 6], decode)
    assert not r.finished
    r.append_tokens([7, 8, 9], decode)
    assert (r.output_token_ids, r.num_tokens, r.finish_reason) == ([5, 6, 7], 8, "length")
    assert r.text == "fgh"


def test_output_snapshot_copies_token_ids() -> None:
    r = make_request(max_tokens=3)
    r.append_tokens([3, 4, 5], decode)
    out = r.output(decode)
    assert (out.request_id, out.prompt_token_ids, out.token_ids) == ("r", [0, 1, 2], [3, 4, 5])
    assert (out.text, out.finish_reason, out.finished) == ("def", "length", True)
    out.token_ids.append(6)
    assert r.output_token_ids == [3, 4, 5]


class _Clock:
    """Stands in for the `time` module inside request.py: perf_counter returns preset times."""

    def __init__(self, *times: float) -> None:
        self._times = iter(times)
        self.perf_counter = lambda: next(self._times)


def test_metrics_follow_token_times(monkeypatch: pytest.MonkeyPatch) -> None:
    # One call per step at t = 1.0, 1.5, 2.0 (two tokens), 2.25; the request arrived at t = 0.
    monkeypatch.setattr(request_module, "time", _Clock(1.0, 1.5, 2.0, 2.25))
    r = make_request(max_tokens=5)
    r.arrival_time = 0.0
    assert r.metrics().ttft_s is None and r.metrics().itl_s == [] and r.metrics().e2e_s is None
    r.append_tokens([3], decode)
    r.append_tokens([4], decode)
    r.append_tokens([5, 6], decode)
    m = r.metrics()
    assert (m.num_prompt_tokens, m.num_output_tokens) == (3, 4)
    assert (m.ttft_s, m.itl_s, m.e2e_s, m.tokens_per_s) == (1.0, [0.5, 0.5, 0.0], None, None)
    r.append_tokens([7, 8], decode)  # 7 is the 5th token; 8 is dropped
    m = r.metrics()
    assert (m.ttft_s, m.itl_s) == (1.0, [0.5, 0.5, 0.0, 0.25])
    assert m.e2e_s == 2.25
    assert m.tokens_per_s == pytest.approx(5 / 2.25)
    assert m.to_dict()["tokens_per_s"] == m.tokens_per_s


def test_metrics_with_real_clock_are_consistent() -> None:
    r = make_request(max_tokens=6)
    for token in range(3, 9):
        r.append_tokens([token], decode)
    m = r.output(decode).metrics
    assert m.num_output_tokens == 6 and len(m.itl_s) == 5
    assert m.ttft_s is not None and m.ttft_s >= 0 and all(gap >= 0 for gap in m.itl_s)
    assert m.e2e_s == pytest.approx(m.ttft_s + sum(m.itl_s))
    assert m.tokens_per_s is None or m.tokens_per_s > 0


def test_decodes_worked_example() -> None:
    assert doctest.testmod(request_module).failed == 0


def test_noise_key_is_the_seed_and_the_output_position() -> None:
    """A seeded request's next token is keyed by its seed and its output length (the prompt
    does not count), a draft or verify row j later by j more; no seed: no key."""
    r = make_request(prompt=[5, 6, 7, 8], seed=2**64 - 1, max_tokens=8)
    assert noise_key(r) == NoiseKey(2**64 - 1, 0)
    r.append_tokens([9, 10], decode)
    assert noise_key(r) == NoiseKey(2**64 - 1, 2) and noise_key(r, 3) == NoiseKey(2**64 - 1, 5)
    assert noise_key(make_request()) is None
