"""A draft model's reduced vocabulary (FR-Spec): the token ids its LM head keeps. Every special,
added, chat-template and byte token, so no text becomes undraftable, then the ids most frequent
in a sample of text: the running interpreter's standard library sources (code, and English in
their comments and docstrings; data/corpus.py), tokenized with the draft's own tokenizer.

Counting takes seconds, so the ranking is kept in the cache (<cache>/draft_vocab/), keyed by the
tokenizer's vocabulary and the sample's description; the ids for a size are then picked from
it at once (keep_ids).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from operator import itemgetter
from pathlib import Path

import torch

from verispec.data.corpus import corpus_files, read_texts, stdlib_root
from verispec.paths import cache_dir, read_cache_json, write_cache_json
from verispec.tokenizer import Tokenizer
from verispec.types.chat import chat_prompt

CORPUS_CHARS = 8_000_000
"""Characters of the standard library counted (files spread evenly over it up to this many):
a few seconds of tokenizing, once per vocabulary."""
CACHE_FORMAT = 1
"""Part of every cache key: bump it when what is counted, or how, changes."""
SAMPLE_CHAT = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})
"""A conversation whose rendering holds the chat template's own tokens (role markers, ends)."""


def rank_tokens(counts: torch.Tensor) -> list[int]:
    """Token ids by descending count, ties by ascending id; ids never counted are left out.

    >>> rank_tokens(torch.tensor([0, 5, 2, 5, 1]))
    [1, 3, 2, 4]
    """
    order = torch.argsort(-counts, stable=True)  # stable: equal counts stay in id order
    return order[counts[order] > 0].tolist()


def keep_ids(ranking: Sequence[int], always: Iterable[int], size: int, limit: int) -> list[int]:
    """The `size` ids a reduced head keeps, ascending (so its first largest logit is the lowest
    id, as over the whole vocabulary): every id of `always`, then the best-ranked others, then
    (when the ranking runs out) the lowest ids left, which in a BPE vocabulary are its earliest,
    most frequent merges; only ids below `limit`. ValueError when size is above limit or below
    the ids always kept (check_size).

    >>> keep_ids([7, 3, 9, 1], always=[0, 2], size=5, limit=9)
    [0, 1, 2, 3, 7]
    >>> keep_ids([4], always=[0], size=4, limit=9)
    [0, 1, 2, 4]
    """
    kept = {i for i in always if 0 <= i < limit}
    check_size(size, len(kept), limit)
    for ids in (ranking, range(limit)):
        for i in ids:
            if len(kept) == size:
                return sorted(kept)
            if 0 <= i < limit:
                kept.add(i)
    return sorted(kept)


def check_size(size: int, always: int, limit: int) -> None:
    """ValueError unless always <= size <= limit: a head keeps at least the `always` ids every
    reduced vocabulary keeps, and at most the `limit` ids the draft and the target share."""
    if size > limit:
        raise ValueError(f"draft_vocab_size must be at most {limit}, the token ids the draft's "
                         f"tokenizer and the target share; got {size}")  # fmt: skip
    if size < always:
        raise ValueError(f"draft_vocab_size must be at least {always}: the special, "
                         f"chat-template and byte tokens are always kept; got {size}")  # fmt: skip


def byte_tokens(vocab: dict[str, int]) -> list[int]:
    """The ids of the vocabulary's byte tokens: byte-level BPE's 256 one-character tokens (GPT-2,
    Qwen, Llama 3: a printable Latin-1 byte is its own character, each of the other 68 bytes is
    chr(256 + n) in byte order) and SentencePiece's byte fallbacks <0x00> .. <0xFF>."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    alphabet = {chr(b) for b in printable} | {chr(256 + n) for n in range(256 - len(printable))}
    names = alphabet | {f"<0x{b:02X}>" for b in range(256)}
    return sorted(i for token, i in vocab.items() if token in names)


def always_kept(tokenizer: Tokenizer) -> set[int]:
    """Ids every reduced vocabulary keeps: special and added tokens, the end-of-sequence ids,
    the tokens of a conversation rendered by the chat template, and the byte tokens."""
    hf = tokenizer.hf
    ids = {*hf.all_special_ids, *hf.added_tokens_decoder, *tokenizer.eos_token_ids}
    if tokenizer.chat_template is not None:
        try:
            ids.update(chat_prompt(hf, SAMPLE_CHAT, "the draft")[1])
        except ValueError:  # a template that refuses this conversation: no tokens from it
            pass
    return ids | set(byte_tokens(hf.get_vocab()))


def sample_texts(max_chars: int, root: Path | None = None) -> list[str]:
    """Standard library sources (the training split) until they hold max_chars characters
    (the last file whole): every s-th file, s about the library's size over max_chars, then
    the files after those, and so on, so the sample spreads over the whole library."""
    files = corpus_files("train", root)
    step = max(1, sum(f.stat().st_size for f in files) // max(max_chars, 1))
    texts: list[str] = []
    chars = 0
    for text in read_texts([f for start in range(step) for f in files[start::step]]):
        if chars >= max_chars:
            break
        texts.append(text)
        chars += len(text)
    return texts


def count_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """How often each id occurs in the texts, tokenized without special tokens: int64
    [tokenizer.vocab_size]. A fast tokenizer encodes them in one batch on its own threads
    (twice as fast as through transformers' wrapper, which also warns of long texts)."""
    hf = tokenizer.hf
    if hf.is_fast:
        encoded = [e.ids for e in hf.backend_tokenizer.encode_batch(list(texts),
                                                                    add_special_tokens=False)]
    else:
        encoded = hf(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    ids = torch.tensor([i for enc in encoded for i in enc], dtype=torch.int64)
    return torch.bincount(ids, minlength=tokenizer.vocab_size)[: tokenizer.vocab_size]


def draft_vocab(tokenizer: Tokenizer, size: int, limit: int) -> torch.Tensor:
    """The ids [size] int64, ascending, that a draft with this tokenizer keeps in its head
    (keep_ids over the cached ranking, counted on first use); limit: the ids the draft's
    tokenizer and the target share. ValueError for a size out of range."""
    always = {i for i in always_kept(tokenizer) if i < limit}
    check_size(size, len(always), limit)  # before any counting
    ranking = [] if size == limit else cached_ranking(tokenizer)
    return torch.tensor(keep_ids(ranking, always, size, limit), dtype=torch.int64)


def cached_ranking(tokenizer: Tokenizer) -> list[int]:
    """rank_tokens over the standard library sample for this tokenizer, from the cache when an
    entry for its vocabulary and this sample exists, else counted and stored."""
    vocab = sorted(tokenizer.hf.get_vocab().items(), key=itemgetter(1))  # in id order
    digest = hashlib.sha256("\n".join(f"{i} {t!r}" for t, i in vocab).encode()).hexdigest()
    facts = [CACHE_FORMAT, digest, sys.version, str(stdlib_root()), CORPUS_CHARS]
    key = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]
    path = cache_dir() / "draft_vocab" / f"{key}.json"
    ranking = read_cache_json(path).get("ranking")
    if isinstance(ranking, list) and all(isinstance(i, int) for i in ranking):
        return ranking
    ranking = rank_tokens(count_tokens(tokenizer, sample_texts(CORPUS_CHARS)))
    write_cache_json(path, {"facts": facts, "ranking": ranking})
    return ranking
