"""SpecConfig: defaults, the public import, and a clear ValueError for every bad setting."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import verispec
from verispec.config import MAX_SPECULATIVE_TOKENS, MAX_TREE_NODES, SpecConfig, SpecError
from verispec.drafters.registry import check_spec, method_names, takes_model
from verispec.models.catalog import default as default_models
from verispec.spec import resolve as resolve_module
from verispec.spec.resolve import default_drafter


def checked(**options: object) -> SpecConfig:
    """A SpecConfig as the engine runs it: its own fields checked, then its method's options
    (the registry's check_spec, which the resolver applies)."""
    return check_spec(SpecConfig(**options))


def test_public_import_and_defaults() -> None:
    from verispec import SpecConfig as public

    assert public is verispec.config.SpecConfig
    spec = checked(model="/draft")
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model", "/draft", 4)
    assert spec.prompt_lookup_min is None and spec.prompt_lookup_max is None  # draft_model: unused
    lookup = checked(method="ngram")
    assert (lookup.prompt_lookup_min, lookup.prompt_lookup_max) == (2, 4)


def test_every_registered_method_is_accepted() -> None:
    for name in method_names():
        model = "/some/draft" if takes_model(name) else None
        assert checked(method=name, model=model).method == name


@pytest.mark.parametrize("k", [1, 8, MAX_SPECULATIVE_TOKENS])
def test_k_in_range(k: int) -> None:
    assert checked(method="ngram", num_speculative_tokens=k).num_speculative_tokens == k


def test_unknown_method_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="speculative method must be one of") as info:
        checked(method="medusa-9000")
    message = str(info.value)
    assert "'medusa-9000'" in message
    for name in method_names():
        assert name in message


@pytest.mark.parametrize("k", [0, -1, MAX_SPECULATIVE_TOKENS + 1, 2.0, True, "4", None])
def test_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an integer in \[1, 16\]"):
        checked(method="ngram", num_speculative_tokens=k)


@pytest.mark.parametrize("model", [None, ""])
def test_draft_model_needs_a_model(model: str | None) -> None:
    with pytest.raises(ValueError, match="'draft_model' needs model="):
        checked(method="draft_model", model=model)


@pytest.mark.parametrize(("lo", "hi"), [(3, 2), (0, 2), (0, 0), (-1, 3), (2, "4"), (1.0, 2)])
def test_bad_prompt_lookup_bounds(lo: object, hi: object) -> None:
    with pytest.raises(ValueError, match="1 <= prompt_lookup_min <= prompt_lookup_max") as info:
        checked(method="ngram", prompt_lookup_min=lo, prompt_lookup_max=hi)
    assert repr(lo) in str(info.value) and repr(hi) in str(info.value)


def test_equal_lookup_bounds_are_fine() -> None:
    spec = checked(method="ngram", prompt_lookup_min=3, prompt_lookup_max=3)
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (3, 3)


def test_quantization_is_for_draft_models_only() -> None:
    assert checked(model="d", quantization="int8").quantization == "int8"
    with pytest.raises(ValueError, match="method 'ngram' does not use quantization"):
        checked(method="ngram", quantization="fp16")
    with pytest.raises(ValueError, match="speculative quantization must be one of fp16, int8"):
        checked(model="d", quantization="q4")
    assert checked(model="d", quantization="auto").quantization == "auto"
    with pytest.raises(ValueError, match="method 'ngram' does not use quantization"):
        checked(method="ngram", quantization="auto")


def test_draft_vocab_size_is_for_draft_models_only() -> None:
    """A head (EAGLE's, Medusa's) has its own reduced vocabulary in its files; prompt lookup
    and self-speculation have no draft head to cut."""
    assert checked(model="d", draft_vocab_size=32768).draft_vocab_size == 32768
    for name in ("ngram", "suffix", "self"):
        with pytest.raises(ValueError, match=f"method '{name}' does not use draft_vocab_size; "
                           "drop it"):  # fmt: skip
            checked(method=name, draft_vocab_size=100)
    with pytest.raises(ValueError, match="method 'eagle' does not use draft_vocab_size; drop"):
        checked(method="eagle", model="/head", draft_vocab_size=100)
    with pytest.raises(ValueError, match="method 'self' does not use model, draft_vocab_size;"):
        checked(method="self", model="/d", draft_vocab_size=100)


