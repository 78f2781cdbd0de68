"""The registry of speculative methods: the only place method names appear."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verispec.drafters.draft_model import DraftModelProposer
from verispec.drafters.ngram import NgramProposer
from verispec.drafters.proposer import Proposer, TargetInfo

if TYPE_CHECKING:  # annotations only: config imports this module, never the reverse at run time
    from verispec.config import SpecConfig


@dataclass(frozen=True, slots=True)
class Method:
    """A speculative method: how to build its drafter and which SpecConfig options it reads."""

    make: Callable[[SpecConfig, TargetInfo], Proposer]
    takes_draft_model: bool = False
    """Drafts with a separate draft checkpoint (SpecConfig.model, .quantization)."""
    takes_prompt_lookup: bool = False
    """Reads SpecConfig.prompt_lookup_min / prompt_lookup_max."""


_METHODS: dict[str, Method] = {
    "draft_model": Method(
        lambda spec, target: DraftModelProposer(
            spec.model or "", spec.quantization, spec.num_speculative_tokens, target
        ),
        takes_draft_model=True,
    ),
    "ngram": Method(
        lambda spec, target: NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max),
        takes_prompt_lookup=True,
    ),
}


PLAIN = "none"
"""The name benchmarks and the CLI give to plain decoding (no proposer)."""

DEFAULT_METHOD = "draft_model"
"""SpecConfig's method when none is given, and the one a model with a trained draft uses."""

MODEL_FREE_METHOD = "ngram"
"""The drafter for a model that has no trained drafter (needs no weights at all)."""


def method(name: str) -> Method:
    """The registered method called `name`; ValueError listing the known ones otherwise."""
    if name not in _METHODS:
        raise ValueError(
            f"speculative method must be one of {', '.join(_METHODS)}; got {name!r}"
        )
    return _METHODS[name]


def takes_draft_model(name: str) -> bool:
    """Whether method `name` drafts with a separate draft checkpoint (SpecConfig.model)."""
    return method(name).takes_draft_model


def method_names() -> tuple[str, ...]:
    """Names a SpecConfig may give as method."""
    return tuple(_METHODS)


def make_proposer(spec: SpecConfig, target: TargetInfo) -> Proposer:
    """The drafter for spec.method."""
    return method(spec.method).make(spec, target)
