"""warp and apply_penalties on hand-made logits and histories."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.sample import SamplingTensors, apply_penalties, warp
from verispec.types.sampling_params import SamplingParams

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


@pytest.mark.parametrize(("top_p", "kept"), [(1.0, 3), (0.35, 2)])
def test_top_k_tie_group_wider_than_k_keeps_the_lowest_ids(top_p: float, kept: int) -> None:
    # torch.topk returns tied tokens in no set order: the kept ids must still be the lowest;
    # top_p = 0.35 then drops id 2, whose mass above (2/3 of the top-3 mass) is past it
    p = warp_one([0.0] * 10, SamplingParams(top_k=3, top_p=top_p))
    assert (p > 0).tolist() == [True] * kept + [False] * (10 - kept)


def test_top_p_ties_at_the_boundary_keep_the_lowest_ids() -> None:
    # ten equal tokens: the mass above id i is i / 10, so top_p = 0.25 keeps ids 0, 1 and 2
    p = warp_one([0.0] * 10, SamplingParams(top_p=0.25))
    assert (p > 0).tolist() == [True] * 3 + [False] * 7


def test_top_k_past_the_finite_tokens_keeps_them_all() -> None:
    inf = float("-inf")
    p = warp_one([1.0, inf, 2.0, inf], SamplingParams(top_k=3))
    torch.testing.assert_close(p, torch.tensor([1.0, 0.0, math.e, 0.0]) / (1 + math.e))


@pytest.mark.parametrize("vocab", [10, 3000])
@pytest.mark.parametrize("top_k", [-1, 3])
def test_nan_and_inf_logits_warp_as_the_reference_does(vocab: int, top_k: int) -> None:
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    logits[0, 5], logits[1, 2], logits[2, 7] = math.nan, math.inf, -math.inf
    t = tensors([SamplingParams(top_k=top_k, top_p=0.9)] * 3, vocab)
    expected = reference_warp(logits, t)
    assert expected[:2].isnan().all() and not expected[2].isnan().any()
    torch.testing.assert_close(warp(logits, t), expected, rtol=0, atol=0, equal_nan=True)


def reference_truncate(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Top-k/top-p as warp did before issue 13: one stable descending sort of every row."""
    vocab = logits.shape[1]
    sorted_logits, order = torch.sort(logits, dim=1, descending=True, stable=True)
    remove = torch.arange(vocab).unsqueeze(0) >= t.top_k.unsqueeze(1)
    if t.need_top_p:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=1)
        mass_above = probs.cumsum(dim=1) - probs
        over = mass_above >= (t.top_p - 1e-6).unsqueeze(1)
        over[:, 0] = False
        remove |= over & (t.top_p < 1.0).unsqueeze(1)
    remove = remove.scatter(1, order, remove)
    return logits.masked_fill(remove, float("-inf"))


def reference_warp(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """warp as it was before issue 13 (penalties are shared, they did not change)."""
    x = apply_penalties(logits.float(), t)
    greedy_p = None
    if t.any_greedy:
        greedy_p = torch.zeros_like(x).scatter_(1, x.argmax(dim=1, keepdim=True), 1.0)
        if t.all_greedy:
            return greedy_p
    x = x / t.temperature.unsqueeze(1)
    if t.need_top_k or t.need_top_p:
        x = reference_truncate(x, t)
    if t.need_min_p:
        probs = x.softmax(dim=1)
        floor = (t.min_p - 1e-6).unsqueeze(1) * probs.amax(dim=1, keepdim=True)
        x = x.masked_fill(probs < floor, float("-inf"))
    p = x.softmax(dim=1)
    if greedy_p is not None:
        p = torch.where(t.greedy.unsqueeze(1), greedy_p, p)
    return p


def knife_edge_top_p(x: torch.Tensor, at: float) -> float:
    """A top_p whose threshold (top_p - 1e-6 in float32) equals the reference's own mass above
    one token of the row x [vocab] (penalised, tempered; the token at fraction `at` of those
    with mass above < 0.999). The decision there flips with the last bit of the normaliser,
    so only an exact copy of the reference's sum keeps the same set."""
    probs = x.sort(descending=True, stable=True).values.softmax(dim=0)
    mass_above = probs.cumsum(0) - probs
    below = int((mass_above < 0.999).sum())  # positions whose edge is a top_p below 1
    edge = mass_above[min(int(at * below), below - 1)].reshape(1)  # [1]
    top_p = (edge + 1e-6).clamp(1e-3, 1.0)  # [1] float32
    for _ in range(8):  # step one ulp at a time until top_p - 1e-6 lands on the edge
        gap = (top_p - 1e-6) - edge
        if gap.item() == 0:
            break
        top_p = torch.nextafter(top_p, top_p - gap).clamp(1e-3, 1.0)
    return top_p.item()


ROW = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 1e-5, 0.05, 0.7, 1.0, 1.7, 1e3]),
    "top_k": st.sampled_from([-1, 1, 2, 3, 7, 50, "vocab-1", "vocab", "vocab+5"]),
    "top_p": st.one_of(st.just(1.0), st.floats(0.01, 1.0), st.floats(0.0, 1.0).map(lambda a: -a)),
    "min_p": st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
    "penalty": st.sampled_from([1.0, 1.0, 1.5]),
})  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(ROW, min_size=1, max_size=5),
    vocab=st.one_of(st.integers(2, 40), st.integers(1000, 5000)),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([0.01, 1.0, 4.0, 30.0]),
    grid=st.sampled_from([0, 0, 1, 8]),
    masked=st.sampled_from([0.0, 0.0, 0.3]),
)
def test_warp_equals_the_sort_based_reference(
    rows: list[dict], vocab: int, seed: int, scale: float, grid: int, masked: float
) -> None:
    """Random rows, many ties (logits on a grid), -inf tokens, every truncation combination and
    knife-edge top_p (a negative top_p here encodes a fraction of the row): bitwise equal."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), vocab, generator=g) * scale  # [n, vocab]
    if grid:
        logits = (logits * grid).round() / grid
    logits[torch.rand(len(rows), vocab, generator=g) < masked] = float("-inf")
    logits[:, 0] = logits[:, 0].clamp(min=0.0)  # every row keeps a finite token
    sizes = {"vocab-1": vocab - 1, "vocab": vocab, "vocab+5": vocab + 5}
    outputs = [torch.randint(0, vocab, (3,), generator=g).tolist() for _ in rows]
    params = []
    for i, row in enumerate(rows):
        top_k, top_p, temperature = row["top_k"], row["top_p"], row["temperature"]
        sp = SamplingParams(temperature=temperature, repetition_penalty=row["penalty"])
        if top_p <= 0.0:  # knife edge; greedy rows ignore top_p
            t = tensors([sp], vocab, outputs=outputs[i : i + 1])
            x = apply_penalties(logits[i : i + 1], t)[0] / t.temperature[0]
            top_p = knife_edge_top_p(x, -top_p)
        top_k = sizes.get(top_k, top_k)
        params.append(replace(sp, top_k=top_k, top_p=top_p, min_p=row["min_p"]))
    t = tensors(params, vocab, outputs=outputs)
    assert torch.equal(warp(logits, t), reference_warp(logits, t))
