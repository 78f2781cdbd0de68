"""The grammar's masks (sample/grammar.py): each row's mask is the one a fresh matcher gives
after that row's history, histories the grammar rejects allow every token, and reading masks
leaves the matcher where it was (drafts are rolled back exactly)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.helpers.distribution import VOCAB, char_tokenizer
from verispec import StructuredOutputsParams
from verispec.sample.grammar import (
    GrammarCompiler,
    GrammarMatcher,
    grammar_text,
    language_is_empty,
)

# a .. i are ids 3 .. 11; </s> (1) is EOS. The second letter depends on the first.
REGEX = r"(a(b|c)|d(e|f|g)|h[a-i])[a-i][a-i]+"


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(char_tokenizer(), VOCAB, [1])


def ids(text: str) -> list[int]:
    return [3 + ord(c) - ord("a") for c in text]


def fresh_mask(compiler: GrammarCompiler, history: list[int]) -> torch.Tensor:
    """The mask after `history`, from a new matcher that consumed it one token at a time."""
    m = compiler.matcher(StructuredOutputsParams(regex=REGEX))
    for token in history:
        m.advance(token)
    return m.masks([[]])[0]


def test_each_row_is_masked_after_its_own_history(compiler: GrammarCompiler) -> None:
    m = compiler.matcher(StructuredOutputsParams(regex=REGEX))
    # a chain's rows, a tree's rows (depth first, then a sibling), and a longer valid one
    histories = [[], ids("a"), ids("ab"), ids("abcd"), ids("d"), ids("dg"), ids("h"), ids("hia")]
    masks = m.masks(histories)
    for history, mask in zip(histories, masks, strict=True):
        assert torch.equal(mask, fresh_mask(compiler, history)), history
    assert masks[0].nonzero().flatten().tolist() == ids("adh")  # the first letter
    assert masks[1].nonzero().flatten().tolist() == ids("bc")  # after a
    assert masks[3][1] and not masks[2][1]  # EOS once the grammar accepts (4 letters on)


def test_reading_masks_leaves_the_matcher_where_it_was(compiler: GrammarCompiler) -> None:
    m = compiler.matcher(StructuredOutputsParams(regex=REGEX))
    m.advance(ids("d")[0])
    before = m.masks([[]])
    m.masks([ids("e"), ids("ef"), ids("efg"), ids("g"), ids("a")])
    assert torch.equal(m.masks([[]]), before)
    assert torch.equal(before[0], fresh_mask(compiler, ids("d")))


def test_a_history_the_grammar_rejects_allows_every_token(compiler: GrammarCompiler) -> None:
    """Its draft has p = 0 under the masked target, so no output reaches the row; it stays a
    distribution (all allowed) rather than an empty one."""
    m = compiler.matcher(StructuredOutputsParams(regex=REGEX))
    rows = m.masks([ids("b"), ids("bb"), ids("a")])
    assert rows[0].all() and rows[1].all()
    assert torch.equal(rows[2], fresh_mask(compiler, ids("a")))


def test_valid_prefix_counts_the_drafts_the_grammar_takes(compiler: GrammarCompiler) -> None:
    m = compiler.matcher(StructuredOutputsParams(regex=REGEX))
    assert m.valid_prefix(ids("dfaa")) == 4
    assert m.valid_prefix(ids("dbaa")) == 1
    assert m.valid_prefix([]) == 0


def test_a_finished_choice_allows_only_eos(compiler: GrammarCompiler) -> None:
    m = compiler.matcher(StructuredOutputsParams(choice=["abc", "ab"]))
    rows = m.masks([ids("ab"), ids("abc")])
    assert rows[0].nonzero().flatten().tolist() == [1, *ids("c")]
    assert rows[1].nonzero().flatten().tolist() == [1]
    for token in [*ids("abc"), 1, 1]:  # EOS after the end changes nothing (ignore_eos)
        m.advance(token)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (StructuredOutputsParams(regex="[a-"), "regex is invalid"),
        (StructuredOutputsParams(json={"type": "nonsense"}), "JSON schema is invalid"),
        (StructuredOutputsParams(json="{not json"), "not valid JSON"),
        (StructuredOutputsParams(grammar="start: (("), "grammar is invalid"),
        (StructuredOutputsParams(regex="[a&&b]"), "regex matches no text at all"),
        (StructuredOutputsParams(grammar="start: /[a&&b]/"), "grammar matches no text at all"),
    ],
)
def test_bad_constraints_are_value_errors(
    compiler: GrammarCompiler, spec: StructuredOutputsParams, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        compiler.matcher(spec)


@pytest.mark.parametrize(("spec", "empty"), [
    (StructuredOutputsParams(regex="[a&&b]"), True),  # a class with no member
    (StructuredOutputsParams(regex="x[^\\s\\S]"), True),  # dead after a forced x
    (StructuredOutputsParams(grammar="start: /[a&&b]/"), True),
    (StructuredOutputsParams(grammar='start: "xyzzy" /[a&&b]/'), True),  # after forced bytes
    (StructuredOutputsParams(grammar='start: a\na: "x" a'), True),  # a rule that never ends
    (StructuredOutputsParams(grammar='start: ""'), False),  # the empty text is a text
    (StructuredOutputsParams(regex="a+"), False),
    (StructuredOutputsParams(regex="(a|[a&&b])"), False),
    (StructuredOutputsParams(grammar='start: a\na: "x" a | "y"'), False),
    (StructuredOutputsParams(grammar='start: "q" | a\na: "x" a'), False),
    (StructuredOutputsParams(grammar='start: "' + "ab" * 5000 + '"'), False),
    (StructuredOutputsParams(choice=["yes", "no"]), False),
    (StructuredOutputsParams(json={"type": "object"}), False),
    (StructuredOutputsParams(json={"enum": ["a", 1, None]}), False),
], ids=lambda v: str(v)[:50])  # fmt: skip
def test_language_is_empty(spec: StructuredOutputsParams, empty: bool) -> None:
    assert language_is_empty(grammar_text(spec)) is empty


def test_json_layout_is_compact_with_spaces(compiler: GrammarCompiler) -> None:
    """The JSON grammar takes json.dumps's separators and nothing looser."""
    text = grammar_text(StructuredOutputsParams(json={"type": "object"}))
    assert json.loads(text)["grammars"][0]["json_schema"]["x-guidance"]["key_separator"] == ": "


