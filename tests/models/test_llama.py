"""LlamaModel against transformers, and the KV-cache paths speculation relies on:
chunked prefill, rollback (truncation), and tree (extra) masks."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.helpers.harness import BACKENDS, Runner, hf_logits, native_model, random_ids
from verispec import LLM, SamplingParams

PROMPT_LEN = 40  # longer than mistral's window (24) and llama3's original context (32)
DECODE_STEPS = 4
MAX_NEW_TOKENS = 24


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_and_decode_match_transformers(sharp_checkpoint, backend) -> None:
    path, hf_model = sharp_checkpoint
    ids = random_ids(PROMPT_LEN + DECODE_STEPS, hf_model.config.vocab_size, seed=1)
    expected = hf_logits(hf_model, ids)  # [T, vocab]
    runner = Runner(native_model(path, backend))
    seq = runner.sequence()
    prefill = runner.forward([seq.chunk(ids[:PROMPT_LEN], num_logits=PROMPT_LEN)])
    assert_close(prefill, expected[:PROMPT_LEN], atol=1e-4, rtol=0)
    for p in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        decode = runner.forward([seq.chunk([ids[p]])])
        assert_close(decode[0], expected[p], atol=1e-4, rtol=0)


@pytest.fixture(scope="module", params=BACKENDS)
def llm(request: pytest.FixtureRequest, sharp_checkpoint) -> LLM:
    """One engine per family checkpoint and linear backend."""
    return LLM(model=str(sharp_checkpoint[0]), linear_backend=request.param)


@pytest.fixture(scope="module")
def hf_greedy(sharp_checkpoint) -> list[tuple[list[int], list[int]]]:
    """(prompt, transformers' greedy continuation of MAX_NEW_TOKENS, EOS not stopping it)."""
    hf_model = sharp_checkpoint[1]
    cases = []
    for n in (5, 17, 33):
        prompt = random_ids(n, hf_model.config.vocab_size, seed=10 + n)
        input_ids = torch.tensor([prompt])
        out = hf_model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=None,  # generate the full length, as ignore_eos does
        )
        cases.append((prompt, out[0, n:].tolist()))
    return cases


def test_greedy_generation_matches_transformers(llm, hf_greedy) -> None:
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([prompt for prompt, _ in hf_greedy], params)  # one ragged batch
    for (_, expected), output in zip(hf_greedy, outputs, strict=True):
        assert len(expected) == MAX_NEW_TOKENS
        assert output.token_ids == expected


def test_chunked_prefill_matches_one_prefill(sharp_checkpoint) -> None:
    path, hf_model = sharp_checkpoint
    model = native_model(path)
    ids = random_ids(PROMPT_LEN, hf_model.config.vocab_size, seed=2)
    whole = Runner(model).prefill(ids)
    runner = Runner(model)
    seq = runner.sequence()
    for a, b in ((0, 13), (13, 30)):
        assert runner.forward([seq.chunk(ids[a:b], num_logits=0)]).shape == (0, whole.shape[1])
    last = runner.forward([seq.chunk(ids[30:], num_logits=1)])
    assert_close(last, whole, atol=1e-5, rtol=0)


def test_truncated_kv_matches_a_run_without_the_removed_tokens(sharp_checkpoint) -> None:
    path, hf_model = sharp_checkpoint
    model = native_model(path)
    vocab = hf_model.config.vocab_size
    prompt, decoded = random_ids(20, vocab, seed=3), random_ids(5, vocab, seed=4)
    redo = [t % (vocab - 3) + 3 for t in decoded[2:]]  # different from the removed tokens
    assert all(a != b for a, b in zip(redo, decoded[2:], strict=True))
    # 7 blocks of 4 hold exactly 25 tokens, so the block freed by truncation is reused.
    runner = Runner(model, num_blocks=7, block_size=4)
    seq = runner.sequence()
    runner.forward([seq.chunk(prompt)])
    for t in decoded:
        runner.forward([seq.chunk([t])])
    seq.table.truncate(22)  # mid-block 5; frees block 6 (position 24)
    assert len(seq.table.blocks) == 6
    got = torch.cat([runner.forward([seq.chunk([t])]) for t in redo])  # [3, vocab]
    expected = Runner(model).prefill(prompt + decoded[:2] + redo, num_logits=3)
    assert_close(got, expected, atol=1e-5, rtol=0)


def test_tree_mask_matches_the_branch_alone(sharp_checkpoint) -> None:
    """Tree a -> {b, c}, c -> d verified in one forward: each node's logits equal a plain
    causal run of its own branch (siblings b and c share rotary position prefix + 1)."""
    path, hf_model = sharp_checkpoint
    model = native_model(path)
    vocab = hf_model.config.vocab_size
    prefix = random_ids(30, vocab, seed=5)  # past mistral's window of 24
    a, b, c, d = random_ids(4, vocab, seed=6)
    p = len(prefix)
    mask = torch.tensor(
        [
            [1, 0, 0, 0],  # a
            [1, 1, 0, 0],  # b: child of a
            [1, 0, 1, 0],  # c: child of a, does not see its sibling b
            [1, 0, 1, 1],  # d: child of c
        ],
        dtype=torch.bool,
    )
    runner = Runner(model)
    seq = runner.sequence()
    runner.forward([seq.chunk(prefix)])
    tree = runner.forward([seq.chunk([a, b, c, d], 4, mask, [p, p + 1, p + 1, p + 2])])
    branch_b = Runner(model).prefill([*prefix, a, b], num_logits=2)  # a, b
    branch_cd = Runner(model).prefill([*prefix, a, c, d], num_logits=2)  # c, d
    assert_close(tree[:2], branch_b, atol=1e-5, rtol=0)
    assert_close(tree[2:], branch_cd, atol=1e-5, rtol=0)
