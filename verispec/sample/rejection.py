"""The verifier: speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023), and
its coupled form for seeded requests.

For each request the target scored 1 + k positions in one forward: row i (i < k) is the
distribution after the prefix plus drafts d_1..d_i, row k the one after all k drafts.

- accepted: draft d_{i+1} is kept with probability min(1, p_i(d) / q_i(d)), left to right,
  until the first rejection. p and q are the target's and drafter's distributions after the
  SAME warping for that position (temperature, top-k, top-p, min-p, and penalties whose
  history includes the earlier drafts).
- recovered: at the first rejection (position i), one token drawn from the residual
  norm(max(0, p_i - q_i)); the drafts after it are discarded.
- bonus: when all k drafts are accepted, one extra token drawn from p_k.

Every step therefore emits accepted + 1 tokens, and each emitted token is distributed exactly
as if sampled from p itself. Greedy rows have one-hot p (and one-hot q from a greedy or
deterministic drafter), so the same rule reduces to "keep drafts while they equal the argmax,
then emit the argmax"; that case also has a fast path over raw logits.

A seeded request is verified by coupling instead: row i's own token is argmax(p_i / E), E the
counter-based noise of its output position (sample/noise.py), which is the token plain seeded
decoding samples there; drafts are kept while they equal those tokens, then the row's own
token is emitted. The output is then plain decoding's for any drafts and any k; a drafter that
draws with the same noise (argmax(q / E)) agrees often (docs/design.md, 3).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.sample.logits import SamplingTensors, apply_mask, warp
from verispec.sample.noise import NoiseKey
from verispec.sample.sampler import argmax_rows, sample


@dataclass(slots=True)
class Verdict:
    """What the verifier decided for every request of one step."""

    token_ids: list[list[int]]
    """Per request: its accepted drafts followed by one recovered or bonus token."""
    num_accepted: list[int]
    """Per request: how many of its drafts were accepted."""
    paths: list[list[int]] | None = None
    """Per request: the indices of its accepted drafts (a tree's accepted path); None = the
    first num_accepted drafts (a chain)."""

    def accepted_drafts(self, i: int) -> list[int]:
        """Indices among request i's drafts of those accepted, in order."""
        return self.paths[i] if self.paths is not None else list(range(self.num_accepted[i]))


def verify(
    logits: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    draft_probs: torch.Tensor | None,
    t: SamplingTensors,
    keys: Sequence[NoiseKey | None],
    generator: torch.Generator | None = None,
) -> Verdict:
    """Accept or reject each request's drafts and add the recovered/bonus token.

    logits [R, vocab]: request r owns len(drafts[r]) + 1 consecutive rows; t has one row per
    logits row; draft_probs [sum of k, vocab] or None (one-hot q); keys: per request, the noise
    key of its first row (a seeded request, verified by coupling) or None (rejection sampling,
    its draws from `generator`).
    Worked example (greedy): drafts [[5, 7, 2]], row argmaxes [5, 7, 9, 4] -> accept 5 and 7,
    reject 2, emit the target's 9: token_ids [[5, 7, 9]], num_accepted [2].
    """
    if t.all_greedy and not t.need_penalties:
        return verify_greedy(apply_mask(logits, t), drafts)
    _check_rows(logits, drafts)
    if len(keys) != len(drafts):
        raise ValueError(f"need one noise key per request ({len(drafts)}), got {len(keys)}")
    p = warp(logits, t)  # [R, vocab]
    seeded = [i for i, key in enumerate(keys) if key is not None]
    seeded_keys = [key for key in keys if key is not None]
    if not seeded:
        return _rejection(p, drafts, draft_probs, t.greedy, generator)
    if len(seeded) == len(drafts):
        return _coupled(p, drafts, seeded_keys, t.greedy)
    unseeded = [i for i, key in enumerate(keys) if key is None]
    counts = [len(d) for d in drafts]
    rows = [_rows_of(counts, group, p.device) for group in (seeded, unseeded)]  # [R_s], [R_u]
    coupled = _coupled(p[rows[0]], [drafts[i] for i in seeded], seeded_keys, t.greedy[rows[0]])
    q = None if draft_probs is None else draft_probs[_drafts_of(counts, unseeded, p.device)]
    rejected = _rejection(p[rows[1]], [drafts[i] for i in unseeded], q, t.greedy[rows[1]],
                          generator)  # fmt: skip
    return _merge([coupled, rejected], [seeded, unseeded], len(drafts))


def _rejection(
    p: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    draft_probs: torch.Tensor | None,
    greedy: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Rejection sampling of every request's drafts over warped rows p [R, vocab] (greedy [R]
    per row): accepted drafts, then the recovered or bonus token, all draws from `generator`."""
    counts = [len(d) for d in drafts]
    device = p.device
    flat = torch.tensor([x for d in drafts for x in d], dtype=torch.int64, device=device)  # [D]
    starts = torch.tensor(_starts(counts), dtype=torch.int64, device=device)  # [N] first row
    k = torch.tensor(counts, dtype=torch.int64, device=device)  # [N]
    draft_rows = _draft_rows(counts, device)  # [D] row of p scoring each draft
    p_draft = p[draft_rows, flat]  # [D]
    q_draft = (
        torch.ones_like(p_draft)
        if draft_probs is None
        else draft_probs[torch.arange(len(flat), device=device), flat]
    )  # [D]
    u = _uniforms(counts, generator, device)  # [D] in (0, 1]
    accepted = _accepted_prefix(u * q_draft <= p_draft, counts)  # [N]
    dist = _final_distribution(p, draft_probs, flat, starts, accepted, k)  # [N, vocab]
    greedy_final = greedy[starts + accepted]
    final = sample(dist, [None] * len(drafts), greedy_final, generator)  # [N]
    num_accepted = accepted.tolist()
    final_ids = final.tolist()
    token_ids = [[*d[:a], f] for d, a, f in zip(drafts, num_accepted, final_ids, strict=True)]
    return Verdict(token_ids=token_ids, num_accepted=num_accepted)


def _coupled(
    p: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    keys: Sequence[NoiseKey],
    greedy: torch.Tensor,
) -> Verdict:
    """Coupled verification of seeded requests over warped rows p [R, vocab] (greedy [R]): each
    row's token is argmax(p / E) with the noise of its output position (the first row's key,
    then one position per row; greedy rows their argmax), the token plain seeded decoding
    samples there; drafts are kept while they equal those tokens (_keep_matching).
    Lossless for any drafts: they only decide how many of those tokens one step emits."""
    row_keys: list[NoiseKey | None] = [
        key.shifted(j) for key, d in zip(keys, drafts, strict=True) for j in range(len(d) + 1)
    ]
    return _keep_matching(drafts, sample(p, row_keys, greedy).tolist())


def verify_greedy(logits: torch.Tensor, drafts: Sequence[Sequence[int]]) -> Verdict:
    """verify for greedy rows without penalties: p and q are one-hot, so keep each request's
    drafts while they equal its rows' argmax, then emit the argmax of the row after the last
    kept one. One argmax over logits [R, vocab] and one read-back; the rest is on the host.
    Worked example: drafts [[5, 7, 2], []], row argmaxes [5, 7, 9, 4, 8] -> token_ids
    [[5, 7, 9], [8]], num_accepted [2, 0]."""
    _check_rows(logits, drafts)
    return _keep_matching(drafts, argmax_rows(logits).tolist())


def _keep_matching(drafts: Sequence[Sequence[int]], target: list[int]) -> Verdict:
    """Each request's drafts while they equal the target's token of their row (target [R], a
    request's len(d) + 1 rows in order), then the target's token of the row after them."""
    token_ids, num_accepted, start = [], [], 0
    for d in drafts:
        a = 0
        while a < len(d) and d[a] == target[start + a]:
            a += 1
        token_ids.append([*d[:a], target[start + a]])
        num_accepted.append(a)
        start += len(d) + 1
    return Verdict(token_ids=token_ids, num_accepted=num_accepted)


def _rows_of(counts: list[int], group: list[int], device: torch.device) -> torch.Tensor:
    """[rows] the logits rows of the requests in group (request r owns counts[r] + 1 rows)."""
    starts = _starts(counts)
    return torch.tensor([starts[i] + j for i in group for j in range(counts[i] + 1)],
                        dtype=torch.int64, device=device)  # fmt: skip


def _drafts_of(counts: list[int], group: list[int], device: torch.device) -> torch.Tensor:
    """[drafts] the draft rows (flat draft order) of the requests in group."""
    firsts = list(itertools.accumulate(counts, initial=0))
    return torch.tensor([firsts[i] + j for i in group for j in range(counts[i])],
                        dtype=torch.int64, device=device)  # fmt: skip


def _merge(verdicts: list[Verdict], groups: list[list[int]], n: int) -> Verdict:
    """One Verdict in request order from verdicts of disjoint groups of request indices."""
    token_ids: list[list[int]] = [[] for _ in range(n)]
    num_accepted = [0] * n
    for verdict, group in zip(verdicts, groups, strict=True):
        for j, i in enumerate(group):
            token_ids[i], num_accepted[i] = verdict.token_ids[j], verdict.num_accepted[j]
    return Verdict(token_ids=token_ids, num_accepted=num_accepted)


def _check_rows(logits: torch.Tensor, drafts: Sequence[Sequence[int]]) -> None:
    """Request r owns len(drafts[r]) + 1 logits rows; any other count is a caller's bug."""
    needed = sum(len(d) for d in drafts) + len(drafts)
    if logits.shape[0] != needed:
        raise ValueError(f"verify needs {needed} logits rows, got {logits.shape[0]}")


def _starts(counts: list[int]) -> list[int]:
    """First logits row of each request: request r owns counts[r] + 1 rows."""
    out, row = [], 0
    for c in counts:
        out.append(row)
        row += c + 1
    return out


def _draft_rows(counts: list[int], device: torch.device) -> torch.Tensor:
    """[D] the logits row that scores each draft (a request's first k rows)."""
    rows = [s + i for s, c in zip(_starts(counts), counts, strict=True) for i in range(c)]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def _accepted_prefix(ok: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """[N] per request, the number of leading True values among its drafts' flags ok [D]."""
    n, width = len(counts), max(counts, default=0)
    if width == 0:
        return torch.zeros(n, dtype=torch.int64, device=ok.device)
    padded = torch.zeros(n, width, dtype=torch.bool, device=ok.device)  # [N, kmax]
    lengths = torch.tensor(counts, device=ok.device)  # [N]
    padded[torch.arange(width, device=ok.device)[None, :] < lengths[:, None]] = ok
    return padded.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _uniforms(
    counts: list[int], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """[D] one uniform in (0, 1] per draft, from `generator`, request by request."""
    parts = [1.0 - torch.rand(c, generator=generator, device=device) for c in counts]
    return torch.cat(parts) if parts else torch.empty(0, device=device)


def _final_distribution(
    p: torch.Tensor,
    q: torch.Tensor | None,
    flat: torch.Tensor,
    starts: torch.Tensor,
    accepted: torch.Tensor,
    k: torch.Tensor,
) -> torch.Tensor:
    """[N, vocab] where each request's last token comes from: the residual norm(max(0, p - q))
    at the first rejected position, or p at the bonus position when every draft was accepted."""
    dist = p[starts + accepted].clone()  # [N, vocab]
    rejected = accepted < k  # [N]
    if not bool(rejected.any()):
        return dist
    draft_starts = torch.cumsum(k, 0) - k  # [N] first draft of each request in flat order
    at = (draft_starts + accepted)[rejected]  # [n_rej] the rejected draft of each such request
    if q is None:
        dist[rejected] = dist[rejected].scatter(1, flat[at][:, None], 0.0)  # q one-hot at the draft
    else:
        dist[rejected] = (dist[rejected] - q[at]).clamp_(min=0.0)
    mass = dist.sum(dim=1, keepdim=True)  # [N, 1]
    # Zero residual mass means p == q there, where rejection has probability 0; keep p then.
    return torch.where(mass > 0, dist / mass.clamp(min=1e-30), p[starts + accepted])
