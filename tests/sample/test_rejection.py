"""verify (the rejection-sampling verifier) on hand-made tensors, no model: the docstring's
greedy example, bonus and zero-draft cases, one-hot q, batching, bounds, bad input, and
exactness on hand-made p and q: the emitted token follows p, acceptance is sum min(p, q)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.sample import SamplingTensors, sample, warp
from verispec.sample.noise import NoiseKey
from verispec.sample.rejection import Verdict, verify, verify_greedy
from verispec.types.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tensors(params: Sequence[dict], vocab: int) -> SamplingTensors:
    """One SamplingTensors row per dict of SamplingParams fields (no penalties, no history)."""
    rows = [SamplingParams(**p) for p in params]
    return SamplingTensors.build(rows, [[]] * len(rows), [[]] * len(rows), vocab)


def one_hot_logits(argmaxes: Sequence[int], vocab: int) -> torch.Tensor:
    """[len(argmaxes), vocab] logits whose row i peaks at argmaxes[i] (ties impossible)."""
    logits = torch.randn(len(argmaxes), vocab, generator=seeded(0))
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 10.0
    return logits


def with_sampled_mate(
    logits: torch.Tensor, drafts: list[list[int]], params: list[dict]
) -> tuple[torch.Tensor, list[list[int]], list[dict]]:
    """Append one sampled request without drafts, which turns off the all-greedy fast path."""
    mate = torch.zeros(1, logits.shape[1])
    return torch.cat([logits, mate]), [*drafts, []], [*params, dict(temperature=1.0)]


@pytest.mark.parametrize("fast_path", [True, False])
def test_docstring_greedy_example(fast_path: bool) -> None:
    logits, drafts, params = one_hot_logits([5, 7, 9, 4], 10), [[5, 7, 2]], [GREEDY] * 4
    if not fast_path:
        logits, drafts, params = with_sampled_mate(logits, drafts, params)
    v = verify(logits, drafts, None, tensors(params, 10), [None] * len(drafts), seeded(0))
    assert v.token_ids[0] == [5, 7, 9] and v.num_accepted[0] == 2


@pytest.mark.parametrize("fast_path", [True, False])
def test_greedy_all_accepted_adds_the_bonus_argmax(fast_path: bool) -> None:
    logits, drafts, params = one_hot_logits([3, 1, 8, 6], 10), [[3, 1, 8]], [GREEDY] * 4
    if not fast_path:
        logits, drafts, params = with_sampled_mate(logits, drafts, params)
    v = verify(logits, drafts, None, tensors(params, 10), [None] * len(drafts), seeded(0))
    assert v.token_ids[0] == [3, 1, 8, 6] and v.num_accepted[0] == 3


@pytest.mark.parametrize("fast_path", [True, False])
def test_greedy_first_draft_rejected(fast_path: bool) -> None:
    logits, drafts, params = one_hot_logits([2, 7, 9], 10), [[4, 7]], [GREEDY] * 3
    if not fast_path:
        logits, drafts, params = with_sampled_mate(logits, drafts, params)
    v = verify(logits, drafts, None, tensors(params, 10), [None] * len(drafts), seeded(0))
    assert v.token_ids[0] == [2] and v.num_accepted[0] == 0


def test_zero_drafts_is_plain_argmax_or_plain_sampling() -> None:
    logits = torch.randn(3, 50, generator=seeded(1))
    params = [GREEDY, dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_p=0.9)]
    t = tensors(params, 50)
    keys = [NoiseKey(11, 0), NoiseKey(12, 3), NoiseKey(13, 9)]
    v = verify(logits, [[], [], []], None, t, keys)
    assert v.num_accepted == [0, 0, 0]
    assert v.token_ids[0] == [int(logits[0].argmax())]
    for r in (1, 2):  # the token plain sampling draws with the same key, alone
        expected = sample(warp(logits[r : r + 1], tensors([params[r]], 50)), keys[r : r + 1])
        assert v.token_ids[r] == [int(expected[0])]
    v = verify(logits, [[], [], []], None, t, [None] * 3, seeded(5))  # the same draws
    assert v.token_ids == [[x] for x in sample(warp(logits, t), [None] * 3, t.greedy, seeded(5))]


@st.composite
def batches(draw: st.DrawFn, vocab: int = 8) -> dict:
    """Random requests: k in 0..3, greedy or sampled (temperature, top-k, top-p); each draft is
    its row's argmax or a random token (so runs of acceptances happen); q rows one-hot for
    greedy requests (a greedy drafter), random with mass on the draft otherwise."""
    seed = draw(st.integers(0, 2**20))
    g = seeded(seed)
    drafts, params, logits, q_rows = [], [], [], []
    for _ in range(draw(st.integers(1, 5))):
        k = draw(st.integers(0, 3))
        p = draw(
            st.sampled_from(
                [GREEDY, dict(temperature=1.0), dict(temperature=0.7, top_k=3),
                 dict(temperature=1.3, top_p=0.8)]
            )
        )  # fmt: skip
        rows = torch.randn(k + 1, vocab, generator=g) * 2  # [k + 1, vocab]
        guess = torch.randint(0, vocab, (k,), generator=g)
        d = torch.where(torch.rand(k, generator=g) < 0.6, rows[:k].argmax(dim=1), guess).tolist()
        for token in d:
            q = torch.zeros(vocab) if p is GREEDY else torch.rand(vocab, generator=g)
            q[token] += 1.0
            q_rows.append(q / q.sum())
        drafts.append(d)
        params += [p] * (k + 1)
        logits.append(rows)
    q = torch.stack(q_rows) if q_rows else torch.empty(0, vocab)
    return dict(logits=torch.cat(logits), drafts=drafts, params=params, q=q, seed=seed)


def run(b: dict, q: torch.Tensor | None, only: int | None = None, keyed: bool = True) -> Verdict:
    """verify the batch b (or only its request `only`): request r seeded with seed + r (its
    first row at output position r), or (keyed False) every request drawing from one
    generator seeded with seed."""
    logits, drafts, params, q_all = b["logits"], b["drafts"], b["params"], q
    if only is not None:
        first = sum(len(d) + 1 for d in drafts[:only])
        first_q = sum(len(d) for d in drafts[:only])
        k = len(drafts[only])
        logits, params = logits[first : first + k + 1], params[first : first + k + 1]
        q_all = None if q is None else q[first_q : first_q + k]
        drafts = [drafts[only]]
    offset = 0 if only is None else only
    keys = [NoiseKey(b["seed"] + offset + r, offset + r) if keyed else None
            for r in range(len(drafts))]  # fmt: skip
    t = tensors(params, logits.shape[1])
    return verify(logits, drafts, q_all, t, keys, seeded(b["seed"]))


@settings(max_examples=60, deadline=None)
@given(b=batches())
def test_batch_equals_each_request_alone_and_bounds_hold(b: dict) -> None:
    together = run(b, b["q"])
    for r, d in enumerate(b["drafts"]):
        alone = run(b, b["q"], only=r)
        assert alone.token_ids[0] == together.token_ids[r]
        assert alone.num_accepted[0] == together.num_accepted[r]
        a = together.num_accepted[r]
        assert 0 <= a <= len(d)
        assert together.token_ids[r][:a] == d[:a] and len(together.token_ids[r]) == a + 1


@settings(max_examples=60, deadline=None)
@given(b=batches(), keyed=st.booleans())
def test_none_q_equals_explicit_one_hot_q(b: dict, keyed: bool) -> None:
    flat = [x for d in b["drafts"] for x in d]
    one_hot = torch.zeros(len(flat), b["logits"].shape[1])
    one_hot[torch.arange(len(flat)), torch.tensor(flat, dtype=torch.int64)] = 1.0
    assert run(b, None, keyed=keyed) == run(b, one_hot, keyed=keyed)


def test_greedy_rows_with_one_hot_q_keep_argmax_drafts() -> None:
    """Greedy requests inside a sampled batch follow the greedy rule exactly."""
    logits = one_hot_logits([4, 4, 1, 0, 3], 6)  # rows 0-2: request 0, rows 3-4: request 1
    drafts, params = [[4, 2], [0]], [GREEDY] * 5
    logits, drafts, params = with_sampled_mate(logits, drafts, params)
    for seed in range(20):
        for keys in ([NoiseKey(seed + i, 0) for i in range(3)], [None] * 3):
            v = verify(logits, drafts, None, tensors(params, 6), keys, seeded(seed))
            assert v.token_ids[:2] == [[4, 4], [0, 3]] and v.num_accepted[:2] == [1, 1]


def test_verify_greedy_worked_example() -> None:
    v = verify_greedy(one_hot_logits([5, 7, 9, 4, 8], 10), [[5, 7, 2], []])
    assert v.token_ids == [[5, 7, 9], [8]] and v.num_accepted == [2, 0]


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=4), seed=st.integers(0, 99))
def test_verify_greedy_equals_the_tensor_rule(counts: list[int], seed: int) -> None:
    """The host loop the engine runs for greedy requests decides as verify's one-hot rule does
    (logits with few distinct values, so drafts often match and argmaxes tie)."""
    g = seeded(seed)
    logits = torch.randint(0, 3, (sum(counts) + len(counts), 6), generator=g).float()
    drafts = [torch.randint(0, 6, (c,), generator=g).tolist() for c in counts]
    params = [GREEDY] * logits.shape[0]
    mixed, mixed_drafts, mixed_params = with_sampled_mate(logits, drafts, params)
    t = tensors(mixed_params, 6)
    v = verify(mixed, mixed_drafts, None, t, [None] * len(mixed_drafts), seeded(0))
    got = verify_greedy(logits, drafts)
    assert got.token_ids == v.token_ids[:-1] and got.num_accepted == v.num_accepted[:-1]


def test_wrong_number_of_logits_rows_is_a_value_error() -> None:
    t = tensors([GREEDY] * 4, 5)
    with pytest.raises(ValueError, match="needs 4 logits rows, got 3"):
        verify(torch.zeros(3, 5), [[1, 2, 3]], None, t, [None])
    with pytest.raises(ValueError, match="needs 3 logits rows, got 4"):
        verify(torch.zeros(4, 5), [[1], []], None, t, [None, None])
    with pytest.raises(ValueError, match="needs 3 logits rows, got 4"):
        verify_greedy(torch.zeros(4, 5), [[1], []])


# --- exactness on hand-made p and q ------------------------------------------------------------

DRAWS = 20_000
DELTA = 1e-6  # each bound below fails an exact verifier with probability <= DELTA


def tv_bound(p: torch.Tensor, n: int) -> float:
    """TV(empirical of n draws, p) stays below this with probability >= 1 - DELTA: the mean
    is <= 1/2 sum_x sqrt(p(x) (1 - p(x)) / n) (Jensen), and one draw moves TV by <= 1/n, so
    McDiarmid adds sqrt(ln(1 / DELTA) / (2 n)). It shrinks as 1 / sqrt(n)."""
    mean = 0.5 * float((p * (1 - p) / n).sqrt().sum())
    return mean + math.sqrt(math.log(1 / DELTA) / (2 * n))


def hoeffding(n: int) -> float:
    """|mean of n Bernoulli(a) - a| stays below this with probability >= 1 - DELTA."""
    return math.sqrt(math.log(2 / DELTA) / (2 * n))


P = torch.tensor([0.45, 0.3, 0.15, 0.1, 0.0, 0.0])
P_BONUS = torch.tensor([0.05, 0.15, 0.2, 0.25, 0.35, 0.0])


@pytest.mark.parametrize(
    "q",
    [
        pytest.param([0.1, 0.1, 0.2, 0.2, 0.4, 0.0], id="q-has-tokens-p-lacks"),
        pytest.param([0.7, 0.3, 0.0, 0.0, 0.0, 0.0], id="p-has-tokens-q-lacks"),
        pytest.param([0.0, 0.5, 0.1, 0.0, 0.2, 0.2], id="both-lack-some"),
        pytest.param([0.0, 0.0, 0.0, 0.0, 0.5, 0.5], id="disjoint"),
        pytest.param(P.tolist(), id="q-equals-p"),
        pytest.param(None, id="one-hot-q"),
    ],
)
def test_k1_emits_p_and_accepts_with_sum_of_min(q: list[float] | None) -> None:
    """k = 1, DRAWS requests in one call: draft ~ q (or the fixed token 1 for one-hot q), row 0
    scores it under p, row 1 is the bonus distribution P_BONUS."""
    g = seeded(2024)
    if q is None:
        q_probs = torch.zeros(len(P)).index_fill_(0, torch.tensor([1]), 1.0)
    else:
        q_probs = torch.tensor(q)
    drafts = torch.multinomial(q_probs, DRAWS, replacement=True, generator=g)  # [DRAWS]
    logits = torch.stack([P.log(), P_BONUS.log()]).repeat(DRAWS, 1)  # [2 * DRAWS, vocab]
    t = tensors([dict(temperature=1.0)] * (2 * DRAWS), len(P))
    draft_probs = None if q is None else q_probs.expand(DRAWS, -1)
    v = verify(logits, [[d] for d in drafts.tolist()], draft_probs, t, [None] * DRAWS, generator=g)

    first = torch.tensor([ids[0] for ids in v.token_ids])
    empirical = torch.bincount(first, minlength=len(P)).double() / DRAWS
    tv = 0.5 * float((empirical - P.double()).abs().sum())
    assert tv <= tv_bound(P.double(), DRAWS), (tv, empirical)
    assert empirical[P == 0].sum() == 0  # never a token p lacks

    accepted = torch.tensor(v.num_accepted)
    expected_rate = float(torch.minimum(P, q_probs).sum())  # P(accept) = sum_x min(p, q)
    assert abs(float(accepted.double().mean()) - expected_rate) <= hoeffding(DRAWS)

    bonus = torch.tensor([ids[1] for ids in v.token_ids if len(ids) == 2])  # after acceptance
    assert len(bonus) == int(accepted.sum())
    if len(bonus) >= 1000:
        empirical = torch.bincount(bonus, minlength=len(P)).double() / len(bonus)
        tv = 0.5 * float((empirical - P_BONUS.double()).abs().sum())
        assert tv <= tv_bound(P_BONUS.double(), len(bonus)), (tv, empirical)


def test_k2_emits_p_at_each_position_with_its_own_residual() -> None:
    """k = 2 with context-free rows: p1, p2 score the drafts d1 ~ q1 and d2 ~ q2, p3 is the
    bonus. The first two emitted tokens must be independent draws from p1 and p2 (the second
    one's residual uses q2, not q1), and both drafts survive with probability a1 * a2."""
    p1, p2, p3 = P, torch.tensor([0.1, 0.1, 0.1, 0.2, 0.2, 0.3]), P_BONUS
    q1, q2 = torch.tensor([0.1, 0.6, 0.0, 0.1, 0.2, 0.0]), torch.tensor([0.5, 0.0, 0.0, 0.5, 0, 0])
    g = seeded(7)
    d1 = torch.multinomial(q1, DRAWS, replacement=True, generator=g)
    d2 = torch.multinomial(q2, DRAWS, replacement=True, generator=g)
    logits = torch.stack([p1.log(), p2.log(), p3.log()]).repeat(DRAWS, 1)  # [3 * DRAWS, vocab]
    t = tensors([dict(temperature=1.0)] * (3 * DRAWS), len(P))
    draft_probs = torch.stack([q1, q2]).repeat(DRAWS, 1)  # [2 * DRAWS, vocab]
    drafts = torch.stack([d1, d2], dim=1).tolist()
    v = verify(logits, drafts, draft_probs, t, [None] * DRAWS, generator=g)

    # Requests that rejected d1 emit one token; they contribute to the first position only.
    first = torch.tensor([ids[0] for ids in v.token_ids])
    empirical = torch.bincount(first, minlength=len(P)).double() / DRAWS
    assert 0.5 * float((empirical - p1.double()).abs().sum()) <= tv_bound(p1.double(), DRAWS)
    second = torch.tensor([ids[1] for ids in v.token_ids if len(ids) >= 2])  # d1 was accepted
    empirical = torch.bincount(second, minlength=len(P)).double() / len(second)
    tv = 0.5 * float((empirical - p2.double()).abs().sum())
    assert tv <= tv_bound(p2.double(), len(second)), (tv, empirical)

    a1, a2 = float(torch.minimum(p1, q1).sum()), float(torch.minimum(p2, q2).sum())
    accepted = torch.tensor(v.num_accepted)
    assert abs(float((accepted >= 1).double().mean()) - a1) <= hoeffding(DRAWS)
    assert abs(float((accepted == 2).double().mean()) - a1 * a2) <= hoeffding(DRAWS)


# --- coupled verification of seeded requests ---------------------------------------------------


def own_tokens(logits: torch.Tensor, params: dict, key: NoiseKey) -> list[int]:
    """The token plain seeded decoding samples from each row [R, vocab] of one request, row j
    at the key's position + j: argmax(p / E) with that position's noise."""
    p = warp(logits, tensors([params] * len(logits), logits.shape[1]))
    return sample(p, [key.shifted(j) for j in range(len(logits))]).tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**20), k=st.integers(0, 4), position=st.integers(0, 500),
       hits=st.lists(st.booleans(), min_size=4, max_size=4), with_q=st.booleans())  # fmt: skip
