"""The one resolver of speculative settings: what "auto" and a named model's own drafter mean,
and every spelling of a request (CLI flags, LLM(speculative=...) as object, dict or "auto",
the server's flags, bench settings) turned into one fully resolved SpecConfig.

Fully resolved: the method's options checked and their defaults filled (drafters/registry.py,
check_spec), a missing draft or head filled with the named model's own, and a draft's "auto"
quantization decided for where it runs. `resolve` marks the result a ResolvedSpec (config.py),
which passes through it again untouched: the CLI resolves, hands that to LLM, and LLM hands it
(and its drafter's builder) to the engine, which takes nothing else. `resolve_speculative` is
the same resolution as plain data, for what shows or varies a configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from verispec.config import EngineConfig, ResolvedSpec, SpecConfig, SpecError, field_list
from verispec.drafters.registry import (
    DEFAULT_METHOD,
    HEAD_METHOD,
    MODEL_FREE_METHOD,
    check_spec,
    method,
)
from verispec.models.catalog.default import shipped_head
from verispec.models.catalog.hub import DEFAULT_MODEL, NAMED_MODELS
from verispec.models.kernels.quantization import draft_quantization
from verispec.models.weights.loader import resolve_device, resolve_dtype
from verispec.types.numerics import AUTO_DRAFT

SpecRequest = SpecConfig | ResolvedSpec | Mapping[str, Any] | Literal["auto"] | None
"""What users may ask for: a SpecConfig, its dict form (vLLM's speculative_config), "auto" (the
model's own drafter) or None (plain decoding); or what the resolver already made of one."""


@dataclass(frozen=True, slots=True)
class DraftRuntime:
    """Where a drafter runs: what a draft's "auto" quantization depends on (EngineConfig's
    fields of the same names)."""

    linear_backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False

    @classmethod
    def of(cls, config: EngineConfig) -> DraftRuntime:
        return cls(config.linear_backend, config.device, config.dtype, config.compile)

    def draft_quantization(self, requested: str | None, draft: str | None = None) -> str | None:
        """A draft model's quantization: `requested`, or for "auto" w8a8 (or the rounding the
        named draft's catalog entry gives, NamedModel.draft_rounding) where the native kernel
        runs it in integers here (any but the portable C path), else None (as stored);
        kernels/quantization.py."""
        if requested != AUTO_DRAFT:
            return requested
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype, device)
        named = NAMED_MODELS.get(draft or "")
        rounding = named.draft_rounding if named is not None else "w8a8"
        return draft_quantization(requested, self.linear_backend, device, dtype, self.compile,
                                  rounding)  # fmt: skip


def resolve_speculative(
    model: str | None,
    speculative: SpecRequest = "auto",
    overrides: Mapping[str, Any] | None = None,
    *,
    runtime: DraftRuntime | None = None,
) -> SpecConfig | None:
    """The SpecConfig that runs for target `model` (None = the default model), or None for plain
    decoding: resolve's answer as plain data."""
    resolved = resolve(model, speculative, overrides, runtime=runtime)
    return None if resolved is None else resolved.spec


def resolve(
    model: str | None,
    speculative: SpecRequest = "auto",
    overrides: Mapping[str, Any] | None = None,
    *,
    runtime: DraftRuntime | None = None,
) -> ResolvedSpec | None:
    """The ResolvedSpec that runs for target `model` (None = the default model), or None for
    plain decoding; ValueError naming what is wrong and what is allowed. A ResolvedSpec given
    is returned as it is (overrides are refused with it: change its .spec and resolve that).

    speculative: "auto" = the model's own drafter with the adaptive policy on (own_drafter:
    its shipped head where measured fastest, else its trained draft, else prompt lookup; plain
    decoding for a model that is not named); a SpecConfig or dict whose method drafts with a
    checkpoint or head but names none = the named model's own for that method (with the
    settings it was tuned with when nothing else is asked). overrides: SpecConfig fields set
    last with dataclasses.replace; with "auto" they fix the model's own drafter's settings
    (adaptive off unless they say so). Example: ("embedded-code", "auto", {"num_speculative_
    tokens": 3}) == ("embedded-code", {"method": "draft_model", "num_speculative_tokens": 3})."""
    overrides = dict(overrides or {})
    _check_keys(overrides, "unknown speculative option(s)")
    if isinstance(speculative, ResolvedSpec):
        _refuse_overrides(overrides, "given for a resolved configuration; change its spec and "
                          "resolve that")  # fmt: skip
        return speculative
    if isinstance(speculative, Mapping):
        speculative = spec_from_dict(speculative)
    if speculative is None:
        _refuse_overrides(overrides, "given for plain decoding (speculative=None); drop them or "
                          "choose a drafter")  # fmt: skip
        return None
    if speculative == "auto":
        own = default_drafter(model)
        if own is None:
            _refuse_overrides(overrides, f"need a drafter: {model!r} has none of its own; give a "
                              "method (and its draft or head)")  # fmt: skip
            return None
        if not overrides:
            return _finish(replace(own, adaptive=True), runtime)
        speculative = SpecConfig(method=own.method)
    if not isinstance(speculative, SpecConfig):
        raise ValueError(f"speculative must be a SpecConfig, None or 'auto' (or a dict of "
                         f"SpecConfig's fields); got {speculative!r}")  # fmt: skip
    spec = _with_own_drafter(model, speculative, asked_more=bool(overrides))
    if overrides:
        spec = replace(spec, **overrides)
    return _finish(spec, runtime)