@pytest.mark.parametrize("size", [0, -3, 2.5, True, "100"])
def test_bad_draft_vocab_size(size: object) -> None:
    with pytest.raises(ValueError, match="draft_vocab_size must be an integer >= 1 .* or None "
                       f"for the whole vocabulary, got {size!r}"):  # fmt: skip
        checked(model="d", draft_vocab_size=size)


def test_options_a_method_would_ignore_are_refused() -> None:
    with pytest.raises(ValueError, match="method 'ngram' does not use model; drop it"):
        checked(method="ngram", model="/some/draft")
    with pytest.raises(
        ValueError, match="'draft_model' does not use prompt_lookup_min, prompt_lookup_max"
    ):
        checked(model="/d", prompt_lookup_min=1, prompt_lookup_max=3)
    with pytest.raises(ValueError, match="does not use prompt_lookup_max; drop it"):
        checked(model="/d", prompt_lookup_max=3)


def test_one_lookup_bound_given_keeps_the_other_default() -> None:
    spec = checked(method="ngram", prompt_lookup_max=6)
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (2, 6)


def test_eagle_trees_and_their_defaults() -> None:
    chain = checked(method="eagle", model="/head")
    assert (chain.tree_topk, chain.tree_depth, chain.num_speculative_tokens) == (None, None, 4)
    tree = checked(method="eagle", model="/head", tree_topk=4)
    assert tree.tree_depth == 6  # EAGLE-2's default depth
    explicit = checked(method="eagle", model="/head", tree_topk=2, tree_depth=3)
    assert (explicit.tree_topk, explicit.tree_depth) == (2, 3)
    assert checked(method="eagle", model="/head", tree_topk=1).tree_depth is None
    with pytest.raises(ValueError, match="'eagle' needs model="):
        checked(method="eagle")


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("option", ["tree_topk", "tree_depth"])
def test_tree_options_are_refused_for_chain_only_methods(method: str, option: str) -> None:
    model = "/draft" if method == "draft_model" else None
    with pytest.raises(
        ValueError, match=f"'{method}' drafts chains only and does not use {option}"
    ):
        checked(method=method, model=model, **{option: 2})


@pytest.mark.parametrize("topk", [None, 1])
def test_tree_depth_needs_a_tree(topk: int | None) -> None:
    with pytest.raises(ValueError, match="tree_depth needs tree_topk >= 2"):
        checked(method="eagle", model="/head", tree_topk=topk, tree_depth=3)


@pytest.mark.parametrize("k", [17, 32, MAX_TREE_NODES])
def test_a_tree_budget_may_exceed_the_chain_limit(k: int) -> None:
    tree = checked(method="eagle", model="/head", num_speculative_tokens=k,
                               tree_topk=3)  # fmt: skip
    assert tree.num_speculative_tokens == k
    with pytest.raises(ValueError, match=r"must be an integer in \[1, 16\] \(a tree's node budget: "
                                         r"\[1, 64\]\), got " + str(k)):  # fmt: skip
        checked(method="eagle", model="/head", num_speculative_tokens=k)


@pytest.mark.parametrize("k", [0, MAX_TREE_NODES + 1, 8.0, True])
def test_bad_tree_budget(k: object) -> None:
    with pytest.raises(ValueError, match=r"\[1, 64\]\), got " + repr(k).replace(".", r"\.")):
        checked(method="eagle", model="/head", num_speculative_tokens=k, tree_topk=2)


BAD_TREE_OPTIONS = [
    *(pytest.param(o, v, id=f"{o}-{v!r}") for o in ("tree_topk", "tree_depth")
      for v in (0, -2, 2.0, True)),
    pytest.param("tree_depth", "3", id="tree_depth-'3'"),
    pytest.param("tree_topk", "3", id="tree_topk-'3'"),
]  # fmt: skip


@pytest.mark.parametrize(("option", "value"), BAD_TREE_OPTIONS)
def test_tree_options_must_be_integers_of_at_least_one(option: str, value: object) -> None:
    extra = {"tree_topk": 2} if option == "tree_depth" else {}
    with pytest.raises(ValueError, match=f"{option} must be an integer >= 1, got {value!r}"):
        checked(method="eagle", model="/head", **{option: value, **extra})


