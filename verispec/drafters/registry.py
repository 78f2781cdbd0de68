"""The registry of speculative methods: the only place method names appear. Each method maps
to its factory and the options classes it reads, each declared beside its drafter (its fields,
defaults and checks); check_spec checks a SpecConfig against them, filling in their defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from verispec.config import (
    MAX_SPECULATIVE_TOKENS,
    MAX_TREE_NODES,
    ResolvedSpec,
    SpecConfig,
    SpecError,
    SpecField,
    field_list,
)
from verispec.drafters.draft_model import DraftModelConfig, DraftModelProposer
from verispec.drafters.eagle import EagleProposer
from verispec.drafters.head_options import HeadConfig, TreeConfig
from verispec.drafters.medusa import MedusaProposer
from verispec.drafters.ngram import (
    Lookup,
    LookupGraftConfig,
    NgramProposer,
    PromptLookupConfig,
)
from verispec.drafters.self_draft import SelfDraftConfig, make_self_proposer
from verispec.drafters.suffix import SuffixConfig, SuffixProposer
from verispec.engine.drafter import Proposer, TargetInfo
from verispec.models.eagle import load_eagle_head
from verispec.models.kernels.backends import choose_backend
from verispec.models.medusa import load_medusa_heads
from verispec.models.weights.loader import resolve_head_path


def _reads(option: type[Any], doc: str) -> property:
    """A Method's trait: whether it reads the fields of the options class `option`."""
    return property(lambda self: option in self.options, doc=doc)


@dataclass(frozen=True, slots=True)
class Method:
    """A speculative method: how to build its drafter and which options classes it reads."""

    make: Callable[[SpecConfig, TargetInfo], Proposer]
    options: tuple[type[Any], ...] = ()
    """The options classes (each beside its drafter) whose SpecConfig fields it reads; any
    other option given is refused, never silently dropped."""
    own_tree: bool = False
    """Drafts trees of its own shape, not tree_topk / tree_depth: num_speculative_tokens is the
    node budget (up to MAX_TREE_NODES), and a request's tree may have fewer nodes, or none."""
    model_free: bool = False
    """Drafts from tokens alone: make reads nothing of the target (make_model_free_proposer)."""
    fuses_features: bool = False
    """A head over several of the target's layers' features fused (EAGLE-3), not the last
    layer's output alone (Medusa); how `verispec train` builds and feeds it."""

    # Traits read off `options` (what each options class holds: beside its drafter).
    takes_draft_model = _reads(DraftModelConfig, "Drafts with a separate draft checkpoint.")
    takes_head = _reads(HeadConfig, "Drafts with a head over the target's features.")
    takes_prompt_lookup = _reads(PromptLookupConfig, "Reads the prompt-lookup n-gram bounds.")
    takes_tree = _reads(TreeConfig, "May draft a tree of tree_topk / tree_depth.")
    grafts_lookup = _reads(LookupGraftConfig, "May graft a prompt-lookup chain onto its drafts.")
    takes_suffix = _reads(SuffixConfig, "Reads suffix decoding's tries and limits.")
    drafts_with_own_layers = _reads(SelfDraftConfig, "Drafts with the target's own layers.")

    @property
    def takes_model(self) -> bool:
        """SpecConfig.model (and .quantization) name its draft checkpoint or head."""
        return self.takes_draft_model or self.takes_head


def _eagle(spec: SpecConfig, target: TargetInfo) -> Proposer:
    backend = choose_backend(target.linear_backend, target.device, target.dtype, target.compile)
    head = load_eagle_head(resolve_head_path(spec.model or ""), target.model, backend,
                           target.batch_invariant, spec.quantization,
                           target.compile)  # fmt: skip
    return EagleProposer(head, spec.num_speculative_tokens, spec.tree_topk or 1,
                         spec.tree_depth or 1, target, _lookup(spec))  # fmt: skip


def _lookup(spec: SpecConfig) -> Lookup | None:
    """The prompt lookup a drafter grafts onto its drafts (prompt_lookup_tokens), if any."""
    return LookupGraftConfig.of(spec).lookup(PromptLookupConfig.of(spec))


