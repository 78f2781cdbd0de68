"""Logits warping: raw logits -> the warped distribution p that sampling and verification use.

Target and drafter both go through `warp`, so p and q are warped identically (docs/design.md, 3).
Every step is a batched tensor op; python flags on `SamplingTensors` skip steps no row needs,
so on an accelerator the hot path never reads a value back from the device. On the CPU, where
reading back is free, top-k/top-p avoid the full argsort instead (`_truncate_cpu`), with the
very same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verispec.types.sampling_params import SamplingParams

# float32 probabilities and their sums are off by a few ulps, so the inclusive boundaries of
# top-p ("mass >= top_p") and min-p ("p >= min_p * max p") get this slack: probs
# [0.5, 0.3, 0.15, 0.05] keep exactly two tokens with top_p=0.8 and four with min_p=0.1.
BOUNDARY_TOL = 1e-6

_TOPK_MAX = 256
"""Largest top-k the CPU path serves with torch.topk; beyond it a full values sort costs less."""

_CHUNK_ROWS = 4
"""Rows the CPU path takes through its vocab-wide passes at once: ~3 MB of temporaries, which
stay in cache (32 rows at once spill to memory and take ~1.5x as long)."""


@dataclass(slots=True)
class SamplingTensors:
    """Per-row sampling parameters of one batch of logits rows, built once per step.

    Greedy rows hold the disabled value of temperature, top-k, top-p and min-p (they take the
    argmax instead), so each `need_*` flag is True exactly when some row changes that step.
    """

    temperature: torch.Tensor  # [n] float32; greedy rows hold 1.0 (unused)
    greedy: torch.Tensor  # [n] bool
    top_k: torch.Tensor  # [n] int64, vocab_size where disabled
    top_p: torch.Tensor  # [n] float32, 1.0 where disabled
    min_p: torch.Tensor  # [n] float32, 0.0 where disabled
    repetition_penalty: torch.Tensor  # [n] float32, 1.0 where disabled
    presence_penalty: torch.Tensor  # [n] float32, 0.0 where disabled
    frequency_penalty: torch.Tensor  # [n] float32, 0.0 where disabled
    prompt_mask: torch.Tensor | None  # [n, vocab] bool: token occurs in the prompt
    output_counts: torch.Tensor | None  # [n, vocab] float32: occurrences in the output so far
    allowed: torch.Tensor | None  # [n, vocab] bool: the grammar's mask; None: no row has one
    all_greedy: bool  # every row is greedy: skip temperature and truncation entirely
    any_greedy: bool  # some row is greedy: overwrite those rows with a one-hot
    need_penalties: bool  # some row has a penalty: prompt_mask/output_counts are set
    need_top_k: bool  # some row keeps fewer than vocab_size tokens by top-k
    need_top_p: bool  # some row has top_p < 1
    need_min_p: bool  # some row has min_p > 0

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str = "cpu",
        allowed: torch.Tensor | None = None,
    ) -> SamplingTensors:
        """Gather one row per entry of `params` (the verifier passes one row per draft position,
        whose output ids include the earlier drafts), as tensors on `device`; `allowed` [n,
        vocab] bool is the rows' structured-output mask (sample/grammar.py), if any row has one."""
        if not len(params) == len(prompt_token_ids) == len(output_token_ids):
            raise ValueError(
                f"params, prompt_token_ids and output_token_ids must have one entry per row, got "
                f"{len(params)}, {len(prompt_token_ids)} and {len(output_token_ids)}"
            )
        temperature = _unless_greedy(params, "temperature", 1.0)
        top_k = [k if 0 < k < vocab_size else vocab_size
                 for k in _unless_greedy(params, "top_k", vocab_size)]  # fmt: skip
        top_p = _unless_greedy(params, "top_p", 1.0)
        min_p = _unless_greedy(params, "min_p", 0.0)
        greedy = [p.greedy for p in params]
        need_penalties = any(p.needs_penalties for p in params)
        prompt_mask = output_counts = None
        if need_penalties:
            prompt_mask, output_counts = _histories(
                params, prompt_token_ids, output_token_ids, vocab_size, device
            )

        def f32(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            temperature=f32(temperature),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
            top_p=f32(top_p),
            min_p=f32(min_p),
            repetition_penalty=f32([p.repetition_penalty for p in params]),
            presence_penalty=f32([p.presence_penalty for p in params]),
            frequency_penalty=f32([p.frequency_penalty for p in params]),
            prompt_mask=prompt_mask,
            output_counts=output_counts,
            allowed=None if allowed is None else allowed.to(device),
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            need_penalties=need_penalties,
            need_top_k=any(k < vocab_size for k in top_k),
            need_top_p=any(p < 1.0 for p in top_p),
            need_min_p=any(p > 0.0 for p in min_p),
        )


