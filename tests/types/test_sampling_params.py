"""SamplingParams: defaults, normalisation and one clear ValueError per bad input."""

import pytest

from verispec.types.sampling_params import SamplingParams


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (16, 1.0, 1.0, -1, 0.0)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.0, 0.0, 0.0)
    assert p.seed is None and p.stop == [] and p.stop_token_ids == []
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert not p.greedy and not p.needs_penalties


def test_stop_string_is_normalised_to_list() -> None:
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=["a", "bc"]).stop == ["a", "bc"]
    assert SamplingParams(stop_token_ids=[2, 0]).stop_token_ids == [2, 0]


def test_top_k_zero_means_disabled() -> None:
    assert SamplingParams(top_k=0).top_k == -1


@pytest.mark.parametrize(
    ("temperature", "greedy"), [(0.0, True), (1e-6, True), (1e-5, False), (0.7, False)]
)
def test_greedy_below_sampling_eps(temperature: float, greedy: bool) -> None:
    assert SamplingParams(temperature=temperature).greedy is greedy


@pytest.mark.parametrize(
    "kwargs",
    [{"repetition_penalty": 1.2}, {"presence_penalty": -0.5}, {"frequency_penalty": 0.1}],
)
def test_needs_penalties(kwargs: dict[str, float]) -> None:
    assert SamplingParams(**kwargs).needs_penalties


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, r"temperature must be >= 0 \(0 means greedy\), got -0.5"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -2}, r"top_k must be -1 or 0 \(disabled\) or >= 1, got -2"),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"max_tokens": 2.5}, "max_tokens must be an int, got 2.5"),
        ({"max_tokens": "3"}, "max_tokens must be an int, got '3'"),
        ({"max_tokens": True}, "max_tokens must be an int"),
        ({"top_k": 1.0}, "top_k must be an int"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
        ({"min_p": 1.1}, r"min_p must be in \[0, 1\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"repetition_penalty": -1.0}, "repetition_penalty must be > 0"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": -2.1}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"seed": 1.5}, "seed must be an int"),
        ({"seed": 2**64}, r"seed must be in \[0, 2\*\*64\)"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*64\)"),
        ({"stop_token_ids": [1, -3]}, r"stop_token_ids must be a list of ints >= 0"),
        ({"stop_token_ids": [1.0]}, "stop_token_ids entries must be an int"),
        ({"stop": ["ok", ""]}, "stop strings must be non-empty"),
        ({"stop": ""}, "stop strings must be non-empty"),
        ({"stop": [3]}, "stop must be a string or a list of strings"),
        ({"ignore_eos": 1}, "ignore_eos must be True or False"),
        ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output must be True or"),
    ],
)
def test_bad_input_raises_clear_value_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
