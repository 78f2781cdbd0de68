"""Sampling settings of one request, with the same names and meanings as vLLM's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_SAMPLING_EPS = 1e-5  # below this temperature a request is greedy (vLLM's _SAMPLING_EPS)


def _check_int(name: str, value: object) -> int:
    """Return `value` if it is a plain int (bool is not), else raise a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return value


def _check_float(name: str, value: object) -> float:
    """Return `value` as a finite float (int or float, not bool), else raise a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_bool(name: str, value: object) -> bool:
    """Return `value` if it is a bool, else raise a ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _normalise_stop(stop: list[str] | str | None) -> list[str]:
    """Turn `stop` (None, one string or a list of strings) into a list of non-empty strings."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list | tuple) or not all(isinstance(s, str) for s in items):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(s == "" for s in items):
        raise ValueError(f"stop strings must be non-empty, got {stop!r}")
    return list(items)


def _normalise_stop_token_ids(ids: list[int] | None) -> list[int]:
    """Turn `stop_token_ids` (None or a list of ints) into a list of token ids >= 0."""
    if ids is None:
        return []
    if not isinstance(ids, list | tuple):
        raise ValueError(f"stop_token_ids must be a list of ints >= 0, got {ids!r}")
    for i in ids:
        if _check_int("stop_token_ids entries", i) < 0:
            raise ValueError(f"stop_token_ids must be a list of ints >= 0, got {ids!r}")
    return list(ids)


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """What a request's output must match, vLLM's `structured_outputs`: exactly one of a JSON
    schema, any JSON object, a regular expression, one of fixed strings, or a grammar in
    llguidance's Lark dialect. The grammar's mask is part of the target's warping, so a
    constrained request samples the constrained distribution exactly (docs/design.md, 3)."""

    json: dict[str, Any] | str | None = None
    """A JSON schema (a dict, or its JSON text); the output is one JSON value it accepts."""
    json_object: bool = False
    """The output is any JSON object (OpenAI's response_format json_object)."""
    regex: str | None = None
    """The output matches this regular expression in full."""
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """A context-free grammar in llguidance's Lark syntax (it may embed `%json {...}`)."""

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None] + (["json_object"] if self.json_object
                                                         else [])  # fmt: skip
        if len(given) != 1:
            raise ValueError(
                "structured_outputs takes exactly one of json, json_object, regex, choice, "
                f"grammar; got {', '.join(given) or 'none'}"
            )
        if self.json is not None and not isinstance(self.json, dict | str):
            raise ValueError(f"structured_outputs.json must be a JSON schema (a dict or its JSON "
                             f"text), got {type(self.json).__name__}")  # fmt: skip
        _check_bool("structured_outputs.json_object", self.json_object)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got "
                                 f"{value!r}")  # fmt: skip
        if self.choice is not None and (
            not isinstance(self.choice, list | tuple) or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):  # fmt: skip
            raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty "
                             f"strings, got {self.choice!r}")  # fmt: skip


@dataclass(slots=True)
class SamplingParams:
    """vLLM-compatible sampling settings for one request."""

    max_tokens: int = 16
    """Most tokens to generate; >= 1."""
    temperature: float = 1.0
    """Softmax temperature; >= 0, and below 1e-5 (0 in practice) means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most probable tokens that cover top_p of the mass; (0, 1]."""
    top_k: int = -1
    """Keep the k most probable tokens; -1 or 0 disables (normalised to -1), else >= 1."""
    min_p: float = 0.0
    """Drop tokens less probable than min_p times the most probable one; [0, 1]."""
    repetition_penalty: float = 1.0
    """Divide positive (multiply negative) logits of tokens in prompt or output; > 0."""
    presence_penalty: float = 0.0
    """Subtract from the logit of every token already in the output; [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtract this times the token's count in the output from its logit; [-2, 2]."""
    seed: int | None = None
    """Fixes this request's sampling: the token at output position t is drawn with noise that
    is a function of (seed, t, token id) alone, so the same prompt, parameters and model give the
    same output whatever the batch, k or drafter (docs/design.md, 3); None draws from the
    engine's shared generator."""
    stop: list[str] | str | None = None
    """Strings that end generation; normalised to a list of non-empty strings."""
    stop_token_ids: list[int] | None = None
    """Token ids that end generation (besides EOS); normalised to a list."""
    ignore_eos: bool = False
    """Keep generating past the EOS token (benchmarks use this for fixed lengths)."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the output text."""
    logprobs: int | None = None
    """Return each output token's log-probability under the target (its log-softmax over the
    raw logits, before temperature and truncation, as vLLM's default), with this many most
    likely alternatives (0: the chosen token only); None = none."""
    speculative: bool = True
    """Let this request verify drafts when the engine speculates; False decodes it plainly (0
    drafts every step, whatever the engine's k or adaptive policy would give): the reference
    `verispec verify` compares speculative output with. verispec's extension (not vLLM's)."""
    structured_outputs: StructuredOutputsParams | None = None
    """Constrain the output to a JSON schema, a regex, a choice or a grammar (vLLM's name)."""

    def __post_init__(self) -> None:
        """Validate every field and normalise top_k, stop and stop_token_ids."""
        if _check_int("max_tokens", self.max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.temperature = _check_float("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        self.top_p = _check_float("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if _check_int("top_k", self.top_k) < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or >= 1, got {self.top_k}")
        self.top_k = -1 if self.top_k == 0 else self.top_k
        self.min_p = _check_float("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        self.repetition_penalty = _check_float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 disables it), got {value}")
            setattr(self, name, value)
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed must be in [0, 2**64) (or None), got {self.seed}")
        self.stop = _normalise_stop(self.stop)
        self.stop_token_ids = _normalise_stop_token_ids(self.stop_token_ids)
        _check_bool("ignore_eos", self.ignore_eos)
        _check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        _check_bool("speculative", self.speculative)
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutputsParams
        ):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}")  # fmt: skip
        if self.logprobs is not None and _check_int("logprobs", self.logprobs) < 0:
            raise ValueError(
                f"logprobs must be None or an int >= 0 (alternatives per token), got "
                f"{self.logprobs}"
            )

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax token at every step."""
        return self.temperature < _SAMPLING_EPS

    @property
    def needs_penalties(self) -> bool:
        """True when any repetition, presence or frequency penalty changes the logits."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
