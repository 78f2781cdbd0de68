"""warp and apply_penalties on hand-made logits and histories."""

import math

import pytest
import torch

from verispec.sample import SamplingTensors, apply_penalties, warp
from verispec.sampling_params import SamplingParams

PROBS = [0.5, 0.3, 0.15, 0.05]


def tensors(
    params: list[SamplingParams],
    vocab: int,
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
) -> SamplingTensors:
    empty = [[] for _ in params]
    return SamplingTensors.build(params, prompts or empty, outputs or empty, vocab)


def warp_one(logits: list[float], params: SamplingParams) -> torch.Tensor:
    """Warp a single row; returns p [vocab]."""
    return warp(torch.tensor([logits]), tensors([params], len(logits)))[0]


def log_probs() -> list[float]:
    return [math.log(p) for p in PROBS]


@pytest.mark.parametrize(("k", "kept"), [(1, 1), (2, 2), (3, 3), (4, 4), (10, 4), (-1, 4)])
def test_top_k_keeps_exactly_k(k: int, kept: int) -> None:
    p = warp_one(log_probs(), SamplingParams(top_k=k))
    assert (p > 0).sum().item() == kept
    expected = torch.tensor(PROBS[:kept] + [0.0] * (4 - kept))
    torch.testing.assert_close(p, expected / expected.sum())


def test_top_k_ties_keep_lowest_token_ids() -> None:
    p = warp_one([1.0, 2.0, 2.0, 2.0], SamplingParams(top_k=2))
    torch.testing.assert_close(p, torch.tensor([0.0, 0.5, 0.5, 0.0]))


@pytest.mark.parametrize(("top_p", "kept"), [(0.3, 1), (0.5, 1), (0.79, 2), (0.8, 2), (0.81, 3),
                                             (0.95, 3), (0.96, 4), (1.0, 4)])  # fmt: skip
def test_top_p_keeps_smallest_set_reaching_top_p(top_p: float, kept: int) -> None:
    p = warp_one(log_probs(), SamplingParams(top_p=top_p))
    expected = torch.tensor(PROBS[:kept] + [0.0] * (4 - kept))
    torch.testing.assert_close(p, expected / expected.sum())


def test_top_p_applies_after_top_k_renormalisation() -> None:
    # top-k=3 leaves [0.5, 0.3, 0.15] / 0.95; 0.8 / 0.95 = 0.84 < 0.84 + 0.01 so 3 are needed
    p = warp_one(log_probs(), SamplingParams(top_k=3, top_p=0.85))
    assert (p > 0).tolist() == [True, True, True, False]


@pytest.mark.parametrize(("min_p", "kept"), [(0.0, 4), (0.1, 4), (0.11, 3), (0.3, 3), (0.61, 1)])
def test_min_p_keeps_tokens_above_fraction_of_max(min_p: float, kept: int) -> None:
    p = warp_one(log_probs(), SamplingParams(min_p=min_p))
    assert (p > 0).sum().item() == kept


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.tensor(log_probs())
    for temperature in (0.5, 2.0):
        p = warp_one(logits.tolist(), SamplingParams(temperature=temperature))
        torch.testing.assert_close(p, (logits / temperature).softmax(0))
    sharp = warp_one(log_probs(), SamplingParams(temperature=0.5))
    assert sharp[0] > PROBS[0] and sharp[3] < PROBS[3]


def test_greedy_rows_are_one_hot_at_first_argmax() -> None:
    p = warp_one([0.0, 3.0, 3.0, 1.0], SamplingParams(temperature=0.0, top_k=1))
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_mixed_batch_rows_equal_rows_computed_alone() -> None:
    torch.manual_seed(0)
    vocab = 50
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(top_p=0.6),
        SamplingParams(min_p=0.2, temperature=1.3),
        SamplingParams(top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.5),
        SamplingParams(presence_penalty=1.0, frequency_penalty=0.5),
        SamplingParams(),
    ]
    prompts = [[1, 2, 3]] * len(params)
    outputs = [[4, 4, 5], [], [7], [1], [2, 2, 9], [3, 3, 3], [8]]
    logits = torch.randn(len(params), vocab) * 3  # [n, vocab]
    batch = warp(logits, tensors(params, vocab, prompts, outputs))
    for i, sp in enumerate(params):
        alone = warp(
            logits[i : i + 1], tensors([sp], vocab, prompts[i : i + 1], outputs[i : i + 1])
        )
        torch.testing.assert_close(batch[i], alone[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(batch.sum(1), torch.ones(len(params)))
    assert batch.dtype == torch.float32


def test_disabled_warping_is_plain_softmax() -> None:
    logits = torch.randn(3, 20)
    p = warp(logits, tensors([SamplingParams()] * 3, 20))
    assert torch.equal(p, logits.softmax(1))


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = torch.tensor([[2.0, -1.0, 2.0, -1.0, 0.5]])
    t = tensors([SamplingParams(repetition_penalty=2.0)], 5, prompts=[[0]], outputs=[[1, 1]])
    out = apply_penalties(logits, t)
    assert out.tolist() == [[1.0, -2.0, 2.0, -1.0, 0.5]]


def test_frequency_counts_occurrences_and_presence_counts_once() -> None:
    logits = torch.zeros(2, 4)
    params = [SamplingParams(frequency_penalty=0.5), SamplingParams(presence_penalty=0.5)]
    outputs = [[2, 2, 2, 1], [2, 2, 2, 1]]
    out = apply_penalties(logits, tensors(params, 4, outputs=outputs))
    assert out.tolist() == [[0.0, -0.5, -1.5, 0.0], [0.0, -0.5, -0.5, 0.0]]


def test_prompt_tokens_count_for_repetition_only() -> None:
    logits = torch.ones(3, 4)
    params = [
        SamplingParams(repetition_penalty=2.0),
        SamplingParams(presence_penalty=1.0),
        SamplingParams(frequency_penalty=1.0),
    ]
    out = apply_penalties(logits, tensors(params, 4, prompts=[[0, 3, 3]] * 3, outputs=[[]] * 3))
    assert out.tolist() == [[0.5, 1.0, 1.0, 0.5], [1.0] * 4, [1.0] * 4]


def test_rows_without_penalties_are_untouched_in_penalised_batch() -> None:
    logits = torch.randn(2, 6)
    params = [SamplingParams(), SamplingParams(repetition_penalty=1.3, frequency_penalty=1.0)]
    out = apply_penalties(logits, tensors(params, 6, prompts=[[0, 1]] * 2, outputs=[[2, 2]] * 2))
    assert torch.equal(out[0], logits[0])
    assert not torch.equal(out[1], logits[1])


def test_greedy_uses_penalised_logits() -> None:
    params = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    t = tensors([params], 3, outputs=[[0]])
    assert warp(torch.tensor([[1.0, 0.5, 0.0]]), t).tolist() == [[0.0, 1.0, 0.0]]


def test_build_flags_and_disabled_values() -> None:
    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.5), SamplingParams(top_k=100)]
    t = tensors(params, 10)
    assert t.any_greedy and not t.all_greedy
    assert not (t.need_top_k or t.need_top_p or t.need_min_p or t.need_penalties)
    assert t.top_k.tolist() == [10, 10] and t.temperature.tolist() == [1.0, 1.0]
    assert t.prompt_mask is None and t.output_counts is None


def test_build_rejects_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="one entry per row"):
        SamplingTensors.build([SamplingParams()], [[]], [], 4)
