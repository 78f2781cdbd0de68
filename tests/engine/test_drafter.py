"""The drafter contract: Capabilities.of names a built drafter's optional capabilities once,
and refuses a drafter that is none, or one that reads every position without a prefix cache."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from verispec.engine.drafter import Capabilities, Drafts
from verispec.kv.prefix_cache import PrefixCache


class Plain:
    """Only the required calls (prompt lookup's shape)."""

    def propose(self, requests: Sequence[object], num_tokens: Sequence[int]) -> Drafts:
        return Drafts([[] for _ in requests], None)

    def release(self, request: object) -> None:
        pass


class Features(Plain):
    """Reads the target's features of the kept positions only (Medusa's shape)."""

    feature_layers = (1,)
    reads_every_position = False

    def observe(self, request: object, start: int, features: torch.Tensor) -> None:
        pass


class EveryPosition(Features):
    """Reads every position, but keeps no prefix cache of its own: refused."""

    reads_every_position = True


class Head(EveryPosition):
    """Reads every position and keeps a prefix cache (EAGLE's shape)."""

    prefix_cache: PrefixCache | None = None

    def enable_prefix_caching(self) -> None:
        pass

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> int:
        return 0

    def adopt_prefix(self, request_id: str, token_ids: Sequence[int], num_blocks: int) -> None:
        pass


def test_capabilities_are_named_once() -> None:
    assert Capabilities.of(None) == Capabilities()
    assert Capabilities.of(Plain()) == Capabilities()  # type: ignore[arg-type]
    medusa = Features()
    assert Capabilities.of(medusa) == Capabilities(features=medusa)  # type: ignore[arg-type]
    head = Head()
    found = Capabilities.of(head)  # type: ignore[arg-type]
    assert found.features is head and found.shared_prefix is head and found.prefixes is head
    assert found.own_kv is None  # no kv_cache property


def test_a_drafter_must_pair_its_capabilities() -> None:
    with pytest.raises(TypeError, match="no drafter"):
        Capabilities.of(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reads every position but keeps no prefix cache"):
        Capabilities.of(EveryPosition())  # type: ignore[arg-type]


def test_an_engine_takes_a_resolved_config_and_a_builder_exactly_when_it_speculates() -> None:
    from verispec.config import EngineConfig, ResolvedSpec, SpecConfig
    from verispec.engine.engine import Engine

    spec = SpecConfig(method="ngram", num_speculative_tokens=2)
    for unresolved in ("auto", spec):
        with pytest.raises(ValueError, match="takes a resolved speculative config"):
            Engine(EngineConfig(speculative=unresolved), lambda target: Plain())  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="make_drafter"):
        Engine(EngineConfig(speculative=ResolvedSpec(spec)))
    with pytest.raises(ValueError, match="make_drafter"):
        Engine(EngineConfig(speculative=None), lambda target: Plain())  # type: ignore[arg-type, return-value]
