"""ModelRunner: turns a step's scheduled requests into one ragged forward and verifies it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.engine.request import all_greedy, noise_key, sampling_tensors
from verispec.engine.scheduler import Schedule, ScheduledRequest
from verispec.engine.step_drafts import StepDrafts
from verispec.models.batch import SeqChunk
from verispec.models.paged import PagedModel
from verispec.sample.rejection import Verdict, verify, verify_greedy
from verispec.sample.tree import DraftTree, verify_tree
from verispec.types.outputs import TokenLogprobs


class ModelRunner:
    """Owns the target and its paged KV cache; one execute() is one forward."""

    def __init__(self, target: PagedModel, generator: torch.Generator) -> None:
        self.target = target
        self.generator = generator
        """Shared generator for requests without a seed of their own."""

    def execute(
        self, scheduled: list[ScheduledRequest], drafts: StepDrafts,
        feature_layers: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """One forward over every scheduled chunk and its drafts (a tree's nodes with its
        tree mask and positions). Returns logits [R, vocab], with 1 + len(drafts) rows per
        request that samples this step, in scheduled order; and, when feature_layers are
        asked for, the features [every new token, F] of every row in chunk order."""
        chunks = [self._chunk(s, ids, tree) for s, ids, tree
                  in zip(scheduled, drafts.token_ids, drafts.trees, strict=True)]  # fmt: skip
        if not feature_layers:
            return self.target.forward(chunks), None
        return self.target.forward_with_features(chunks, feature_layers)

    @staticmethod
    def _chunk(s: ScheduledRequest, drafts: list[int], tree: DraftTree | None) -> SeqChunk:
        tokens = s.token_ids + drafts
        return SeqChunk(
            token_ids=tokens,
            start_position=s.start,
            slots=s.slots[: len(tokens)],
            block_table=s.request.block_table.blocks,
            num_logits=1 + len(drafts) if s.samples else 0,
            extra_mask=None if tree is None else tree.attention_mask(),
            positions=None if tree is None else tree.positions(s.start),
        )

    def verify(self, logits: torch.Tensor, plan: Schedule, drafts: StepDrafts) -> Verdict:
        """Accepted drafts plus one recovered/bonus token per sampling request (with no drafts
        that is plain sampling). Row j of a request is warped with the drafts on the path to
        it as history. An accepted tree path's KV is moved to the slots a chain would use."""
        sampling, chains = plan.sampling, drafts.rows(plan.sampled)
        if drafts.has_trees:
            return self._verify_trees(logits, sampling, chains, drafts.tree_rows(plan.sampled))
        if all_greedy([s.request for s in sampling]) and not any(
            s.request.grammar is not None for s in sampling
        ):
            return verify_greedy(logits, chains)  # no tensors
        rows = [(s.request, ids[:j]) for s, ids in zip(sampling, chains, strict=True)
                for j in range(len(ids) + 1)]  # fmt: skip
        t = sampling_tensors(rows, logits.shape[-1], logits.device)
        return verify(
            logits,
            chains,
            drafts.probs,
            t,
            [noise_key(s.request) for s in sampling],
            self.generator,
        )

    @staticmethod
    def logprobs(
        logits: torch.Tensor, plan: Schedule, drafts: StepDrafts, verdict: Verdict
    ) -> list[list[TokenLogprobs] | None]:
        """Per sampling request that asks for logprobs, those of its emitted tokens under the
        target: each token is scored by the row that predicted it (the chunk's last token for
        the first, then each accepted draft's row), so speculation reports exactly what plain
        decoding would. None for requests that do not ask."""
        out: list[list[TokenLogprobs] | None] = []
        first = 0  # the request's first logits row
        for i, (s, ids) in enumerate(zip(plan.sampling, drafts.rows(plan.sampled), strict=True)):
            num_top = s.request.params.logprobs
            if num_top is None:
                out.append(None)
            else:
                rows = [first] + [first + 1 + d for d in verdict.accepted_drafts(i)]
                out.append(token_logprobs(logits[rows], verdict.token_ids[i], num_top))
            first += 1 + len(ids)
        return out

    def _verify_trees(
        self, logits: torch.Tensor, sampling: list[ScheduledRequest], chains: list[list[int]],
        given: list[DraftTree | None],
    ) -> Verdict:  # fmt: skip
        trees = [tree or DraftTree.chain(ids) for ids, tree in zip(chains, given, strict=True)]
        rows = [(s.request, h) for s, tree in zip(sampling, trees, strict=True)
                for h in tree.row_histories()]  # fmt: skip
        t = sampling_tensors(rows, logits.shape[-1], logits.device)
        verdict = verify_tree(
            logits, trees, t, [noise_key(s.request) for s in sampling], self.generator
        )
        self._keep_paths(sampling, [verdict.accepted_drafts(i) for i in range(len(sampling))])
        return verdict

    def _keep_paths(self, sampling: list[ScheduledRequest], paths: list[list[int]]) -> None:
        """Copy each accepted path's KV from its nodes' slots to the consecutive slots after
        the verified token, where the next step expects it (the rest is rolled back)."""
        src: list[int] = []
        dst: list[int] = []
        for s, path in zip(sampling, paths, strict=True):
            first = len(s.token_ids)  # slot index of draft node 0
            for depth, node in enumerate(path):
                if node != depth:
                    src.append(s.slots[first + node])
                    dst.append(s.slots[first + depth])
        if src:
            device = self.target.model.device
            self.target.kv.copy_slots(torch.tensor(src, device=device),
                                      torch.tensor(dst, device=device))  # fmt: skip


def token_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], num_top: int
) -> list[TokenLogprobs]:
    """Log-softmax of each row of logits [n, vocab] at token_ids[n], with the num_top likeliest.

    >>> [round(t.logprob, 3) for t in token_logprobs(torch.tensor([[0.0, 0.0]]), [1], 0)]
    [-0.693]
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, vocab]
    ids = torch.tensor(list(token_ids), device=logits.device)  # [n]
    chosen = logp.gather(1, ids[:, None])[:, 0].tolist()  # [n]
    top_values, top_ids = logp.topk(num_top, dim=-1)  # [n, num_top] each
    return [
        TokenLogprobs(token, value, list(zip(tid, tv, strict=True)))
        for token, value, tid, tv in zip(
            token_ids, chosen, top_ids.tolist(), top_values.tolist(), strict=True
        )
    ]
