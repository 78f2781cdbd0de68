"""Structured output: a request's grammar as a token mask on each of its logits rows.

llguidance compiles a StructuredOutputsParams (a JSON schema, a regex, a choice, a Lark
grammar) against the tokenizer and tracks which tokens may come next. Chosen over xgrammar
because its wheel depends on nothing (xgrammar pulls in triton and its own torch), its masks
take tens of microseconds on a CPU, and its matcher rolls back consumed tokens, which is what
checking drafts needs.

A row's mask depends on the row's history: row j of a verify step sits after the request's
output and its first j drafts, so `GrammarMatcher.masks` consumes each row's drafts, reads the
mask and rolls them back. The mask is applied first in `sample.logits.warp`, so target and
drafter warp identically and the verified distribution is the constrained one
(docs/design.md, 3).
"""

from __future__ import annotations

import array
import copy
import json
from collections.abc import Sequence
from typing import Any, ClassVar

import llguidance
import torch

from verispec.types.sampling_params import StructuredOutputsParams

JSON_FORMAT: dict[str, Any] = {"item_separator": ", ", "key_separator": ": ",
                               "whitespace_flexible": False}  # fmt: skip
"""JSON's layout: Python's json.dumps separators and no other whitespace, so a model cannot
pad its answer with endless blanks; a schema's own "x-guidance" options override these."""


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar of one constraint (its validity is checked by `GrammarCompiler`).

    >>> grammar_text(StructuredOutputsParams(choice=["yes", "no"]))
    'start: "yes" | "no"'
    """
    if spec.json is not None or spec.json_object:
        schema = {"type": "object"} if spec.json_object else spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ValueError("structured_outputs.json must be a JSON schema object")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_FORMAT)
        except ValueError as e:
            raise ValueError(f"structured_outputs.json: {e}") from None
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        alternatives = " | ".join(json.dumps(c) for c in spec.choice)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    assert spec.grammar is not None  # StructuredOutputsParams holds exactly one constraint
    return llguidance.LLMatcher.grammar_from_lark(spec.grammar)


FORCED_PREFIX_TOKENS = 64
"""How many of a grammar's forced bytes `language_is_empty` follows before it stops looking."""


