"""The registry of speculative methods: the only place method names appear."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verispec.config import EngineConfig, SpecConfig
    from verispec.drafters.proposer import Proposer, TargetInfo


def _draft_model(spec: SpecConfig, config: EngineConfig, target: TargetInfo) -> Proposer:
    from verispec.drafters.draft_model import DraftModelProposer

    return DraftModelProposer(spec, config, target)


def _ngram(spec: SpecConfig, config: EngineConfig, target: TargetInfo) -> Proposer:
    from verispec.drafters.ngram import NgramProposer

    return NgramProposer(spec)


_METHODS: dict[str, Callable[[SpecConfig, EngineConfig, TargetInfo], Proposer]] = {
    "draft_model": _draft_model,
    "ngram": _ngram,
}


PLAIN = "none"
"""The name benchmarks and the CLI give to plain decoding (no proposer)."""

DEFAULT_METHOD = "draft_model"
"""SpecConfig's method when none is given (and the embedded pair's)."""

_TAKES_DRAFT_MODEL = frozenset({"draft_model"})


def takes_draft_model(method: str) -> bool:
    """Whether `method` drafts with a separate draft checkpoint (SpecConfig.model)."""
    return method in _TAKES_DRAFT_MODEL


def method_names() -> tuple[str, ...]:
    """Names a SpecConfig may give as method."""
    return tuple(_METHODS)


def make_proposer(spec: SpecConfig, config: EngineConfig, target: TargetInfo) -> Proposer:
    """The drafter for spec.method."""
    return _METHODS[spec.method](spec, config, target)
