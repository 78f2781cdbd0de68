"""Every spelling of a named model's drafter (the CLI's flags for generate, chat, serve and verify,
LLM(speculative=...) as "auto", dict or object, the bench's serving settings) resolves to one
configuration: spec/resolve.py's resolve_speculative, fully resolved."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace

import pytest

from verispec import LLM, SpecConfig
from verispec.bench.serving import spec_for
from verispec.cli.main import build_parser, main
from verispec.cli.options import spec_config
from verispec.cli.verify import audit_spec
from verispec.config import EngineConfig, ResolvedSpec
from verispec.drafters.registry import DEFAULT_METHOD, HEAD_METHOD, MODEL_FREE_METHOD
from verispec.spec import resolve as resolve_module
from verispec.spec.resolve import DraftRuntime, own_drafter, resolve, resolve_speculative

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

Spelling = Callable[[], SpecConfig | None]


def cli(*argv: str) -> Spelling:
    """The configuration a command line asks for (the function that turns its flags into one)."""
    return lambda: spec_config(build_parser().parse_args(list(argv)))


def verify(*argv: str) -> Spelling:
    """What `verispec verify` checks (its note aside): the resolved drafter, policy off."""
    return lambda: audit_spec(build_parser().parse_args(["verify", *argv]))[0]


def library(model: str | None, request: object, overrides: dict | None = None) -> Spelling:
    """What LLM(model, speculative=request) and the engine resolve."""
    return lambda: resolve_speculative(model, request, overrides)  # type: ignore[arg-type]


K3 = {"num_speculative_tokens": 3}
OWN_DRAFT_K3 = [  # embedded-code's own draft model, 3 tokens a step, fixed
    cli("generate", "x", "--model", "embedded-code", "--k", "3"),
    cli("generate", "x", "--model", "embedded-code", "--method", DEFAULT_METHOD, "--k", "3"),
    cli("generate", "x", "--model", "embedded-code", "--method", DEFAULT_METHOD, "--k", "3",
        "--draft-quantization", "auto"),
    cli("chat", "--model", "embedded-code", "--k", "3"),
    cli("serve", "--model", "embedded-code", "--k", "3"),
    cli("serve", "--model", "embedded-code", "--speculative-config", json.dumps(K3)),
    cli("serve", "--model", "embedded-code", "--speculative-config",
        json.dumps({"method": DEFAULT_METHOD, **K3})),
    verify("--model", "embedded-code", "--k", "3"),
    verify("--model", "embedded-code", "--speculative-config", json.dumps(K3)),
    library("embedded-code", "auto", K3),
    library("embedded-code", K3),
    library("embedded-code", {"method": DEFAULT_METHOD, **K3}),
    library("embedded-code", SpecConfig(num_speculative_tokens=3)),
    library("embedded-code", SpecConfig(method=DEFAULT_METHOD, num_speculative_tokens=3)),
    lambda: spec_for("k3", "embedded-code"),
]  # fmt: skip
OWN_AUTO = [  # embedded-code's own drafter under the adaptive policy
    cli("generate", "x", "--model", "embedded-code"),
    cli("chat", "--model", "embedded-code"),
    cli("serve", "--model", "embedded-code"),
    library("embedded-code", "auto"),
    lambda: resolve_speculative("embedded-code"),
    lambda: resolve_speculative(EngineConfig(model="embedded-code").model,
                                EngineConfig(model="embedded-code").speculative),
    lambda: spec_for("auto", "embedded-code"),
]  # fmt: skip
DEFAULT_AUTO = [  # the default model: prompt lookup, adaptive
    cli("generate", "x"),
    cli("chat"),
    cli("serve"),
    library(None, "auto"),
    library("smollm2-135m-instruct", "auto"),
    lambda: spec_for("auto", None),
]
OWN_HEAD = [  # the default model's shipped EAGLE head with the tree it was tuned with
    cli("generate", "x", "--method", HEAD_METHOD),
    cli("serve", "--method", HEAD_METHOD),
    cli("serve", "--speculative-config", json.dumps({"method": HEAD_METHOD})),
    library(None, {"method": HEAD_METHOD}),
    library(None, SpecConfig(method=HEAD_METHOD)),
]
VOCAB = {"draft_vocab_size": 4096}
OWN_DRAFT_VOCAB = [  # embedded-code's own draft model, its head cut to 4096 ids
    cli("generate", "x", "--model", "embedded-code", "--draft-vocab-size", "4096"),
    cli("generate", "x", "--model", "embedded-code", "--method", DEFAULT_METHOD,
        "--draft-vocab-size", "4096"),
    cli("serve", "--model", "embedded-code", "--speculative-config", json.dumps(VOCAB)),
    verify("--model", "embedded-code", "--draft-vocab-size", "4096"),
    library("embedded-code", "auto", VOCAB),
    library("embedded-code", {"method": DEFAULT_METHOD, **VOCAB}),
    library("embedded-code", SpecConfig(draft_vocab_size=4096)),
]  # fmt: skip
TABLE = {"own draft, k=3": OWN_DRAFT_K3, "own drafter, auto": OWN_AUTO,
         "default model, auto": DEFAULT_AUTO, "own head": OWN_HEAD,
         "own draft, reduced vocabulary": OWN_DRAFT_VOCAB}  # fmt: skip


@pytest.mark.parametrize("group", TABLE)
def test_every_spelling_resolves_to_one_configuration(group: str) -> None:
    first, *rest = TABLE[group]
    expected = first()
    assert expected is not None
    for i, spelling in enumerate(rest, 1):
        assert spelling() == expected, f"{group}: spelling {i} differs"


def test_the_groups_resolve_to_what_they_name() -> None:
    """Fully resolved: the draft's quantization decided for where it runs, tree settings and
    lookup bounds filled in; "auto" turns the policy on, flags fix it."""
    auto_quantization = DraftRuntime().draft_quantization("auto")  # w8a8 where VNNI runs it
    draft = OWN_DRAFT_K3[0]()
    assert draft == SpecConfig(method=DEFAULT_METHOD, model="embedded-code-draft",
                               num_speculative_tokens=3, quantization=auto_quantization)
    assert OWN_AUTO[0]() == replace(draft, num_speculative_tokens=4, adaptive=True)
    lookup = DEFAULT_AUTO[0]()
    assert (lookup.method, lookup.adaptive) == (MODEL_FREE_METHOD, True)
    assert (lookup.prompt_lookup_min, lookup.prompt_lookup_max) == (2, 4)
    head, tuned = OWN_HEAD[0](), own_drafter(None, HEAD_METHOD)
    assert (head.model, head.tree_topk, head.tree_depth, head.quantization) == (
        tuned.model, tuned.tree_topk, tuned.tree_depth, None
    )  # fmt: skip
    assert head.prompt_lookup_min == 2  # the grafted lookup's bounds


def test_a_named_models_draft_vocabulary_size_is_its_own_drafters(monkeypatch) -> None:
    """NamedModel.draft_vocab_size goes with its draft wherever the own draft is filled in
    ("auto", a method without a draft); an explicit size beats it; other drafts never get it."""
    named = dict(resolve_module.NAMED_MODELS)
    named["embedded-code"] = replace(named["embedded-code"], draft_vocab_size=2048)
    monkeypatch.setattr(resolve_module, "NAMED_MODELS", named)
    assert own_drafter("embedded-code", DEFAULT_METHOD).draft_vocab_size == 2048
    assert OWN_AUTO[0]().draft_vocab_size == 2048
    assert OWN_DRAFT_K3[0]().draft_vocab_size == 2048  # --k: only the checkpoint's settings
    assert OWN_DRAFT_VOCAB[0]().draft_vocab_size == 4096
    other = library("embedded-code", {"method": DEFAULT_METHOD, "model": "/my/draft"})()
    assert other.draft_vocab_size is None
    assert own_drafter(None, DEFAULT_METHOD) is None  # the default model has no draft model


@pytest.mark.parametrize("integer", [True, False])
def test_auto_for_the_qwen_pair_drafts_with_its_own_draft_as_measured_fastest(
    integer: bool, monkeypatch
) -> None:
    """speculative="auto" for the named Qwen2.5-Coder-1.5B (resolved without loading it): its
    0.5B draft, head cut to 65536 ids, copying first where prompt lookup finds a continuation,
    the adaptive policy on up to 8 tokens, and the draft's own rounding (NamedModel.
    draft_rounding, w4a8) where the 8-bit products run in integers, else as stored."""
    monkeypatch.setattr(resolve_module, "draft_quantization",
                        lambda requested, *rest: rest[-1] if integer else None)  # fmt: skip
    spec = resolve_speculative("qwen2.5-coder-1.5b-instruct", "auto")
    assert spec is not None and spec.method == DEFAULT_METHOD
    assert (spec.model, spec.draft_vocab_size) == ("qwen2.5-coder-0.5b-instruct", 65536)
    assert (spec.num_speculative_tokens, spec.prompt_lookup_tokens) == (8, 8)  # copy first
    assert spec.quantization == ("w4a8" if integer else None) and spec.adaptive
    embedded = resolve_speculative("embedded-code", "auto")  # other drafts keep w8a8
    assert embedded is not None and embedded.quantization == ("w8a8" if integer else None)


def test_resolving_again_changes_nothing() -> None:
    """A resolved configuration, changed or not, is a fixed point of the resolver as plain data."""
    for spellings in TABLE.values():
        spec = spellings[0]()
        assert resolve_speculative("embedded-code", spec) == spec
        assert resolve_speculative(None, spec) == spec


def test_a_resolved_configuration_passes_through_untouched() -> None:
    """The CLI hands LLM what it resolved; LLM resolves nothing again: the ResolvedSpec comes
    back as it is, and overrides with it are refused rather than applied unchecked."""
    resolved = resolve("embedded-code", "auto")
    assert isinstance(resolved, ResolvedSpec)
    assert resolved.spec == resolve_speculative("embedded-code", "auto")
    assert resolve(None, resolved) is resolved
    with pytest.raises(ValueError, match="given for a resolved configuration"):
        resolve("embedded-code", resolved, K3)


def test_an_explicit_choice_beats_the_models_own() -> None:
    """Flags set last: --draft-quantization none keeps the own draft as stored."""
    spec = cli("generate", "x", "--model", "embedded-code", "--k", "3",
               "--draft-quantization", "none")()  # fmt: skip
    assert spec is not None and (spec.model, spec.quantization) == ("embedded-code-draft", None)
    assert library("/not/a/named/model", "auto")() is None
    with pytest.raises(ValueError, match="need a drafter"):
        library("/not/a/named/model", "auto", K3)()
    with pytest.raises(ValueError, match="unknown speculative option"):
        library(None, "auto", {"k": 3})()


def test_generate_json_and_the_engine_show_the_resolved_configuration(capsys) -> None:
    """`verispec generate ... --json` reports the configuration that ran; the issue's example:
    --model embedded-code --k 3 and --method draft_model --k 3 report the same."""
    settings = []
    for extra in ([], ["--method", DEFAULT_METHOD]):
        argv = ["generate", "def parse(line):", "--model", "embedded-code", "--k", "3",
                "--max-tokens", "2", "--json", *extra]  # fmt: skip
        assert main(argv) == 0
        settings.append(json.loads(capsys.readouterr().out)["settings"])
    assert settings[0]["speculative"] == settings[1]["speculative"]
    assert settings[0]["speculative"] == asdict(OWN_DRAFT_K3[0]())
    assert settings[0]["draft_quantization"] == settings[1]["draft_quantization"]
    llm = LLM(model="embedded-code", speculative=K3)
    assert llm.engine.config.speculative == OWN_DRAFT_K3[0]()
