"""A small, resumable training loop for Llama-architecture models on one token stream.

Every step's batch is a pure function of (seed, step), so a run resumed from a checkpoint sees
exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainConfig:
    """Optimisation settings of one run (AdamW, linear warm-up then cosine decay)."""

    steps: int
    batch_size: int = 4
    seq_len: int = 1024
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    bf16: bool = True  # autocast matmuls to bfloat16 (weights and optimiser stay fp32)
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def lr_at(self, step: int) -> float:
        """Learning rate for 0-based `step`: e.g. lr=1, warmup 10, steps 110 -> 0.1 at step 0."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass
class TrainState:
    """What a checkpoint holds besides the weights and optimiser."""

    step: int = 0
    losses: list[float] = field(default_factory=list)  # mean loss per step
    seconds: float = 0.0  # wall time spent training, summed over resumed runs


def batch_at(tokens: torch.Tensor, step: int, config: TrainConfig) -> torch.Tensor:
    """Random windows of seq_len + 1 tokens for `step`: [batch_size, seq_len + 1] int64.

    E.g. tokens of length 10_000, seq_len 1024: each row is tokens[s : s + 1025] for a start s
    drawn from a generator seeded by (seed, step).
    """
    if tokens.numel() < config.seq_len + 2:
        raise ValueError(f"corpus has {tokens.numel()} tokens; need more than seq_len + 1")
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    starts = torch.randint(
        0, tokens.numel() - config.seq_len - 1, (config.batch_size,), generator=gen
    )
    offsets = torch.arange(config.seq_len + 1)
    return tokens[starts[:, None] + offsets].long()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy; logits [B, T, V], targets [B, T]."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Forward KL(teacher || student) per token, averaged; both [B, T, V]."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def language_model_objective() -> LossFn:
    """Next-token prediction on the batch."""

    def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=batch[:, :-1]).logits  # [B, T, V]
        return lm_loss(logits, batch[:, 1:])

    return loss


def distillation_objective(teacher: torch.nn.Module) -> LossFn:
    """Match the teacher's next-token distribution at every position of the batch."""
    teacher.eval().requires_grad_(False)

    def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = teacher(input_ids=batch[:, :-1]).logits  # [B, T, V]
        return distill_loss(model(input_ids=batch[:, :-1]).logits, teacher_logits)

    return loss


def train(
    model: torch.nn.Module,
    data: torch.Tensor | Callable[[int], Any],
    config: TrainConfig,
    run_dir: Path,
    objective: LossFn,
    resume: bool = False,
    progress: bool = True,
    desc: str = "train",
    device: torch.device | None = None,
) -> TrainState:
    """Train `model` in place for config.steps steps, checkpointing into run_dir. data is a
    token stream (random windows per step: batch_at) or a function step -> batch that, like
    batch_at, returns the same batch for the same step.

    With resume=True an existing checkpoint is continued (its settings must match); without it an
    existing checkpoint is an error, so no run is overwritten by accident. device: where the
    model and each batch go (default: where the model is).
    """
    import time

    run_dir.mkdir(parents=True, exist_ok=True)
    if device is not None:
        model.to(device)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay
    )
    state = _restore(model, optimizer, config, run_dir / CHECKPOINT, resume)
    model.train()
    bar = tqdm(
        total=config.steps, initial=state.step, desc=desc, disable=not progress,
        unit="step", file=sys.stderr, dynamic_ncols=True,
    )  # fmt: skip
    while state.step < config.steps:
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(state.step)
        batch = data(state.step) if callable(data) else batch_at(data, state.step, config)
        batch = to_device(batch, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16):
            loss = objective(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.losses.append(loss.item())
        state.step += 1
        state.seconds += time.perf_counter() - started
        recent = state.losses[-20:]
        bar.set_postfix(
            loss=f"{sum(recent) / len(recent):.3f}", lr=f"{config.lr_at(state.step):.1e}"
        )
        bar.update(1)
        if state.step % config.checkpoint_every == 0 or state.step == config.steps:
            _save(model, optimizer, config, state, run_dir / CHECKPOINT)
    bar.close()
    return state


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch (a tensor, or a dict of tensors and plain values) with its tensors on device."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def _save(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    state: TrainState,
    path: Path,
) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
         "config": asdict(config), "state": asdict(state)},
        tmp,
    )  # fmt: skip
    os.replace(tmp, path)


def _restore(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    path: Path,
    resume: bool,
) -> TrainState:
    if not path.is_file():
        return TrainState()
    saved = read_checkpoint(path)
    if not resume:
        raise ValueError(
            f"{path} already holds a run at step {saved['state']['step']}; pass --resume to "
            "continue it or choose another --out directory"
        )
    if saved["config"] != asdict(config):
        changed = sorted(k for k, v in asdict(config).items() if saved["config"].get(k) != v)
        raise ValueError(f"cannot resume {path}: settings differ from the saved run ({changed})")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return TrainState(**saved["state"])


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A saved run (tensors and plain values only); a file torch cannot read, or one without
    the parts a checkpoint has, is reported as corrupt rather than as a pickling error."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
        raise ValueError(
            f"checkpoint {path} is corrupt or truncated ({type(e).__name__}); delete it to "
            "restart that stage, or restore it from a backup"
        ) from e
    if not isinstance(saved, dict) or not {"model", "state"} <= saved.keys():
        raise ValueError(f"checkpoint {path} is corrupt: it lacks the model or state entries")
    return saved


def load_trained(model: torch.nn.Module, run_dir: Path) -> TrainState:
    """Load the weights of a finished or partial run; returns its state."""
    saved = read_checkpoint(run_dir / CHECKPOINT)
    model.load_state_dict(saved["model"])
    return TrainState(**saved["state"])


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module, tokens: torch.Tensor, seq_len: int, max_windows: int | None = None
) -> float:
    """Mean per-token cross entropy (nats) over non-overlapping windows of a token stream."""
    model.eval()
    total, count = 0.0, 0
    n_windows = (tokens.numel() - 1) // seq_len
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    for i in range(n_windows):
        window = tokens[i * seq_len : (i + 1) * seq_len + 1].long()[None]  # [1, seq_len + 1]
        logits = model(input_ids=window[:, :-1]).logits
        total += lm_loss(logits, window[:, 1:]).item() * seq_len
        count += seq_len
    return total / max(count, 1)
