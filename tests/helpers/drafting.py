"""Shared by the drafters' tests: prompts, the greedy-exactness assertions (speculative output
token for token the plain output, partial acceptance), stops that plain decoding hits, and the
check that target and draft KV caches hold what a fresh prefill computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.checkpoints import CORPUS
from verispec import LLM, SamplingParams
from verispec.drafters import draft_vocab
from verispec.engine.engine import Engine
from verispec.engine.request import Request, Status
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk
from verispec.types.outputs import RequestOutput

VOCAB = 320


def random_prompts(n: int, seed: int, lo: int = 2, hi: int = 24) -> list[list[int]]:
    """n prompts of random lengths in [lo, hi) from a seeded generator, ids outside 0-2."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, VOCAB, (m,), generator=g).tolist() for m in lengths]


def small_vocab_sample(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """Reduced draft vocabularies ranked on a small sample of the standard library (fast; the
    code is the real one) and cached in `cache`, not the user's verispec cache."""
    monkeypatch.setenv("VERISPEC_CACHE", str(cache))
    monkeypatch.setattr(draft_vocab, "CORPUS_CHARS", 200_000)


def repeating_prompts(seed: int) -> list[list[int]]:
    """Prompts that repeat a short pattern (after a random lead-in), so n-grams match."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for period, repeats in ((1, 5), (2, 4), (3, 3), (4, 3), (5, 2)):
        lead = torch.randint(3, VOCAB, (period,), generator=g).tolist()
        pattern = torch.randint(3, VOCAB, (period,), generator=g).tolist()
        out.append([0, *lead, *(pattern * repeats)])
    return out


PROMPTS: list[str | list[int]] = [*random_prompts(5, seed=0), *repeating_prompts(1), *CORPUS]


def assert_same(spec: list[RequestOutput], ref: list[RequestOutput]) -> None:
    assert len(spec) == len(ref)
    for i, (s, r) in enumerate(zip(spec, ref, strict=True)):
        assert s.token_ids == r.token_ids, f"prompt {i}: speculative output differs from plain"
        assert (s.finish_reason, s.text) == (r.finish_reason, r.text), f"prompt {i}"


def assert_partial(llm: LLM) -> None:
    """Some drafts were accepted and some rejected."""
    rate = llm.engine.spec_stats.acceptance_rate
    assert rate is not None and 0 < rate < 1, f"acceptance rate {rate}"


def stop_params(ref: list[RequestOutput], decode: Any) -> list[SamplingParams]:
    """Per prompt, a stop that plain decoding hits mid-output: a token id for even prompts, a
    stop string (the text of a middle token) for odd ones."""
    params = []
    for i, r in enumerate(ref):
        at = len(r.token_ids) // 2 + i % 5
        token = r.token_ids[at]
        common: dict[str, Any] = dict(temperature=0, max_tokens=32)
        if i % 2 == 0 or not decode([token]).strip():
            params.append(SamplingParams(stop_token_ids=[token], **common))
        else:
            params.append(SamplingParams(stop=[decode([token]).strip()], **common))
    return params


def fresh_kv(model: LlamaModel, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [layers, len(tokens), kv_heads, head_dim] of a fresh one-chunk prefill."""
    block_size = 4
    num_blocks = -(-len(tokens) // block_size)
    paged = PagedModel(model, num_blocks, block_size)
    chunk = append_chunk(paged.new_table(), tokens)
    paged.forward([chunk])
    index = torch.tensor(chunk.slots)
    return paged.kv.read(index)


def assert_cache_holds(
    model: LlamaModel, kv: Any, slots: list[int], tokens: list[int], what: str
) -> None:
    """The cache's entries at slots equal a fresh prefill of tokens."""
    index = torch.tensor(slots, dtype=torch.int64)
    want_k, want_v = fresh_kv(model, tokens)
    have_k, have_v = kv.read(index)
    torch.testing.assert_close(have_k, want_k, atol=1e-5, rtol=1e-5, msg=what)
    torch.testing.assert_close(have_v, want_v, atol=1e-5, rtol=1e-5, msg=what)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def check_caches(engine: Engine, requests: list[Request]) -> int:
    """For every live request: the target cache holds its first num_computed_tokens tokens;
    the draft cache's entries that still match its tokens hold exactly those tokens. Returns
    how many draft positions were found stale (rolled back drafts awaiting truncation)."""
    stale = 0
    proposer = engine.proposer
    for r in requests:
        if r.status is not Status.RUNNING:
            assert r.request_id not in proposer.states or r.status is Status.WAITING
            continue
        n = r.num_computed_tokens
        assert r.block_table.num_tokens == n
        if n:
            slots = r.block_table.slots(0, n)
            target_kv = engine.runner.target.kv
            assert_cache_holds(engine.model, target_kv, slots, r.all_token_ids[:n], "target")
        state = proposer.states.get(r.request_id)
        if state is None:
            continue
        held = state.base + state.drafts  # what the draft cache claims to hold, in order
        assert state.table.num_tokens == len(held)
        assert r.all_token_ids[: len(state.base)] == state.base  # accepted tokens never change
        valid = common_prefix(held, r.all_token_ids)
        stale += len(held) - valid
        slots = state.table.slots(0, valid)
        assert_cache_holds(proposer.model, proposer.paged.kv, slots, held[:valid], "draft")
    return stale