def _self(spec: SpecConfig, target: TargetInfo) -> Proposer:
    return make_self_proposer(spec.self_skip_layers, spec.self_calibration,
                              spec.num_speculative_tokens, target)  # fmt: skip


def _medusa(spec: SpecConfig, target: TargetInfo) -> Proposer:
    backend = choose_backend(target.linear_backend, target.device, target.dtype, target.compile)
    heads = load_medusa_heads(resolve_head_path(spec.model or ""), target.model, backend,
                              target.batch_invariant, spec.quantization)  # fmt: skip
    k = spec.num_speculative_tokens
    depth = spec.tree_depth or (k if (spec.tree_topk or 1) == 1 else heads.config.num_heads)
    return MedusaProposer(heads, k, spec.tree_topk or 1, depth)


_METHODS: dict[str, Method] = {
    "draft_model": Method(
        lambda spec, target: DraftModelProposer.load(
            spec.model or "",
            spec.quantization,
            spec.num_speculative_tokens,
            target,
            spec.draft_vocab_size,
            _lookup(spec),
        ),
        options=(DraftModelConfig, LookupGraftConfig),
    ),
    "ngram": Method(
        lambda spec, target: NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max),
        options=(PromptLookupConfig,),
        model_free=True,
    ),
    "eagle": Method(
        _eagle, options=(HeadConfig, TreeConfig, LookupGraftConfig), fuses_features=True
    ),
    "medusa": Method(_medusa, options=(HeadConfig, TreeConfig)),
    "suffix": Method(
        lambda spec, target: SuffixProposer(SuffixConfig.of(spec)),
        options=(SuffixConfig,),
        own_tree=True,
        model_free=True,
    ),
    "self": Method(_self, options=(SelfDraftConfig,)),
}


PLAIN = "none"
"""The name benchmarks and the CLI give to plain decoding (no proposer)."""

DEFAULT_METHOD: str = SpecConfig.__dataclass_fields__["method"].default
"""SpecConfig's method when none is given (draft_model), and the one a model with a trained
draft uses."""

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
    """Whether method `name` drafts with a separate draft checkpoint (SpecConfig.model); False
    for PLAIN. The one definition the CLI, the bench and the benchmarks ask."""
    return name != PLAIN and method(name).takes_draft_model


def takes_head(name: str) -> bool:
    """Whether method `name` drafts with a head over the target's features (SpecConfig.model);
    False for PLAIN."""
    return name != PLAIN and method(name).takes_head


def takes_model(name: str) -> bool:
    """Whether method `name` needs SpecConfig.model (a draft checkpoint or a head); False for
    PLAIN."""
    return name != PLAIN and method(name).takes_model


def head_method_names() -> tuple[str, ...]:
    """Methods that draft with a head (EAGLE, Medusa)."""
    return tuple(n for n, m in _METHODS.items() if m.takes_head)


def method_names() -> tuple[str, ...]:
    """Names a SpecConfig may give as method."""
    return tuple(_METHODS)


def make_proposer(resolved: ResolvedSpec, target: TargetInfo) -> Proposer:
    """The drafter for a resolved configuration (spec/resolve.py checked and filled it)."""
    return method(resolved.spec.method).make(resolved.spec, target)


def make_model_free_proposer(spec: SpecConfig) -> Proposer:
    """The drafter for a method that drafts from tokens alone, built without a target (replays
    of recorded outputs, bench.replay); ValueError for a method that needs a model."""
    free = [name for name, m in _METHODS.items() if m.model_free]
    if spec.method not in free:
        raise ValueError(f"method {spec.method!r} drafts with a model; model-free methods: {free}")
    spec = check_spec(spec)
    return method(spec.method).make(spec, cast(TargetInfo, None))