def test_coupled_keeps_drafts_while_they_equal_the_rows_own_tokens(
    seed: int, k: int, position: int, hits: list[bool], with_q: bool
) -> None:
    """Whatever the drafts and their q, a seeded request emits its rows' own tokens: drafts up
    to the first that differs from its row's token, then that row's token."""
    g = seeded(seed)
    params = dict(temperature=1.0, top_k=4)
    logits = torch.randn(k + 1, 6, generator=g)  # [k + 1, 6]
    key = NoiseKey(seed, position)
    own = own_tokens(logits, params, key)
    drafts = [own[j] if hits[j] else int(torch.randint(0, 6, (1,), generator=g)) for j in range(k)]
    q = torch.rand(k, 6, generator=g).softmax(dim=1) if with_q else None
    v = verify(logits, [drafts], q, tensors([params] * (k + 1), 6), [key], seeded(0))
    a = next((j for j in range(k) if drafts[j] != own[j]), k)
    assert v.num_accepted == [a] and v.token_ids == [[*own[:a], own[a]]]


@settings(max_examples=40, deadline=None)
@given(b=batches())
def test_seeded_and_unseeded_requests_in_one_batch_decide_as_apart(b: dict) -> None:
    """Seeded requests are coupled, the others rejection-sampled, in one call: each group gets
    what it gets alone (the unseeded ones draw from the generator in their own order)."""
    n = len(b["drafts"])
    keys = [NoiseKey(b["seed"] + r, r) if r % 2 == 0 else None for r in range(n)]
    t = tensors(b["params"], b["logits"].shape[1])
    mixed = verify(b["logits"], b["drafts"], b["q"], t, keys, seeded(b["seed"]))
    together = run(b, b["q"])  # every request seeded as here
    firsts = [sum(len(d) + 1 for d in b["drafts"][:r]) for r in range(n)]
    unseeded = [r for r in range(n) if keys[r] is None]
    rows = [firsts[r] + j for r in unseeded for j in range(len(b["drafts"][r]) + 1)]
    q_rows = [sum(len(d) for d in b["drafts"][:r]) + j for r in unseeded
              for j in range(len(b["drafts"][r]))]  # fmt: skip
    params = [b["params"][i] for i in rows]
    alone = verify(b["logits"][rows], [b["drafts"][r] for r in unseeded], b["q"][q_rows],
                   tensors(params, b["logits"].shape[1]), [None] * len(unseeded),
                   seeded(b["seed"]))  # fmt: skip
    for r in range(n):
        if keys[r] is not None:
            assert mixed.token_ids[r] == together.token_ids[r]
        else:
            assert mixed.token_ids[r] == alone.token_ids[unseeded.index(r)]