def _unless_greedy(params: Sequence[SamplingParams], field: str, off: float) -> list[float]:
    """Each row's value of `field`, or `off` (the disabled value) for greedy rows, which never
    reach temperature or truncation."""
    return [off if p.greedy else getattr(p, field) for p in params]


def _histories(
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-occurrence mask and output counts [n, vocab], filled only for rows with penalties
    (other rows stay empty, which makes the penalty step a no-op for them)."""
    n = len(params)
    rows = [i for i, p in enumerate(params) if p.needs_penalties]

    def flat(ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        row_of = [i for i in rows for _ in ids[i]]
        tokens = [t for i in rows for t in ids[i]]
        as_long = {"dtype": torch.int64, "device": device}
        return torch.tensor(row_of, **as_long), torch.tensor(tokens, **as_long)

    prompt_mask = torch.zeros(n, vocab_size, dtype=torch.bool, device=device)  # [n, vocab]
    prompt_mask[flat(prompt_token_ids)] = True
    output_counts = torch.zeros(n, vocab_size, dtype=torch.float32, device=device)  # [n, vocab]
    out_rows, out_tokens = flat(output_token_ids)
    one = torch.ones((), dtype=torch.float32, device=device)
    output_counts.index_put_((out_rows, out_tokens), one, accumulate=True)
    return prompt_mask, output_counts


def apply_mask(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Logits with the tokens a row's grammar forbids at -inf (a no-op without a grammar): the
    first step of warping, so a constrained request's p, and its drafter's q, are the
    constrained distributions."""
    if t.allowed is None:
        return logits
    return logits.masked_fill(~t.allowed, float("-inf"))


def apply_penalties(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Repetition, frequency and presence penalties with vLLM's semantics; returns a new tensor.

    Repetition counts tokens seen in the prompt OR the output (positive logits are divided by
    the penalty, others multiplied, so the token always becomes less likely); frequency and
    presence count the output only: logit -= frequency * count + presence * (count > 0).
    """
    if t.prompt_mask is None or t.output_counts is None:  # None exactly when no row needs them
        return logits
    counts = t.output_counts  # [n, vocab]
    seen = t.prompt_mask | (counts > 0)  # [n, vocab]
    rep = t.repetition_penalty.unsqueeze(1)  # [n, 1]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)  # [n, vocab]
    logits = torch.where(seen, penalised, logits)
    logits = logits - t.frequency_penalty.unsqueeze(1) * counts
    return logits - t.presence_penalty.unsqueeze(1) * (counts > 0).to(logits.dtype)


def truncate_sorted(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Top-k then top-p on one stable descending sort (ties keep the lowest token id first).

    Top-k keeps exactly k tokens. Top-p keeps the smallest prefix of the sorted top-k survivors
    whose renormalised mass reaches top_p: a token stays while the mass strictly above it is
    below top_p. Example: p = [0.5, 0.3, 0.15, 0.05], top_p = 0.8 keeps 2, top_p = 0.81 keeps 3.
    Accelerators run this (their sorts are fast, and it never syncs); CPUs run `_truncate_cpu`.
    """
    vocab = logits.shape[1]
    sorted_logits, order = torch.sort(logits, dim=1, descending=True, stable=True)  # [n, vocab]
    remove = ~_kept_positions(sorted_logits, t.top_k, t.top_p, vocab, t.need_top_k, t.need_top_p)
    remove = remove.scatter(1, order, remove)  # back to token order
    return logits.masked_fill(remove, float("-inf"))


def _kept_positions(
    head: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    vocab: int,
    need_top_k: bool,
    need_top_p: bool,
) -> torch.Tensor:
    """[m, h] True where position r of the stable descending order survives top-k and top-p,
    from `head` [m, h]: the h >= max(top_k) largest values of each row, descending; the flags
    say whether some row has a top-k below h or a top-p below 1 (python flags: no sync).

    Only values matter, never which of several tied tokens sits where: top-p's softmax runs
    over the same vocab-wide sorted row as with a full sort (positions >= h are -inf, as every
    position >= top_k is), so each float op, and thus each decision, is the same bit for bit.
    """
    h = head.shape[1]
    keep = torch.ones_like(head, dtype=torch.bool)  # [m, h]
    if need_top_k:
        keep = torch.arange(h, device=head.device).unsqueeze(0) < top_k.unsqueeze(1)
        head = head.masked_fill(~keep, float("-inf"))
    if need_top_p:
        row = head if h == vocab else torch.nn.functional.pad(head, (0, vocab - h), value=-math.inf)
        probs = row.softmax(dim=1)  # [m, vocab]
        mass_above = probs.cumsum(dim=1).sub_(probs)[:, :h]  # [m, h] mass ranked higher
        # rows with top_p = 1 keep everything: no mass reaches an infinite threshold
        threshold = torch.where(top_p < 1.0, top_p - BOUNDARY_TOL, math.inf)  # [m]
        over = mass_above >= threshold.unsqueeze(1)  # [m, h]
        over[:, 0] = False  # the most probable token always stays
        keep = keep.logical_and_(over.logical_not_()) if need_top_k else over.logical_not_()
    return keep


def _truncate_cpu(x: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """`truncate_sorted`'s result, bit for bit, without its stable argsort of [n, vocab].

    Only truncating rows are touched; `_kept_ids` finds the tokens each of them keeps.
    """
    vocab = x.shape[1]
    ks, ps = t.top_k.tolist(), t.top_p.tolist()
    rows = [i for i, (k, p) in enumerate(zip(ks, ps, strict=True)) if k < vocab or p < 1.0]
    if not rows:
        return x
    if len(rows) == len(x):
        xs, top_k, top_p, out = x, t.top_k, t.top_p, torch.full_like(x, -math.inf)
    else:
        index = torch.tensor(rows, device=x.device)  # [m] the truncating rows
        xs, top_k, top_p = x[index], t.top_k[index], t.top_p[index]  # [m, vocab], [m], [m]
        out = x.index_fill(0, index, -math.inf)
    kept = _kept_ids(xs, top_k, top_p, t.need_top_p, max(ks[i] for i in rows))
    if kept is None:  # NaN logits: leave them to the sort path, NaN and all
        return truncate_sorted(x, t)
    out_np, x_np = out.detach().numpy(), xs.detach().numpy()  # share memory: writes go to out
    for i, (row, tokens) in enumerate(zip(rows, kept, strict=True)):
        out_np[row, tokens] = x_np[i, tokens]
    return out


def _kept_ids(
    xs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, need_top_p: bool, h: int
) -> list[np.ndarray] | None:
    """The token ids each row of xs [m, vocab] keeps (None if a row holds NaN); h = max top_k.

    `_kept_positions` needs the rows' largest values alone: torch.topk when h <= _TOPK_MAX,
    else numpy's vectorised sort of the values (~20x faster than torch's argsort). It runs on
    _CHUNK_ROWS rows at a time, so its vocab-wide passes stay in cache; `_kept_tokens` then
    maps each row's kept positions to token ids.
    """
    vocab = xs.shape[1]
    width = h if h <= _TOPK_MAX and h < vocab else vocab  # columns of each row's head
    candidates: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(xs)
    if width < vocab:
        heads, ids = torch.topk(xs, h + 1, dim=1)  # [m, h + 1] descending, ties in any order
        candidates = list(zip(heads.numpy(), ids.numpy(), strict=True))
        largest = heads[:, 0]  # [m]
    else:
        heads = torch.from_numpy(_sorted_values(xs))  # [m, vocab] ascending
        largest = heads[:, -1]  # [m]
    if bool(largest.isnan().any()):  # NaN ranks above every number
        return None
    need_top_k = int(top_k.min()) < width  # some row cuts inside the head
    x_np, kept = xs.detach().numpy(), []
    for start in range(0, len(xs), _CHUNK_ROWS):
        part = slice(start, start + _CHUNK_ROWS)
        head = heads[part, :h] if width < vocab else heads[part].flip(1)  # [c, width] descending
        keep = _kept_positions(head, top_k[part], top_p[part], vocab, need_top_k, need_top_p)
        for i, (head_i, keep_i) in enumerate(zip(head.numpy(), keep.numpy(), strict=True)):
            kept.append(_kept_tokens(x_np[start + i], head_i, keep_i, candidates[start + i]))
    return kept


def _kept_tokens(
    row: np.ndarray,
    head: np.ndarray,
    keep: np.ndarray,
    candidates: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """Token ids of the kept positions `keep` [h] of one row [vocab] whose largest values,
    descending, are `head` [h]; `candidates` (values, ids) [h + 1] are torch.topk's, if any.

    Position p holds the p-th token of the stable descending order of any set that contains
    every token down to the last kept value with its whole tie group: topk's, unless a tie
    runs past it, else all tokens >= that value. -inf tokens stay -inf: none are returned.
    >>> row = np.array([1.0, 3.0, 2.0, 3.0], dtype=np.float32)
    >>> _kept_tokens(row, np.sort(row)[::-1], np.array([True, False, True, False]), None)
    array([1, 2])
    """
    pos = np.flatnonzero(keep & (head > -np.inf))  # [k] kept positions, ascending
    if len(pos) == 0:
        return pos
    bound = head[pos[-1]]
    if candidates is None or bound <= candidates[0][-1]:  # topk may have cut a tie group
        ids = np.flatnonzero(row >= bound)  # [c] whole tie groups, ascending ids
        candidates = row[ids], ids
    return _stable_ids(*candidates)[pos]


def _stable_ids(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ids [c] (distinct) ordered by values [c] descending, ties by ascending id, as a stable
    sort orders them: one numpy sort of unique int64 keys (value rank, id).

    >>> values = np.array([3.0, -0.0, 3.0, 0.0], dtype=np.float32)
    >>> _stable_ids(values, np.array([4, 1, 0, 2])).tolist()
    [0, 4, 1, 2]
    """
    bits = (values + np.float32(0.0)).view(np.int32).astype(np.int64)  # -0.0 becomes 0.0
    rank = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # integer order = float order
    return np.sort(rank * -(1 << 32) + ids) & 0xFFFFFFFF  # keys: value descending, then id


def _sorted_values(xs: torch.Tensor) -> np.ndarray:
    """[m, vocab] each row of xs [m, vocab] sorted ascending: values only, so no argsort.

    >>> _sorted_values(torch.tensor([[1.0, 3.0, 2.0, 3.0]])).tolist()
    [[1.0, 2.0, 3.0, 3.0]]
    """
    return np.sort(xs.detach().numpy(), axis=1)


def warp(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """The ONE function that turns raw logits [n, vocab] into the warped distribution p [n, vocab]
    (float32, rows sum to 1).

    Order as in Hugging Face generate, after the grammar's mask: mask -> penalties ->
    temperature -> top-k -> top-p -> min-p -> softmax. Greedy rows get a one-hot at the argmax
    of the masked, penalised logits (ties: lowest id).
    """
    x = apply_penalties(apply_mask(logits.float(), t), t)  # [n, vocab]
    greedy_p = None
    if t.any_greedy:
        top = x.argmax(dim=1, keepdim=True)  # [n, 1]
        greedy_p = torch.zeros_like(x).scatter_(1, top, 1.0)  # [n, vocab] one-hot
        if t.all_greedy:
            return greedy_p
    x = x / t.temperature.unsqueeze(1)
    if t.need_top_k or t.need_top_p:
        x = _truncate_cpu(x, t) if x.device.type == "cpu" else truncate_sorted(x, t)
    if t.need_min_p:
        probs = x.softmax(dim=1)  # [n, vocab]
        floor = (t.min_p - BOUNDARY_TOL).unsqueeze(1) * probs.amax(dim=1, keepdim=True)  # [n, 1]
        x = x.masked_fill(probs < floor, float("-inf"))
    p = x.softmax(dim=1)  # [n, vocab]
    if greedy_p is not None:
        p = torch.where(t.greedy.unsqueeze(1), greedy_p, p)
    return p