def check_spec(spec: SpecConfig) -> SpecConfig:
    """spec checked against its method's options, with their defaults filled in (a copy);
    ValueError (SpecError where it names options) saying what is wrong and what is allowed: an
    unknown method, an option the method would ignore, a missing draft, a k or tree out of
    range, an option's own value. Idempotent."""
    traits = method(spec.method)  # ValueError listing the methods for an unknown name
    given = [f for f in SelfDraftConfig.SPEC_FIELDS.values() if getattr(spec, f) is not None]
    if given and not traits.drafts_with_own_layers:
        _refuse(spec, given)
    tree = _check_tree(spec, traits)
    k = spec.num_speculative_tokens
    limit = MAX_TREE_NODES if tree.is_tree or traits.own_tree else MAX_SPECULATIVE_TOKENS
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limit:
        drafts_trees = traits.takes_tree or traits.own_tree
        trees = f" (a tree's node budget: [1, {MAX_TREE_NODES}])" if drafts_trees else ""
        raise SpecError(SpecField("num_speculative_tokens"), f" must be an integer in "
                        f"[1, {MAX_SPECULATIVE_TOKENS}]{trees}, got {k!r}")  # fmt: skip
    if traits.takes_model and not spec.model:
        raise ValueError(f"method {spec.method!r} needs model= (a draft checkpoint or hub "
                         "id; for a head method, the head's directory)")  # fmt: skip
    grafting = _check_grafting(spec, traits, tree.is_tree)
    looks_up = traits.takes_prompt_lookup or grafting
    reads = {SuffixConfig: traits.takes_suffix, DraftModelConfig: traits.takes_draft_model,
             HeadConfig: traits.takes_head, PromptLookupConfig: looks_up}  # fmt: skip
    read = {f for cls, r in reads.items() if r for f in cls.SPEC_FIELDS.values()}
    unused = [f for cls, r in reads.items() if not r for f in cls.SPEC_FIELDS.values()
              if f not in read and getattr(spec, f) is not None]  # fmt: skip
    if unused:
        _refuse(spec, list(dict.fromkeys(unused)))
    options = [cls.of(spec) for cls, r in reads.items() if r]  # each checks its own values
    if traits.takes_tree:
        options.append(tree)
    if traits.drafts_with_own_layers:
        options.append(SelfDraftConfig.of(spec))
    filled = {field: getattr(opts, name) for opts in options
              for name, field in type(opts).SPEC_FIELDS.items()}  # fmt: skip
    changed = {k: v for k, v in filled.items() if getattr(spec, k) != v}
    return replace(spec, **changed) if changed else spec


def _refuse(spec: SpecConfig, unused: list[str]) -> None:
    """Options the method would ignore are errors, never silently dropped."""
    raise SpecError(f"method {spec.method!r} does not use ", *field_list(unused),
                    f"; drop {'it' if len(unused) == 1 else 'them'} or choose a method that "
                    "does")  # fmt: skip


def _check_tree(spec: SpecConfig, traits: Method) -> TreeConfig:
    """Tree options only for methods that draft trees of that shape (TreeConfig checks their
    values and fills a tree's default depth); a chain for the others."""
    given = [f for f in TreeConfig.SPEC_FIELDS.values() if getattr(spec, f) is not None]
    if given and not traits.takes_tree:
        shape = "trees of its own shape" if traits.own_tree else "chains only"
        raise SpecError(f"method {spec.method!r} drafts {shape} and does not use ",
                        *field_list(given))  # fmt: skip
    return TreeConfig.of(spec)


def _check_grafting(spec: SpecConfig, traits: Method, tree: bool) -> bool:
    """prompt_lookup_tokens: only for a method that grafts lookups onto its drafts, onto a tree
    for a tree method, and in the range LookupGraftConfig.check gives. Returns whether it is
    on."""
    graft = LookupGraftConfig.of(spec)
    if graft.tokens is None:
        return False
    field = SpecField("prompt_lookup_tokens")
    if not traits.grafts_lookup:
        raise SpecError(f"method {spec.method!r} does not graft prompt lookups onto its "
                        "drafts; drop ", field)  # fmt: skip
    chain = not traits.takes_tree
    if not tree and not chain:
        raise SpecError(field, " needs a tree (", SpecField("tree_topk"), " >= 2) to graft onto")
    graft.check(spec.num_speculative_tokens, chain)
    return True