class _ByteTokenizer:
    """A tokenizer of single bytes, and EOS as token 256, in the shape llguidance's
    TokenizerWrapper reads: a grammar's masks over it say which bytes may come next."""

    eos_token_id = 256
    bos_token_id = None
    tokens: ClassVar[list[bytes]] = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids: ClassVar[list[int]] = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def language_is_empty(grammar: str) -> bool:
    """Whether no text matches a (valid) llguidance grammar: its matcher is dead at the start,
    or after the bytes the grammar forces (up to FORCED_PREFIX_TOKENS). Checked over bytes, so
    the answer holds for every tokenizer. It finds a regex or a terminal that matches nothing
    (`[a&&b]`) and a rule that never ends (`a: "x" a`), not an empty branch behind a free
    choice (`start: ("a" | "b") /[a&&b]/`).

    >>> language_is_empty(llguidance.LLMatcher.grammar_from_regex("[a&&b]"))
    True
    >>> language_is_empty(llguidance.LLMatcher.grammar_from_lark('start: "yes" | "no"'))
    False
    """
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()), slices=[])
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    mask = array.array("I", bytes(4 * ((tokenizer.vocab_size + 31) // 32)))
    matcher.unsafe_compute_mask_ptr(mask.buffer_info()[0], len(mask) * mask.itemsize)
    if matcher.is_error():  # computing the mask finds a start state with no way on
        return True
    forced = matcher.compute_ff_tokens()[:FORCED_PREFIX_TOKENS]
    if forced:
        matcher.try_consume_tokens(forced)
        matcher.unsafe_compute_mask_ptr(mask.buffer_info()[0], len(mask) * mask.itemsize)
    return matcher.is_error()


class GrammarCompiler:
    """The tokenizer as llguidance sees it (built once per engine: about a second for a large
    vocabulary), and the matchers of requests' constraints."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        """Width of a mask: the model's logits rows (a tokenizer may have fewer tokens)."""
        if getattr(hf_tokenizer, "backend_tokenizer", None) is None:
            raise ValueError("structured output needs a fast (Rust) tokenizer; this model's "
                             f"is a {type(hf_tokenizer).__name__}")  # fmt: skip
        backend = copy.copy(hf_tokenizer.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        self.tokenizer = llguidance.LLTokenizer(
            text_tokens_in_vocab(backend.to_str()), n_vocab=vocab_size,
            eos_token=sorted(eos_token_ids),
        )  # fmt: skip

    def matcher(self, spec: StructuredOutputsParams) -> GrammarMatcher:
        """A fresh matcher of `spec`; a ValueError says what is wrong with the constraint."""
        grammar = grammar_text(spec)
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(f"structured_outputs: {_kind(spec)} is invalid: {error.strip()}")
        if language_is_empty(grammar):
            raise ValueError(f"structured_outputs: {_kind(spec)} matches no text at all")
        return GrammarMatcher(llguidance.LLMatcher(self.tokenizer, grammar, log_level=0),
                              self.vocab_size)  # fmt: skip


def text_tokens_in_vocab(tokenizer_json: str) -> str:
    """A byte-level BPE tokenizer's JSON with its added tokens that are text, not special
    (Qwen2.5's `<tool_call>`), moved into the model's vocabulary.

    llguidance reads every added token as a special one, whose bytes no grammar literal
    matches, yet its forced-token step tokenizes a literal like "<tool_call>" into that very
    token: the mask allowed a token the matcher then refused. As vocabulary entries their bytes
    are their text, as the Hugging Face tokenizer decodes them. Other tokenizers are returned
    unchanged.
    """
    spec = json.loads(tokenizer_json)
    model, decoder = spec.get("model") or {}, spec.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        return tokenizer_json
    vocab, alphabet = model["vocab"], byte_alphabet()
    special = []
    for added in spec.get("added_tokens") or []:
        key = "".join(alphabet[b] for b in added["content"].encode("utf-8"))
        if added["special"] or vocab.get(key, added["id"]) != added["id"]:
            special.append(added)
        else:
            vocab[key] = added["id"]
    spec["added_tokens"] = special
    return json.dumps(spec)


def byte_alphabet() -> list[str]:
    """Byte-level BPE's spelling of each byte (GPT-2's): printable Latin-1 bytes as themselves,
    the other 68 as the code points from 256 up, in byte order.

    >>> a = byte_alphabet(); a[ord("<")], a[ord(" ")], a[ord("\\n")]
    ('<', 'Ġ', 'Ċ')
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = [""] * 256, 256
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b], extra = chr(extra), extra + 1
    return out


def _kind(spec: StructuredOutputsParams) -> str:
    if spec.json is not None:
        return "the JSON schema"
    return next(f"the {name}" for name in ("regex", "choice", "grammar")
                if getattr(spec, name) is not None)  # fmt: skip


_BITS = torch.arange(32, dtype=torch.int32)  # [32] bit positions of a mask word


class GrammarMatcher:
    """One request's grammar state after its output so far; advanced by emitted tokens only
    (drafts are consumed and rolled back within `masks` and `valid_prefix`)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def masks(self, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        """[n, vocab] bool: which tokens may follow each history (tokens after the output so
        far). A history the grammar rejects is a row no output can reach (its draft has p = 0
        and is never accepted): every token is allowed there, so the row stays a distribution.

        Consecutive histories that extend each other (a chain's rows, a tree's depth-first
        rows) reuse what is consumed: only the differing tail is rolled back.
        """
        m = self.matcher
        words = torch.empty(len(histories), (self.vocab_size + 31) // 32, dtype=torch.int32)
        consumed: list[int] = []
        for row, history in enumerate(histories):
            common = common_prefix(consumed, history)
            if len(consumed) > common:
                m.rollback(len(consumed) - common)
                del consumed[common:]
            rest = list(history[common:])
            taken = m.try_consume_tokens(rest) if rest else 0  # stops at a forbidden token
            consumed.extend(rest[:taken])
            if taken == len(rest):
                v = words[row]
                m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())
            else:
                words[row] = -1  # every bit set
        if consumed:
            m.rollback(len(consumed))
        bits = (words.unsqueeze(-1) >> _BITS) & 1  # [n, words, 32]
        return bits.reshape(len(histories), -1)[:, : self.vocab_size].bool()

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` (after the output so far) the grammar accepts, in order."""
        return self.matcher.validate_tokens(list(tokens))

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next, after the output so far: the bytes
        no other text can follow with, tokenized as the tokenizer would (llguidance's
        compute_ff_tokens). Another tokenization of the same bytes may still be allowed, so
        they are drafts to verify, not tokens to emit. None once the grammar has stopped."""
        if limit <= 0 or self.matcher.is_stopped():
            return []
        return self.matcher.compute_ff_tokens()[:limit]

    def after(self, tokens: Sequence[int]) -> GrammarMatcher:
        """This grammar as seen after `tokens` not yet emitted (a request's forced drafts): a
        drafter that drafts on after them masks and trims its drafts as the target will."""
        return _GrammarAfter(self, list(tokens))

    def advance(self, token: int) -> None:
        """Consume one emitted token (always allowed: the masked target sampled it). Once the
        grammar is complete only EOS may follow, which changes nothing (ignore_eos runs on)."""
        if self.matcher.is_stopped():
            return
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar rejected emitted token {token}: "
                               f"{self.matcher.get_error()}")  # fmt: skip


class _GrammarAfter(GrammarMatcher):
    """A GrammarMatcher read after some pending tokens: every history it is asked about is
    prefixed with them. Read-only: tokens are emitted into the request's own matcher."""

    def __init__(self, inner: GrammarMatcher, pending: list[int]) -> None:
        super().__init__(inner.matcher, inner.vocab_size)
        self.inner, self.pending = inner, pending

    def masks(self, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        return self.inner.masks([self.pending + list(h) for h in histories])

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        n = self.inner.valid_prefix(self.pending + list(tokens))
        return max(0, n - len(self.pending))

    def forced_tokens(self, limit: int) -> list[int]:
        raise RuntimeError("forced tokens are read from the request's own grammar")

    def advance(self, token: int) -> None:
        raise RuntimeError("a grammar read after pending tokens is read-only")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
