"""The native decoder stack (models/kernels/native_layer.py, kernels/native/layer.c) against
llama.py's torch operators, the reference: logits, KV entries and EAGLE features within float32
rounding for every family and every shape the engine runs (prefill, decode, verify, ragged
batches, tree masks, sliding windows), head sizes that take each of the C code's paths, and rows
that are bitwise lone decode steps even outside the batch-invariant mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from tests.helpers.harness import Runner, assert_runs_match, random_ids, run_shapes
from verispec.models.kernels import native_layer
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.kernels.native_layer import can_fold_head, can_step_greedily, greedy_steps
from verispec.models.llama import LlamaModel
from verispec.models.weights.loader import load_model
from verispec.sample.sampler import argmax_rows

pytestmark = pytest.mark.skipif(
    not isinstance(native_kernel(), NativeKernel), reason="the native kernel cannot run here"
)
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3")  # mistral: sliding window 24
ATOL = 1e-5  # logits O(1)-O(10); the two paths differ ~1e-6 (exp, sums in other orders)


def load(path: Path, native: bool = True) -> LlamaModel:
    model = load_model(path, torch.float32, torch.device("cpu"), "native")
    assert model.native is not None, "every product runs the native kernel, so the stack runs"
    if not native:
        model.native = None  # the torch operators, on the same packed weights
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def family_path(request: pytest.FixtureRequest, tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp(f"{request.param}-native-layer")
    make_checkpoint(path, request.param, tokenizer, layer_scale=8.0)
    return path


def assert_same_run(path: Path) -> None:
    """Every kind of forward gives the same logits and KV entries on both paths."""
    assert_runs_match(Runner(load(path)), Runner(load(path, native=False)), ATOL)


def test_native_stack_matches_the_torch_operators(family_path: Path) -> None:
    assert_same_run(family_path)


@pytest.mark.parametrize(
    ("hidden", "heads", "kv_heads"),
    [(128, 2, 1), (192, 2, 2), (48, 4, 2)],
    ids=["head_dim 64 (register path)", "head_dim 96 (registers + tail)", "head_dim 12"],
)
def test_head_sizes_take_every_code_path(tmp_path: Path, tokenizer, hidden, heads, kv_heads):
    """64 columns of values in registers, the columns past them, and a head size that is no
    multiple of 8 (scalar dot products)."""
    make_checkpoint(tmp_path, "llama", tokenizer, layer_scale=4.0, hidden_size=hidden,
                    num_attention_heads=heads, num_key_value_heads=kv_heads)  # fmt: skip
    assert_same_run(tmp_path)


def test_features_match_the_torch_operators(family_path: Path) -> None:
    """The residual streams EAGLE reads (first, middle and after the last layer)."""
    fast, ref = Runner(load(family_path)), Runner(load(family_path, native=False))
    ids = random_ids(12, 320, seed=3)
    got = fast.forward_with_features([fast.sequence().chunk(ids, 12)], [0, 1, 2])
    want = ref.forward_with_features([ref.sequence().chunk(ids, 12)], [0, 1, 2])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_rows_are_bitwise_lone_decode_steps(family_path: Path) -> None:
    """Without the batch-invariant mode: a verify step's rows, a prefill's rows and the rows of
    a ragged batch with a tree mask equal the lone decode steps of the same tokens."""
    assert_rows_are_lone_decode_steps(family_path)


@pytest.mark.parametrize(
    ("hidden", "heads", "kv_heads"),
    [(192, 6, 2), (256, 8, 2), (128, 2, 1)],
    ids=["groups of 3", "groups of 4 (3 + 1)", "groups of 2, head_dim 64"],
)
def test_grouped_heads_share_key_loads_and_keep_every_bit(
    tmp_path: Path, tokenizer, hidden: int, heads: int, kv_heads: int
) -> None:
    """Attention jobs of a whole kv group (chunks of rows) and a decode step's (three passes of
    small jobs, or a job per head on one thread) give the same bits, so a verify or prefill row
    is still its lone decode step."""
    make_checkpoint(tmp_path, "llama", tokenizer, layer_scale=4.0, hidden_size=hidden,
                    num_attention_heads=heads, num_key_value_heads=kv_heads)  # fmt: skip
    assert_same_run(tmp_path)
    assert_rows_are_lone_decode_steps(tmp_path)


def test_rows_over_many_key_tiles_keep_every_bit(tmp_path: Path, tokenizer) -> None:
    """Attention goes over the keys in tiles of 64 shared by a chunk of up to 16 rows: a
    150-token prefill (10 chunks, 3 tiles) and a verify step after 140 tokens (its 9 rows in
    two chunks) equal the lone decode steps bit for bit."""
    make_checkpoint(tmp_path, "llama", tokenizer, layer_scale=4.0, hidden_size=192,
                    num_attention_heads=6, num_key_value_heads=2)  # fmt: skip
    runner = Runner(load(tmp_path), num_blocks=160)
    ids = random_ids(150, 320, seed=1)
    alone = runner.sequence()
    ref = torch.cat([runner.forward([alone.chunk([t])]) for t in ids])  # [150, vocab]
    assert torch.equal(runner.forward([runner.sequence().chunk(ids, 150)]), ref)
    seq = runner.sequence()
    runner.forward([seq.chunk(ids[:140])])
    assert torch.equal(runner.forward([seq.chunk(ids[140:149], 9)]), ref[140:149])


def test_the_head_in_the_stack_call_gives_the_same_logits(
    family_path: Path, monkeypatch
) -> None:
    """The LM head run inside the stack's native call (NativeStack.logits) gives the logits
    of the head called apart on the final-normed rows, bit for bit, for every shape."""
    model = load(family_path)
    assert can_fold_head(model)
    folded = run_shapes(Runner(model), model.config.vocab_size)
    monkeypatch.setattr(native_layer, "can_fold_head", lambda model: False)
    apart = run_shapes(Runner(model), model.config.vocab_size)
    assert all(torch.equal(a, b) for a, b in zip(folded, apart, strict=True))


REDUCED_IDS = torch.tensor([0, 1, 2, *range(5, 320, 3)])
"""A head over 108 of the 320 ids (LlamaModel.vocab_ids), ascending."""


@pytest.mark.parametrize("reduced", [False, True], ids=["whole-head", "reduced-head"])
def test_greedy_steps_are_a_loop_of_forwards_and_argmaxes(
    tmp_path: Path, tokenizer, reduced: bool
) -> None:
    """greedy_steps (one native call) drafts what forwards of one token per sequence and
    argmax_rows over the first `limit` logits draft, for two sequences of different lengths,
    and leaves the same keys and values in the cache; with a reduced head, each argmax row is
    the token vocab_ids[row], fed and returned as such."""
    make_checkpoint(tmp_path, "llama", tokenizer, layer_scale=4.0, hidden_size=192,
                    num_attention_heads=6, num_key_value_heads=2)  # fmt: skip
    model, steps, limit = load(tmp_path), 6, 250
    ids = torch.arange(limit)
    if reduced:
        ids = REDUCED_IDS
        model = load_model(tmp_path, torch.float32, torch.device("cpu"), "native", vocab_ids=ids)
        limit = len(ids)
    assert can_step_greedily(model)
    prompts = [random_ids(9, 320, seed=2), random_ids(21, 320, seed=3)]
    loop, call = Runner(model), Runner(model)
    seqs = {}
    for runner in (loop, call):  # the same prefill in both caches
        seqs[runner] = [runner.sequence() for _ in prompts]
        runner.forward([q.chunk(p) for q, p in zip(seqs[runner], prompts, strict=True)])
    tokens, want = [p[-1] for p in prompts], []  # fed again at the next position, as a draft
    for _ in range(steps):
        logits = loop.forward([q.chunk([t]) for q, t in zip(seqs[loop], tokens, strict=True)])
        tokens = ids[argmax_rows(logits[:, :limit])].tolist()
        want.append(tokens)
    if reduced:  # ids past the head's row count: the map is really taken
        assert any(t >= limit for step in want for t in step)
    tables = [q.table for q in seqs[call]]
    positions = [t.num_tokens for t in tables]
    reserved = [t.append_slots(steps) for t in tables]
    got = greedy_steps(model, call.kv, [p[-1] for p in prompts], positions,
                       [[r[j] for r in reserved] for j in range(steps)],
                       [t.blocks for t in tables], call.block_size, limit)  # fmt: skip
    assert got == want
    for q_loop, q_call in zip(seqs[loop], seqs[call], strict=True):
        n = q_loop.table.num_tokens
        assert q_call.table.num_tokens == n
        have = call.kv.read(torch.tensor(q_call.table.slots(0, n)))
        expected = loop.kv.read(torch.tensor(q_loop.table.slots(0, n)))
        assert all(torch.equal(a, b) for a, b in zip(have, expected, strict=True))


def assert_rows_are_lone_decode_steps(path: Path) -> None:
    runner = Runner(load(path), num_blocks=128)
    ids = random_ids(33, 320, seed=0)
    alone = runner.sequence()
    ref = torch.cat([runner.forward([alone.chunk([t])]) for t in ids])  # [33, vocab]
    for q in (2, 5, 9):
        seq = runner.sequence()
        runner.forward([seq.chunk(ids[:20])])
        assert torch.equal(runner.forward([seq.chunk(ids[20 : 20 + q], q)]), ref[20 : 20 + q])
    assert torch.equal(runner.forward([runner.sequence().chunk(ids, 33)]), ref)
    other, seq = runner.sequence(), runner.sequence()
    runner.forward([seq.chunk(ids[:24])])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # two branches
    got = runner.forward([other.chunk(ids[:7], 7), seq.chunk([ids[24], ids[25], 5], 3, tree,
                                                             [24, 25, 25])])  # fmt: skip
    assert torch.equal(got[:7], ref[:7])
    assert torch.equal(got[7:9], ref[24:26])  # the branch that follows the sequence


def test_models_the_stack_cannot_run_use_the_torch_operators(tmp_path: Path, tokenizer) -> None:
    """Columns the kernel pads (hidden 40 is no multiple of 16) or products on another kernel:
    the forward runs llama.py's operators."""
    make_checkpoint(tmp_path, "llama", tokenizer, hidden_size=40, num_attention_heads=4,
                    num_key_value_heads=2)  # fmt: skip
    assert load_model(tmp_path, torch.float32, torch.device("cpu"), "native").native is None
    assert load_model(tmp_path, torch.float32, torch.device("cpu"), "torch").native is None