def test_structured_outputs_takes_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])


def test_matcher_type(compiler: GrammarCompiler) -> None:
    assert isinstance(compiler.matcher(StructuredOutputsParams(json_object=True)), GrammarMatcher)


def test_an_added_text_token_is_text_to_the_grammar(tokenizer) -> None:
    """An added token that is not special (Qwen2.5's <tool_call>) is its text: every token the
    mask allows is one the matcher then takes (llguidance alone reads added tokens as special,
    forced "<tool_call>" into that token, then refused it)."""
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<tool_call>"])  # not special, as in Qwen2.5's tokenizer
    added = tok.convert_tokens_to_ids("<tool_call>")
    compiler = GrammarCompiler(tok, len(tok), [1])
    m = compiler.matcher(StructuredOutputsParams(grammar='start: "<tool_call>" "\\n" "ok"'))
    emitted = []
    while not m.matcher.is_stopped():
        allowed = m.masks([[]])[0].nonzero().flatten().tolist()
        assert allowed and all(m.valid_prefix([t]) == 1 for t in allowed), allowed
        emitted.append(allowed[0])
        m.advance(allowed[0])
        if allowed == [1]:
            break
    assert tok.decode(emitted, skip_special_tokens=True) == "<tool_call>\nok"
    assert m.valid_prefix([added]) == 0  # consumed already; from the start it is taken:
    assert compiler.matcher(StructuredOutputsParams(regex="<tool_call>x")).valid_prefix([added])


def test_forced_tokens_are_what_the_grammar_leaves_no_choice_about(
    compiler: GrammarCompiler,
) -> None:
    m = compiler.matcher(StructuredOutputsParams(regex="abc(d|e)fg"))
    assert m.forced_tokens(8) == ids("abc")
    assert m.forced_tokens(2) == ids("ab") and m.forced_tokens(0) == []
    for token in ids("abce"):
        m.advance(token)
    assert m.forced_tokens(8) == ids("fg")
    for token in ids("fg"):
        m.advance(token)
    m.advance(1)  # EOS: the grammar has stopped
    assert m.forced_tokens(8) == []


def test_a_grammar_after_pending_tokens_reads_every_history_after_them(
    compiler: GrammarCompiler,
) -> None:
    m = compiler.matcher(StructuredOutputsParams(regex=REGEX))
    after = m.after(ids("h"))
    histories = [[], ids("a"), ids("ab")]
    for history, mask in zip(histories, after.masks(histories), strict=True):
        assert torch.equal(mask, fresh_mask(compiler, ids("h") + history)), history
    assert after.valid_prefix([*ids("ab"), 1]) == 2 and after.valid_prefix([1]) == 0  # EOS early
    with pytest.raises(RuntimeError, match="read-only"):
        after.advance(ids("a")[0])
    assert torch.equal(m.masks([[]])[0], fresh_mask(compiler, []))  # m itself did not move
