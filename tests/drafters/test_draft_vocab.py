"""A draft's reduced vocabulary: the ranking and the ids kept (hand-worked), the tokens always
kept, the bounded sample, the cache, and the errors for sizes out of range."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from tests.helpers.chat import with_chat_template
from tests.helpers.distribution import word_tokenizer
from tests.helpers.drafting import small_vocab_sample
from verispec.drafters import draft_vocab
from verispec.drafters.draft_vocab import (
    always_kept,
    byte_tokens,
    cached_ranking,
    count_tokens,
    keep_ids,
    rank_tokens,
    sample_texts,
)
from verispec.tokenizer import Tokenizer
from verispec.train.tokenizer import save_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits

SMALL_SAMPLE = 200_000
"""Characters counted in these tests (small_vocab_sample's; the real sample is larger)."""


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty verispec cache and a small sample, for this test only."""
    small_vocab_sample(monkeypatch, tmp_path / "cache")
    assert draft_vocab.CORPUS_CHARS == SMALL_SAMPLE
    return tmp_path / "cache"


def saved(tokenizer: PreTrainedTokenizerFast, path: Path) -> Tokenizer:
    path.mkdir()
    save_tokenizer(tokenizer, path)
    return Tokenizer(path)


def test_rank_tokens_by_count_then_id() -> None:
    assert rank_tokens(torch.tensor([0, 5, 2, 5, 1])) == [1, 3, 2, 4]
    assert rank_tokens(torch.tensor([3, 3, 3])) == [0, 1, 2]
    assert rank_tokens(torch.zeros(4, dtype=torch.int64)) == []


def test_keep_ids_worked_examples() -> None:
    # always first, then the ranking (9 is past the limit), ascending
    assert keep_ids([7, 3, 9, 1], always=[0, 2], size=5, limit=9) == [0, 1, 2, 3, 7]
    # the ranking runs out: the lowest ids left fill the rest
    assert keep_ids([4], always=[0], size=4, limit=9) == [0, 1, 2, 4]
    assert keep_ids([], always=[], size=3, limit=3) == [0, 1, 2]
    # an always-kept id past the limit is not kept (nor counted against the size)
    assert keep_ids([5, 1], always=[8], size=2, limit=6) == [1, 5]


@pytest.mark.parametrize(
    ("size", "message"),
    [(10, "at most 9, the token ids the draft's tokenizer and the target share; got 10"),
     (1, "at least 2: the special, chat-template and byte tokens are always kept; got 1")],
)  # fmt: skip
def test_keep_ids_refuses_sizes_out_of_range(size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        keep_ids([3, 4], always=[0, 1], size=size, limit=9)


def test_byte_tokens_of_both_kinds() -> None:
    vocab = {"a": 0, "Ġ": 1, "Ċ": 2, "ab": 3, "<0x0A>": 4, "<0xff>": 5, "é": 6, "日": 7, "ĀĀ": 8}
    # one-character byte-level tokens (Ġ: the space, Ċ: the newline, é: byte 0xE9) and
    # SentencePiece's byte fallbacks (upper-case hex); never merges or other characters
    assert byte_tokens(vocab) == [0, 1, 2, 4, 6]


def test_always_kept_holds_specials_bytes_and_template_tokens(tokenizer, tmp_path: Path) -> None:
    plain = saved(tokenizer, tmp_path / "plain")
    kept = always_kept(plain)
    assert {0, 1, 2} <= kept  # <s>, </s>, <pad>
    bytes_ = byte_tokens(tokenizer.get_vocab())
    assert len(bytes_) == 256 and set(bytes_) <= kept
    chat = saved(with_chat_template(tokenizer), tmp_path / "chat")
    from_template = always_kept(chat) - kept
    assert from_template, "the template's own merges (e.g. of '<|user|>') are kept too"
    assert all(i >= 259 for i in from_template)
    words = saved(word_tokenizer(), tmp_path / "words")
    assert always_kept(words) == {0, 1, 2}  # no byte tokens in a word-level vocabulary


def test_sample_texts_is_bounded_and_spread() -> None:
    texts = sample_texts(SMALL_SAMPLE)
    chars = sum(map(len, texts))
    assert SMALL_SAMPLE <= chars <= SMALL_SAMPLE + max(map(len, texts))
    assert 1 < len(texts) and chars - len(texts[-1]) < SMALL_SAMPLE


def test_count_tokens_counts_without_specials(tokenizer, tmp_path: Path) -> None:
    tok = saved(tokenizer, tmp_path / "t")
    texts = ["def add(a, b):\n", "return a + b\n"]
    counts = count_tokens(tok, texts)
    ids = [i for t in texts for i in tokenizer.encode(t, add_special_tokens=False)]
    assert counts.tolist() == torch.bincount(torch.tensor(ids), minlength=len(tokenizer)).tolist()
    assert counts[0] == 0  # no <s>


def test_the_ranking_is_counted_once_then_read_from_the_cache(
    tokenizer, tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = saved(tokenizer, tmp_path / "t")
    counted = []
    count = draft_vocab.count_tokens

    def spy(*args: object) -> torch.Tensor:
        counted.append(1)
        return count(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(draft_vocab, "count_tokens", spy)
    first = draft_vocab.draft_vocab(tok, 280, len(tokenizer))
    assert len(counted) == 1 and len(list((own_cache / "draft_vocab").glob("*.json"))) == 1
    again = draft_vocab.draft_vocab(tok, 280, len(tokenizer))
    smaller = draft_vocab.draft_vocab(tok, 265, len(tokenizer))
    assert len(counted) == 1, "the cached ranking was counted again"
    assert torch.equal(first, again) and first.dtype == torch.int64 and len(first) == 280
    assert set(smaller.tolist()) <= set(first.tolist())  # the same ranking, cut shorter
    assert bool((first.diff() > 0).all())
    ranking = cached_ranking(tok)
    assert set(first.tolist()) >= set(ranking[:280 - 259])  # the most frequent after the 259
    monkeypatch.setattr(draft_vocab, "CORPUS_CHARS", SMALL_SAMPLE // 2)  # another sample:
    draft_vocab.draft_vocab(tok, 280, len(tokenizer))  # another entry
    assert len(counted) == 2 and len(list((own_cache / "draft_vocab").glob("*.json"))) == 2


def test_the_whole_vocabulary_needs_no_counting(
    tokenizer, tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = saved(tokenizer, tmp_path / "t")
    monkeypatch.setattr(draft_vocab, "cached_ranking", lambda _: pytest.fail("counted"))
    assert draft_vocab.draft_vocab(tok, 300, 300).tolist() == list(range(300))


@pytest.mark.parametrize(
    ("size", "message"),
    [(321, "at most 320"), (258, "at least 259: the special, chat-template and byte tokens")],
)
def test_sizes_out_of_range_are_refused_before_counting(
    tokenizer, tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch, size: int,
    message: str,
) -> None:  # fmt: skip
    tok = saved(tokenizer, tmp_path / "t")
    monkeypatch.setattr(draft_vocab, "cached_ranking", lambda _: pytest.fail("counted"))
    with pytest.raises(ValueError, match=message):
        draft_vocab.draft_vocab(tok, size, len(tokenizer))
