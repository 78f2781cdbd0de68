"""ForwardBatch: a ragged batch gives each sequence the logits it would get alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from tests.helpers.harness import Runner
from verispec.models import attention
from verispec.models.attention import LONG_QUERY, AttentionLayout
from verispec.models.batch import ForwardBatch, SeqChunk
from verispec.models.llama import LlamaModel
from verispec.models.weights.loader import load_model

BLOCK_SIZE = 4


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(params=["torch", "onednn"])
def model(request: pytest.FixtureRequest, family_checkpoint: tuple[Path, object]) -> LlamaModel:
    return load_model(family_checkpoint[0], torch.float32, torch.device("cpu"), request.param)


def test_ragged_batch_matches_each_sequence_alone(model) -> None:
    """A 30-token prefill (past mistral's window), a 9-token prefill and a 1-token decode
    after 15 cached tokens, in one forward."""
    long, short, context, step = ids(30, 1), ids(9, 2), ids(15, 3), ids(1, 4)
    alone = []
    for prompt, num_logits in ((long, 3), (short, 9)):
        runner = Runner(model, 64, BLOCK_SIZE)
        alone.append(runner.forward([runner.sequence().chunk(prompt, num_logits)]))
    runner = Runner(model, 64, BLOCK_SIZE)
    seq = runner.sequence()
    runner.forward([seq.chunk(context)])
    alone.append(runner.forward([seq.chunk(step)]))

    runner = Runner(model, 64, BLOCK_SIZE)
    a, b, c = runner.sequence(), runner.sequence(), runner.sequence()
    runner.forward([c.chunk(context)])
    batched = runner.forward([a.chunk(long, 3), b.chunk(short, 9), c.chunk(step)])
    assert batched.shape == (3 + 9 + 1, alone[0].shape[1])
    assert_close(batched, torch.cat(alone), atol=1e-5, rtol=0)


def test_long_chunk_attends_apart_with_the_same_logits(model) -> None:
    """A prefill chunk longer than LONG_QUERY beside a draft tree and a decode step: the chunk
    attends in a group of its own (no padding of the short ones to its length), and every
    sequence gets the logits it gets alone."""
    long, context, tree, step = ids(LONG_QUERY + 8, 1), ids(26, 2), ids(3, 3), ids(1, 4)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    p = len(context)

    def tree_chunk(seq):
        return seq.chunk(tree, 3, extra_mask=mask, positions=[p, p + 1, p + 1])

    alone = [_alone(model, long, 2), _alone(model, tree, 3, context, mask),
             _alone(model, step, 1, context)]  # fmt: skip

    runner = Runner(model, 96, BLOCK_SIZE)
    a, b, c = runner.sequence(), runner.sequence(), runner.sequence()
    runner.forward([b.chunk(context)])
    runner.forward([c.chunk(context)])
    chunks = [tree_chunk(b), a.chunk(long, 2), c.chunk(step)]
    batch = ForwardBatch.build(chunks, BLOCK_SIZE)
    layout = AttentionLayout.build(batch, runner.model.windows)
    assert [rows.tolist() for rows, _ in layout.groups] == [
        [0, 1, 2, 3 + LONG_QUERY + 8], list(range(3, 3 + LONG_QUERY + 8))
    ]
    batched = runner.model.forward(batch, runner.kv)
    assert_close(batched, torch.cat([alone[1], alone[0], alone[2]]), atol=1e-5, rtol=0)


def _alone(model, tokens, num_logits, context=(), mask=None) -> torch.Tensor:
    """Logits of one chunk in a forward of its own (after `context`, as a tree when masked)."""
    runner = Runner(model, 96, BLOCK_SIZE)
    seq = runner.sequence()
    if context:
        runner.forward([seq.chunk(list(context))])
    if mask is None:
        return runner.forward([seq.chunk(tokens, num_logits)])
    p = len(context)
    return runner.forward([seq.chunk(tokens, num_logits, extra_mask=mask,
                                     positions=[p, p + 1, p + 1])])  # fmt: skip


def test_select_takes_sequences_and_their_rows() -> None:
    """Worked example of ForwardBatch.select: query lens [2, 5, 1], sequences [0, 2]."""
    middle = SeqChunk(list(range(5)), 3, list(range(8, 13)), [2, 3, 4, 5])
    batch = ForwardBatch.build([chunk(2), middle, SeqChunk([9], 4, [16], [4, 5])], BLOCK_SIZE)
    sub, rows = batch.select([0, 2])
    assert rows.tolist() == [0, 1, 7]
    assert sub.input_ids.tolist() == [3, 4, 9]
    assert sub.cu_query_lens.tolist() == [0, 2, 3]
    assert sub.context_lens.tolist() == [2, 5]
    assert sub.block_tables.tolist() == [[0, 1, 0, 0], [4, 5, 0, 0]]
    assert (sub.query_lens, sub.context_lens_host) == ([2, 1], [2, 5])


def test_attention_doctests() -> None:
    import doctest

    assert doctest.testmod(attention).failed == 0


def test_tree_sequence_beside_a_causal_one(model) -> None:
    """One sequence's extra mask must not leak into another's: the causal one keeps causality."""
    prefix, tree, other = ids(26, 5), ids(3, 6), ids(6, 7)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # 1 and 2 siblings
    p = len(prefix)

    def run(with_other: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        runner = Runner(model, 64, BLOCK_SIZE)
        seq, rest = runner.sequence(), runner.sequence()
        runner.forward([seq.chunk(prefix)])
        chunks = [seq.chunk(tree, 3, extra_mask=mask, positions=[p, p + 1, p + 1])]
        if with_other:
            chunks.append(rest.chunk(other, 6))
        out = runner.forward(chunks)
        return out[:3], (out[3:] if with_other else None)

    tree_alone, _ = run(with_other=False)
    tree_batched, other_batched = run(with_other=True)
    runner = Runner(model, 64, BLOCK_SIZE)
    other_alone = runner.forward([runner.sequence().chunk(other, 6)])
    assert_close(tree_batched, tree_alone, atol=1e-5, rtol=0)
    assert_close(other_batched, other_alone, atol=1e-5, rtol=0)


def test_tree_mask_reaching_into_cached_keys(model) -> None:
    """A tree grown over two forwards (as a drafter does): the second level's mask covers the
    first level, now cached, so node 3 sees its parent 1 but not 1's sibling 2."""
    prefix = ids(10, 8)
    p = len(prefix)
    root, level1, level2 = ids(1, 9), ids(2, 10), ids(1, 11)
    runner = Runner(model, 64, BLOCK_SIZE)
    seq = runner.sequence()
    runner.forward([seq.chunk(prefix + root)])
    runner.forward([seq.chunk(level1, 2, extra_mask=torch.eye(2, dtype=torch.bool),
                              positions=[p + 1, p + 1])])  # fmt: skip
    got = runner.forward([seq.chunk(level2, 1, extra_mask=torch.tensor([[True, False, True]]),
                                    positions=[p + 2])])  # fmt: skip
    alone = Runner(model, 64, BLOCK_SIZE).prefill(prefix + root + level1[:1] + level2)
    assert_close(got, alone, atol=1e-5, rtol=0)


def chunk(n: int, **options) -> SeqChunk:
    return SeqChunk(list(range(3, 3 + n)), 0, list(range(n)), [0, 1], **options)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([], "at least one sequence"),
        ([SeqChunk([], 0, [], [0])], "at least one new token"),
        ([SeqChunk([3, 4], 0, [0], [0])], "one KV slot"),
        ([SeqChunk([3, 4], 0, [0, 1, 2], [0]), SeqChunk([5, 6], 0, [4], [1])], "one KV slot"),
        ([chunk(3, extra_mask=torch.ones(2, 2, dtype=torch.bool))], r"extra_mask must be \[3, w\]"),
        ([chunk(3, extra_mask=torch.ones(3, 4, dtype=torch.bool))], r"3 <= w <= 3"),
        ([chunk(3, num_logits=4)], "num_logits"),
        ([chunk(3, num_logits=-1)], "num_logits"),
        ([chunk(3, positions=[0, 1])], "positions"),
    ],
)
def test_build_rejects_malformed_chunks(chunks: list[SeqChunk], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ForwardBatch.build(chunks, BLOCK_SIZE)


def test_build_flattens_offsets_and_logit_rows() -> None:
    """Worked example: 3 prefill tokens wanting 2 logits, then a 1-token decode at position 7."""
    batch = ForwardBatch.build(
        [
            SeqChunk([10, 11, 12], 0, [0, 1, 2], [0], num_logits=2),
            SeqChunk([13], 7, [11], [1, 2]),
        ],
        BLOCK_SIZE,
    )
    assert batch.input_ids.tolist() == [10, 11, 12, 13]
    assert batch.positions.tolist() == [0, 1, 2, 7]
    assert batch.slot_mapping.tolist() == [0, 1, 2, 11]
    assert batch.cu_query_lens.tolist() == [0, 3, 4]
    assert batch.context_lens.tolist() == [3, 8]
    assert batch.block_tables.tolist() == [[0, 0], [1, 2]]
    assert batch.logits_indices.tolist() == [1, 2, 3]
    assert batch.extra_mask is None
    assert (batch.num_seqs, batch.num_tokens) == (2, 4)
    assert batch.kv_start is None  # two sequences: keys are gathered


@pytest.mark.parametrize(
    ("table", "context", "start"),
    [([4, 5, 6], 12, 16), ([4, 5, 7], 12, None), ([4, 5, 9], 8, 16), ([3], 1, 12)],
)
def test_kv_start_of_a_lone_sequence(table: list[int], context: int, start: int | None) -> None:
    """Only the blocks holding the context count (a table may hold a spare one)."""
    chunk = SeqChunk([7], context - 1, [context - 1 + table[0] * BLOCK_SIZE], table)
    assert ForwardBatch.build([chunk], BLOCK_SIZE).kv_start == start


def test_keys_read_in_place_equal_gathered_keys(model) -> None:
    """One sequence in consecutive blocks (read in place) and the same sequence in blocks
    scattered by a neighbour (gathered) give the same logits, bit for bit."""
    prompt, steps = ids(13, 5), ids(4, 6)
    results = []
    for scatter in (False, True):
        runner = Runner(model, 64, BLOCK_SIZE)
        seq, other = runner.sequence(), runner.sequence()
        logits = [runner.forward([seq.chunk(prompt[:5])])]
        if scatter:
            runner.forward([other.chunk(ids(3, 7))])  # takes the next block
        logits.append(runner.forward([seq.chunk(prompt[5:], num_logits=8)]))
        for t in steps:
            batch = ForwardBatch.build([seq.chunk([t])], BLOCK_SIZE)
            assert (batch.kv_start is None) == scatter
            logits.append(runner.model.forward(batch, runner.kv))
        results.append(torch.cat(logits))
    assert torch.equal(results[0], results[1])
