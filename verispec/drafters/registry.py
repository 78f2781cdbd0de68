"""The registry of speculative methods: the only place method names appear."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from verispec.drafters.draft_model import DraftModelProposer
from verispec.drafters.eagle import EagleProposer
from verispec.drafters.medusa import MedusaProposer
from verispec.drafters.ngram import Lookup, NgramProposer
from verispec.drafters.proposer import Proposer, TargetInfo
from verispec.drafters.self_draft import make_self_proposer
from verispec.drafters.suffix import SuffixProposer
from verispec.models.eagle import load_eagle_head
from verispec.models.kernels.backends import choose_backend
from verispec.models.kernels.quantization import AUTO_DRAFT
from verispec.models.medusa import load_medusa_heads
from verispec.models.weights.loader import resolve_head_path

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
    takes_head: bool = False
    """Drafts with a head over the target's features (SpecConfig.model is its directory)."""
    takes_tree: bool = False
    """May draft a tree: reads SpecConfig.tree_topk / tree_depth."""
    grafts_lookup: bool = False
    """May graft a prompt-lookup chain onto its trees (SpecConfig.prompt_lookup_tokens, with
    prompt_lookup_min / prompt_lookup_max)."""
    own_tree: bool = False
    """Drafts trees of its own shape, not tree_topk / tree_depth: num_speculative_tokens is the
    node budget (up to MAX_TREE_NODES), and a request's tree may have fewer nodes, or none."""
    takes_suffix: bool = False
    """Reads SpecConfig.suffix_decoding_* (suffix decoding's tries and limits)."""
    drafts_with_own_layers: bool = False
    """Drafts with the target's own layers, some skipped (SpecConfig.self_skip_layers,
    self_calibration); no separate draft weights."""
    model_free: bool = False
    """Drafts from tokens alone: make reads nothing of the target (make_model_free_proposer)."""

    @property
    def takes_model(self) -> bool:
        """SpecConfig.model (and .quantization) name its draft checkpoint or head."""
        return self.takes_draft_model or self.takes_head


def _eagle(spec: SpecConfig, target: TargetInfo) -> Proposer:
    backend = choose_backend(target.linear_backend, target.device, target.dtype, target.compile)
    head = load_eagle_head(resolve_head_path(spec.model or ""), target.model, backend,
                           target.batch_invariant, _head_quantization(spec),
                           target.compile)  # fmt: skip
    lookup = None
    if spec.prompt_lookup_tokens is not None:  # SpecConfig then filled in the n-gram bounds
        lookup = Lookup(spec.prompt_lookup_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    return EagleProposer(head, spec.num_speculative_tokens, spec.tree_topk or 1,
                         spec.tree_depth or 1, target, lookup)  # fmt: skip


def _head_quantization(spec: SpecConfig) -> str | None:
    """A head's weights as stored under the default "auto" (only draft models round then)."""
    return None if spec.quantization == AUTO_DRAFT else spec.quantization


def _self(spec: SpecConfig, target: TargetInfo) -> Proposer:
    return make_self_proposer(spec.self_skip_layers, spec.self_calibration,
                              spec.num_speculative_tokens, target)  # fmt: skip


def _medusa(spec: SpecConfig, target: TargetInfo) -> Proposer:
    backend = choose_backend(target.linear_backend, target.device, target.dtype, target.compile)
    heads = load_medusa_heads(resolve_head_path(spec.model or ""), target.model, backend,
                              target.batch_invariant, _head_quantization(spec))  # fmt: skip
    k = spec.num_speculative_tokens
    depth = spec.tree_depth or (k if (spec.tree_topk or 1) == 1 else heads.config.num_heads)
    return MedusaProposer(heads, k, spec.tree_topk or 1, depth)


_METHODS: dict[str, Method] = {
    "draft_model": Method(
        lambda spec, target: DraftModelProposer.load(
            spec.model or "", spec.quantization, spec.num_speculative_tokens, target
        ),
        takes_draft_model=True,
    ),
    "ngram": Method(
        lambda spec, target: NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max),
        takes_prompt_lookup=True,
        model_free=True,
    ),
    "eagle": Method(_eagle, takes_head=True, takes_tree=True, grafts_lookup=True),
    "medusa": Method(_medusa, takes_head=True, takes_tree=True),
    "suffix": Method(
        lambda spec, target: SuffixProposer(spec.suffix_config()),
        own_tree=True,
        takes_suffix=True,
        model_free=True,
    ),
    "self": Method(_self, drafts_with_own_layers=True),
}


PLAIN = "none"
"""The name benchmarks and the CLI give to plain decoding (no proposer)."""

DEFAULT_METHOD = "draft_model"
"""SpecConfig's method when none is given, and the one a model with a trained draft uses."""

HEAD_METHOD = "eagle"
"""The drafter of a named model that ships a trained head (models/embedded/heads/)."""

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


def takes_head(name: str) -> bool:
    """Whether method `name` drafts with a head over the target's features (SpecConfig.model)."""
    return method(name).takes_head


def takes_model(name: str) -> bool:
    """Whether method `name` needs SpecConfig.model (a draft checkpoint or a head)."""
    return method(name).takes_model


def head_method_names() -> tuple[str, ...]:
    """Methods that draft with a head (EAGLE, Medusa)."""
    return tuple(n for n, m in _METHODS.items() if m.takes_head)


def method_names() -> tuple[str, ...]:
    """Names a SpecConfig may give as method."""
    return tuple(_METHODS)


def make_proposer(spec: SpecConfig, target: TargetInfo) -> Proposer:
    """The drafter for spec.method."""
    return method(spec.method).make(spec, target)


def make_model_free_proposer(spec: SpecConfig) -> Proposer:
    """The drafter for a method that drafts from tokens alone, built without a target (replays
    of recorded outputs, bench.replay); ValueError for a method that needs a model."""
    free = [name for name, m in _METHODS.items() if m.model_free]
    if spec.method not in free:
        raise ValueError(f"method {spec.method!r} drafts with a model; model-free methods: {free}")
    return method(spec.method).make(spec, cast(TargetInfo, None))