def coupled_acceptance(p: torch.Tensor, q: torch.Tensor) -> float:
    """P(argmax(p / E) == argmax(q / E)) for one noise row E shared by both races: token v wins
    both when E_v < E_w min(p_v / p_w, q_v / q_w) for every w, which has probability
    1 / sum_w max(p_w / p_v, q_w / q_v) (integrate over E_v). At most sum min(p, q) (the
    optimal coupling of rejection sampling), at least (1 - TV) / (1 + TV)."""
    p, q = p.double(), q.double()
    both = (p > 0) & (q > 0)
    return sum(1 / float(torch.maximum(p / p[v], q / q[v]).sum()) for v in both.nonzero()[:, 0])


@pytest.mark.parametrize(
    "q",
    [
        pytest.param([0.1, 0.1, 0.2, 0.2, 0.4, 0.0], id="q-has-tokens-p-lacks"),
        pytest.param([0.7, 0.3, 0.0, 0.0, 0.0, 0.0], id="p-has-tokens-q-lacks"),
        pytest.param([0.0, 0.0, 0.0, 0.0, 0.5, 0.5], id="disjoint"),
        pytest.param(P.tolist(), id="q-equals-p"),
        pytest.param([0.0, 1.0, 0.0, 0.0, 0.0, 0.0], id="one-hot-q"),
    ],
)
def test_coupled_k1_emits_p_and_accepts_as_the_shared_race(q: list[float]) -> None:
    """k = 1, DRAWS seeded requests (seeds 0..DRAWS - 1): each drafts argmax(q / E) with the
    noise of the position it guesses, as a sampling drafter does; the first token follows P,
    the bonus P_BONUS, and acceptance is the shared race's (coupled_acceptance)."""
    q_probs = torch.tensor(q)
    keys: list[NoiseKey | None] = [NoiseKey(seed, 0) for seed in range(DRAWS)]
    drafts = sample(q_probs.expand(DRAWS, -1), keys)  # [DRAWS]
    logits = torch.stack([P.log(), P_BONUS.log()]).repeat(DRAWS, 1)  # [2 * DRAWS, vocab]
    t = tensors([dict(temperature=1.0)] * (2 * DRAWS), len(P))
    v = verify(logits, [[d] for d in drafts.tolist()], q_probs.expand(DRAWS, -1), t, keys)

    first = torch.tensor([ids[0] for ids in v.token_ids])
    empirical = torch.bincount(first, minlength=len(P)).double() / DRAWS
    tv = 0.5 * float((empirical - P.double()).abs().sum())
    assert tv <= tv_bound(P.double(), DRAWS), (tv, empirical)
    assert empirical[P == 0].sum() == 0

    accepted = torch.tensor(v.num_accepted).double()
    expected_rate = coupled_acceptance(P, q_probs)
    assert expected_rate <= float(torch.minimum(P, q_probs).sum()) + 1e-12
    assert abs(float(accepted.mean()) - expected_rate) <= hoeffding(DRAWS)

    bonus = torch.tensor([ids[1] for ids in v.token_ids if len(ids) == 2])
    if len(bonus) >= 1000:
        empirical = torch.bincount(bonus, minlength=len(P)).double() / len(bonus)
        tv = 0.5 * float((empirical - P_BONUS.double()).abs().sum())
        assert tv <= tv_bound(P_BONUS.double(), len(bonus)), (tv, empirical)