def spec_from_dict(options: Mapping[str, Any]) -> SpecConfig:
    """vLLM's dict form of a speculative config as a SpecConfig; ValueError for unknown keys.

    >>> spec_from_dict({"method": "ngram", "num_speculative_tokens": 2}).num_speculative_tokens
    2
    """
    _check_keys(options, "speculative has unknown key(s)")
    return SpecConfig(**options)


def _check_keys(options: Mapping[str, Any], problem: str) -> None:
    """ValueError naming the keys of options that are no SpecConfig field, and the fields."""
    allowed = [f.name for f in fields(SpecConfig)]
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise ValueError(f"{problem} {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(allowed)}")  # fmt: skip


def _refuse_overrides(overrides: Mapping[str, Any], problem: str) -> None:
    """ValueError when overrides were given where nothing drafts: they would be dropped."""
    if overrides:
        raise SpecError(*field_list(list(overrides)), f" {problem}")


def default_drafter(model: str | None) -> SpecConfig | None:
    """The model's own drafter before resolution (what "auto" starts from): a named model (None
    = the default model) drafts with its shipped EAGLE head where that was measured fastest
    (NamedModel.auto_head), else with its trained draft model (auto_draft), else with prompt
    lookup (no weights); any other model has none."""
    named = NAMED_MODELS.get(model or DEFAULT_MODEL)
    if named is None:
        return None
    own_head = own_drafter(model, HEAD_METHOD) if named.auto_head else None
    own_draft = own_drafter(model, DEFAULT_METHOD) if named.auto_draft else None
    return own_head or own_draft or SpecConfig(method=MODEL_FREE_METHOD)


def own_drafter(model: str | None, method_name: str) -> SpecConfig | None:
    """A named model's own drafter for a method, before resolution: its shipped head for the
    head method (with the settings the head was tuned with, from its config.json), its trained
    draft, quantization "auto", its draft vocabulary size, depth and copying (prompt lookup
    first), for the draft-model method; None when it has none (or the model is not named)."""
    named = NAMED_MODELS.get(model or DEFAULT_MODEL)
    if named is None:
        return None
    if method_name == HEAD_METHOD and named.head is not None:
        head = shipped_head(named.head)
        if head is not None:
            path, settings = head
            return SpecConfig(method=method_name, model=str(path), **settings)
    if method_name == DEFAULT_METHOD and named.draft is not None:
        depth = {} if named.draft_depth is None else {"num_speculative_tokens": named.draft_depth}
        return SpecConfig(method=method_name, model=named.draft, quantization=AUTO_DRAFT,
                          draft_vocab_size=named.draft_vocab_size,
                          prompt_lookup_tokens=named.draft_lookup_tokens, **depth)  # fmt: skip
    return None


def _with_own_drafter(model: str | None, spec: SpecConfig, asked_more: bool) -> SpecConfig:
    """spec with the named model's own draft or head where its method needs one and it names
    none: the own drafter whole (its tuned settings) when spec asks nothing else, else only its
    checkpoint (and quantization and draft vocabulary size, unless spec gives them)."""
    if spec.model or not method(spec.method).takes_model:
        return spec
    own = own_drafter(model, spec.method)
    if own is None:
        return spec  # check_spec says the method needs model=
    if spec == SpecConfig(method=spec.method) and not asked_more:
        return own
    quantization = own.quantization if spec.quantization is None else spec.quantization
    size = own.draft_vocab_size if spec.draft_vocab_size is None else spec.draft_vocab_size
    return replace(spec, model=own.model, quantization=quantization, draft_vocab_size=size)


def _finish(spec: SpecConfig, runtime: DraftRuntime | None) -> ResolvedSpec:
    """spec checked and filled (check_spec), its quantization decided for where it runs (a
    draft model's "auto" by the runtime, a head's "auto" as stored), marked resolved."""
    spec = check_spec(spec)
    traits = method(spec.method)
    quantization = spec.quantization
    if traits.takes_draft_model:
        quantization = (runtime or DraftRuntime()).draft_quantization(quantization, spec.model)
    elif quantization == AUTO_DRAFT:
        quantization = None
    return ResolvedSpec(replace(spec, quantization=quantization))  # a copy of its own
