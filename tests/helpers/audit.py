"""Shared by the audit tests (`verispec verify` and its server check): a sharp target with a
noisy draft, broken verifiers the audit must catch, and prompt files."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from verispec.sample.rejection import Verdict

HEAD_SCALE = 25.0  # top token 0.3-0.7 after the audit's prompts: cells with counts, at 800 samples


def make_sharp_pair(
    factory: pytest.TempPathFactory, name: str, tokenizer, noise: float
) -> tuple[Path, Path]:
    """(target, draft) directories: a tiny Llama (layers x8) whose output layer is scaled by
    HEAD_SCALE, and a copy with `noise` std of noise per matrix."""
    target, draft = factory.mktemp(f"{name}-target"), factory.mktemp(f"{name}-draft")
    model = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.save_pretrained(str(target))
    make_perturbed_copy(draft, model, tokenizer, noise=noise)
    return target, draft


def accept_every_greedy_draft(logits: torch.Tensor, drafts: list[list[int]]) -> Verdict:
    """Broken verify_greedy (what the engine's runner calls for greedy requests): every draft
    is accepted, then the argmax after the last one is emitted."""
    target, start, token_ids = logits.argmax(dim=1).tolist(), 0, []
    for d in drafts:
        token_ids.append([*d, target[start + len(d)]])
        start += len(d) + 1
    return Verdict(token_ids=token_ids, num_accepted=[len(d) for d in drafts])


def keep_every_draft(drafts: list[list[int]], target: list[int]) -> Verdict:
    """Broken rejection._keep_matching (the coupled rule seeded requests are verified by): every
    draft is kept, then the token of the row after them (target [R], len(d) + 1 rows each)."""
    start, token_ids = 0, []
    for d in drafts:
        token_ids.append([*d, target[start + len(d)]])
        start += len(d) + 1
    return Verdict(token_ids=token_ids, num_accepted=[len(d) for d in drafts])


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    """A prompts file as `verispec verify --prompts` reads it: one JSON object a line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
