"""Prompt lookup: propose draft tokens by copying what followed an earlier copy of the suffix.

Pure Python over token lists, no model (Saxena 2023, "Prompt Lookup Decoding";
vLLM's n-gram proposer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from verispec.config import SpecConfig, SpecError, SpecField
from verispec.engine.drafter import Drafts
from verispec.engine.request import TokenHistory


@dataclass(frozen=True, slots=True)
class PromptLookupConfig:
    """Prompt lookup's n-gram bounds: the longest suffix first, down to the shortest (ngram,
    and the lookups other drafters graft)."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {"min": "prompt_lookup_min",
                                             "max": "prompt_lookup_max"}  # fmt: skip
    min: int = 2
    max: int = 4

    def __post_init__(self) -> None:
        lo, hi = self.min, self.max
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi))
        if not (ints and 1 <= lo <= hi):
            low, high = SpecField("prompt_lookup_min"), SpecField("prompt_lookup_max")
            raise SpecError(low, " and ", high, " must be integers with 1 <= ", low, " <= ", high,
                            f", got {lo!r} and {hi!r}")  # fmt: skip

    @classmethod
    def of(cls, spec: SpecConfig) -> PromptLookupConfig:
        return spec.options(cls)


@dataclass(frozen=True, slots=True)
class LookupGraftConfig:
    """A prompt-lookup chain a drafter grafts onto its drafts: up to `tokens` of them (None:
    off), found within PromptLookupConfig's bounds."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {"tokens": "prompt_lookup_tokens"}
    tokens: int | None = None

    @classmethod
    def of(cls, spec: SpecConfig) -> LookupGraftConfig:
        return spec.options(cls)

    def check(self, k: int, chain: bool) -> None:
        """tokens in [1, k] for a chain (the copy is then the whole chain), in [1, k - 1] for a
        tree (which keeps at least one node of its own)."""
        n, field = self.tokens, SpecField("prompt_lookup_tokens")
        top, why = ((k, "the copy replaces the chain") if chain
                    else (k - 1, "the tree keeps at least one node of its own"))  # fmt: skip
        bound = SpecField("num_speculative_tokens")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= top:
            raise SpecError(field, " must be an integer in [1, ", bound,
                            "" if chain else " - 1", f"] ({why}), got {n!r} with ", bound,
                            f"={k}")  # fmt: skip

    def lookup(self, bounds: PromptLookupConfig) -> Lookup | None:
        """The lookup the drafter runs, None when off."""
        return None if self.tokens is None else Lookup(self.tokens, bounds.min, bounds.max)


def propose_ngram(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Propose up to `k` draft tokens by matching the suffix of `tokens` against its own past.

    `tokens` is prompt + output so far; its last token is the one just emitted. For n from
    `max_n` down to `min_n`, the suffix `tokens[-n:]` is searched for an earlier occurrence
    `tokens[i:i+n]` with `i + n <= len(tokens) - 1`, so the suffix never matches itself. The
    first n with a match wins (longer context predicts better), and among its occurrences the
    most recent one (largest i) is used; the proposal is `tokens[i+n : i+n+k]`, shorter than
    `k` where it runs into the end of `tokens`, and `[]` where no n matches.

    Most recent, not vLLM's earliest or llama.cpp's most frequent: when the model rewrites
    code or text it copies the latest version, which already holds earlier edits. The
    continuation may overlap the suffix itself, which is what lets a repeating pattern keep
    proposing its next period.

    Worked example, tokens = [1, 2, 3, 4, 2, 3, 9, 1, 2, 3] (indices 0..9), k = 2:
    - max_n = 3: the suffix [1, 2, 3] occurred at i = 0, so the proposal is tokens[3:5] =
      [4, 2], even though the shorter suffix [2, 3] occurred more recently, at i = 4.
    - max_n = 2: the suffix [2, 3] occurred at i = 1 and i = 4; the most recent gives
      tokens[6:8] = [9, 1].
    - tokens = [1, 2, 1, 2, 1, 2], min_n = max_n = 2, k = 3: [1, 2] occurred at i = 0 and
      i = 2 (i = 4 is the suffix itself); i = 2 gives tokens[4:7] = [1, 2], cut at the end.

    Cost: one backward scan that compares n-grams only where the last token recurs; about
    50 us on 4096 tokens in CPython for a realistic vocabulary.
    """
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0 or len(tokens) < 2:
        return []
    rev = list(reversed(tokens))
    r, n = _longest_match(rev, max_n)
    if n < min_n:
        return []
    end = len(tokens) - r  # one past the matched occurrence: i + n
    return list(tokens[end : end + k])


def _longest_match(rev: list[int], max_n: int) -> tuple[int, int]:
    """Best earlier occurrence of the suffix, in reversed coordinates.

    `rev` is tokens reversed, so the suffix of length n is `rev[:n]` and an occurrence ending
    at original index j starts at `r = len - 1 - j` here (r >= 1 excludes the suffix itself).
    Returns (r, n) for the longest match length n <= max_n and, among those, the smallest r
    (most recent); n = 0 when the last token never occurred before.
    """
    length = len(rev)
    best_r = best_n = 0
    r = 1
    while True:
        try:
            r = rev.index(rev[0], r)  # C-speed scan to the next earlier copy of the last token
        except ValueError:
            break
        n = 1
        while n < max_n and r + n < length and rev[r + n] == rev[n]:
            n += 1
        if n > best_n:
            best_r, best_n = r, n
            if n == max_n:
                break
        r += 1
    return best_r, best_n


@dataclass(frozen=True, slots=True)
class Lookup:
    """Prompt-lookup settings of a drafter that grafts lookups onto its trees."""

    tokens: int
    """Longest chain grafted."""
    min_n: int
    max_n: int

    def chain(self, request: TokenHistory, budget: int) -> list[int]:
        """The lookup continuation of request's context: at most min(tokens, budget) ids."""
        k = max(0, min(self.tokens, budget))
        return propose_ngram(request.all_token_ids, self.min_n, self.max_n, k)


class NgramProposer:
    """The prompt-lookup drafter: deterministic, so q is one-hot at each draft (probs None)."""

    continues_forced = True
    """It reads only the history it is handed: it drafts on after grammar-forced drafts
    (engine/drafter.py, ContinuesForced)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, requests: Sequence[TokenHistory], num_tokens: Sequence[int]) -> Drafts:
        """Up to num_tokens[i] tokens copied from earlier in requests[i]'s own context."""
        ids = [
            propose_ngram(r.all_token_ids, self.min_n, self.max_n, k)
            for r, k in zip(requests, num_tokens, strict=True)
        ]
        return Drafts(token_ids=ids, probs=None)

    def release(self, request: TokenHistory) -> None:
        """Nothing is kept per request."""
