"""propose_ngram on hand-worked token arrays, and against a brute-force reference."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verispec.drafters.ngram import propose_ngram

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits


def reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The docstring's definition, spelled out: longest n first, then the largest i."""
    for n in range(max_n, min_n - 1, -1):
        if n > len(tokens):
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - 1 - n, -1, -1):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + k]
    return []


@pytest.mark.parametrize(
    ("tokens", "min_n", "max_n", "k", "expected"),
    [
        ([1, 2, 3, 4, 5], 1, 3, 3, []),  # the last token never occurred before
        ([], 1, 3, 3, []),
        ([7], 1, 3, 3, []),
        ([1, 2, 3, 9, 1, 2], 1, 1, 3, [3, 9, 1]),  # n = 1 alone
        ([1, 2, 3, 4, 2, 3, 9, 1, 2, 3], 1, 3, 2, [4, 2]),  # full [1, 2, 3] beats recent [2, 3]
        ([1, 2, 3, 4, 2, 3, 9, 1, 2, 3], 1, 2, 2, [9, 1]),  # two [2, 3]s: the most recent
        ([5, 3, 8, 6, 3, 9, 4, 3], 2, 3, 2, []),  # only 1-gram matches, below min_n
        ([5, 3, 8, 6, 3, 9, 4, 3], 1, 3, 2, [9, 4]),  # falls back to n = 1, most recent 3
        ([4, 5, 6, 7, 1, 5, 6], 1, 4, 5, [7, 1, 5, 6]),  # n = 2; runs into the end, cut short
        ([1, 2, 1, 2, 1, 2], 2, 2, 3, [1, 2]),  # overlaps the suffix: proposes the next period
        ([1, 2, 1, 2, 1, 2], 1, 4, 3, [1, 2]),  # n = 4 matches at i = 0
        ([3, 3], 1, 2, 4, [3]),  # [3, 3] can't match itself; [3] at i = 0 does
        ([1, 2, 3], 1, 2, 4, []),
        ([1, 2, 3, 4, 1, 2], 1, 2, 0, []),  # k = 0
    ],
)
def test_hand_worked(
    tokens: list[int], min_n: int, max_n: int, k: int, expected: list[int]
) -> None:
    assert propose_ngram(tokens, min_n, max_n, k) == expected


def test_suffix_never_matches_itself() -> None:
    # Every n-gram of a sequence of distinct tokens occurs once: the suffix itself.
    assert propose_ngram(list(range(20)), 1, 5, 4) == []
    # The only earlier [8, 9] ends at index 2, so the proposal starts right after it.
    assert propose_ngram([0, 8, 9, 1, 2, 8, 9], 2, 2, 3) == [1, 2, 8]


def test_accepts_any_sequence() -> None:
    assert propose_ngram((1, 2, 3, 1, 2), 1, 2, 2) == [3, 1]


@pytest.mark.parametrize(
    ("min_n", "max_n", "k", "message"),
    [(0, 3, 2, "min_n"), (3, 2, 2, "min_n"), (-1, -1, 2, "min_n"), (1, 3, -1, "k")],
)
def test_invalid_arguments_raise(min_n: int, max_n: int, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        propose_ngram([1, 2, 1, 2], min_n, max_n, k)


@given(
    tokens=st.lists(st.integers(0, 3), max_size=30),
    min_n=st.integers(1, 5),
    extra=st.integers(0, 4),
    k=st.integers(0, 8),
)
def test_matches_brute_force_reference(tokens: list[int], min_n: int, extra: int, k: int) -> None:
    max_n = min_n + extra
    assert propose_ngram(tokens, min_n, max_n, k) == reference(tokens, min_n, max_n, k)