def test_auto_uses_a_shipped_head_with_its_tuned_tree(monkeypatch, tmp_path) -> None:
    """A named model whose EAGLE head ships, and was measured fastest (auto_head), drafts with
    it, with the settings stored beside it (models/embedded/heads/NAME/config.json
    "verispec_speculative"); without auto_head, or without the head, with its draft model."""
    head = tmp_path / "embedded-code-eagle"
    head.mkdir()
    tuned = {"num_speculative_tokens": 12, "tree_topk": 3, "tree_depth": 5}
    (head / "config.json").write_text(json.dumps({"verispec_speculative": tuned}))
    monkeypatch.setattr(default_models, "HEADS_DIR", tmp_path)
    for auto_head in (True, False):
        named = dict(resolve_module.NAMED_MODELS)
        named["embedded-code"] = replace(named["embedded-code"], auto_head=auto_head)
        monkeypatch.setattr(resolve_module, "NAMED_MODELS", named)
        own = SpecConfig(method="eagle", model=str(head), **tuned)
        draft = SpecConfig(method="draft_model", model="embedded-code-draft",
                           quantization="auto")  # fmt: skip
        assert resolve_module.own_drafter("embedded-code", "eagle") == own
        assert default_drafter("embedded-code") == (own if auto_head else draft)
    monkeypatch.setattr(default_models, "HEADS_DIR", tmp_path / "none")
    assert default_drafter("embedded-code").method == "draft_model"


def test_prompt_lookup_tokens_graft_onto_eagle_trees_and_draft_model_chains() -> None:
    head = {"method": "eagle", "model": "/h", "num_speculative_tokens": 8, "tree_topk": 3}
    spec = checked(**head, prompt_lookup_tokens=3)
    assert (spec.prompt_lookup_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (3, 2, 4)
    assert checked(**head).prompt_lookup_min is None  # off: lookup bounds unused
    with pytest.raises(ValueError, match="'ngram' does not graft prompt lookups onto its drafts"):
        checked(method="ngram", prompt_lookup_tokens=2)
    draft = {"method": "draft_model", "model": "/d", "num_speculative_tokens": 4}
    copied = checked(**draft, prompt_lookup_tokens=4)  # a chain: the copy may be all of it
    assert (copied.prompt_lookup_tokens, copied.prompt_lookup_min) == (4, 2)
    for bad in (0, 5):
        with pytest.raises(ValueError, match=r"integer in \[1, num_speculative_tokens\] \(the "
                                             r"copy replaces the chain\)"):  # fmt: skip
            checked(**draft, prompt_lookup_tokens=bad)
    with pytest.raises(ValueError, match=r"needs a tree \(tree_topk >= 2\) to graft onto"):
        checked(method="eagle", model="/h", prompt_lookup_tokens=2)
    for bad in (0, 8, 2.5, True):
        with pytest.raises(ValueError, match=r"prompt_lookup_tokens must be an integer in \[1, "
                                             r"num_speculative_tokens - 1\]"):  # fmt: skip
            checked(**head, prompt_lookup_tokens=bad)
    with pytest.raises(ValueError, match="does not use prompt_lookup_max; drop it"):
        checked(**head, prompt_lookup_max=3)


def test_errors_name_fields_and_the_cli_words_them_as_its_flags() -> None:
    """A SpecError names SpecConfig fields as parts: the library's message says the field, the
    CLI's the flag that sets it, with no rewriting of text."""
    from verispec.cli.options import FLAG_OF_FIELD

    with pytest.raises(SpecError) as info:
        checked(method="eagle", model="/h", tree_depth=3)
    assert str(info.value) == ("tree_depth needs tree_topk >= 2 (a chain's depth is "
                               "num_speculative_tokens)")  # fmt: skip
    assert info.value.worded(FLAG_OF_FIELD) == ("--tree-depth needs --tree-topk >= 2 (a chain's "
                                                 "depth is --k)")  # fmt: skip
    with pytest.raises(SpecError) as info:
        SpecConfig(model="d", quantization="q4")
    assert str(info.value).startswith("speculative quantization must be one of")
    assert info.value.worded(FLAG_OF_FIELD).startswith("--draft-quantization must be one of")
    with pytest.raises(SpecError) as info:
        checked(method="self", model="/d", draft_vocab_size=100)
    assert info.value.worded(FLAG_OF_FIELD).startswith(
        "method 'self' does not use model, --draft-vocab-size; drop them"
    )
