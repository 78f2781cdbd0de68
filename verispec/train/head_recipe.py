"""The recipe that trains an EAGLE-3 head for a target on the target's own outputs.

A run directory holds every stage's output, so each stage resumes where it stopped:

    RUN/recipe.json                   the settings (a resumed run must keep them)
    RUN/responses/{greedy,sampled}/   the target's responses to the training prompts
    RUN/features/                     the target's features and top-k distributions on them
    RUN/heldout/                      the same for held-out prompts (evaluation)
    RUN/head/checkpoint.pt            training state (--resume continues it)
    RUN/export/                       the head (fp16 safetensors + config.json) and eval.json

An EAGLE head is exported in the EAGLE-3 layout, or in the speculators package's (vLLM's
standard for speculator checkpoints) when asked: the format is not part of the recipe, so one
trained head can be exported in either.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from verispec.api.llm import LLM
from verispec.data.corpus import corpus_files
from verispec.drafters.registry import HEAD_METHOD, head_method_names, method
from verispec.models.config import ModelConfig
from verispec.models.eagle import EagleConfig, save_eagle_head
from verispec.models.medusa import MedusaConfig, save_medusa_heads
from verispec.models.paged import PagedModel
from verispec.models.speculators import SpeculatorsMeta
from verispec.models.weights.loader import load_model, resolve_device, resolve_model_path
from verispec.tokenizer import Tokenizer
from verispec.train.distill import (
    extract_features,
    generate_responses,
    load_features,
    read_responses,
    token_frequencies,
)
from verispec.train.eagle import TrainableEagle, head_loss, soft_targets
from verispec.train.instructions import chat_instructions, chat_prompt_ids
from verispec.train.medusa import TrainableMedusa, medusa_loss
from verispec.train.prompts import build_prompts
from verispec.train.trainer import LossFn, TrainConfig, load_trained, to_device, train
from verispec.types.sampling_params import SamplingParams

HEAD_STAGES = ("data", "train", "export")
HEAD_FORMATS = ("eagle3", "speculators")
"""Layouts of an exported EAGLE head: EAGLE-3's (vLLM, SGLang) or the speculators package's."""
CPU = torch.device("cpu")


@dataclass
class HeadRecipe:
    """Everything that determines a trained head (change it and the weights change)."""

    target: str
    kind: str = HEAD_METHOD
    """eagle (one EAGLE-3 layer over fused features) or medusa (residual heads)."""
    medusa_heads: int = 4
    prompts: str = "chat"
    """Prompt set: chat (instructions in the chat template) or code (source-file prompts)."""
    num_prompts: int = 1024
    num_heldout: int = 32
    max_tokens: int = 256
    sampled_fraction: float = 0.5
    """Share of prompts answered by sampling (T 1, top-p 0.95) instead of greedily."""
    draft_vocab_size: int = 8192
    feature_layers: tuple[int, ...] | None = None
    top_k: int = 32
    """Target probabilities kept per position (the soft labels)."""
    depths: int = 3
    """Draft depths unrolled in training (EAGLE-3's training-time test)."""
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=2000, batch_size=8, seq_len=512, lr=1e-3,
                                            warmup_steps=50, weight_decay=0.0, checkpoint_every=50)
    )  # fmt: skip
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prompts not in ("chat", "code"):
            raise ValueError(f"prompts must be chat or code, got {self.prompts!r}")
        if self.kind not in head_method_names():
            raise ValueError(f"kind must be one of {', '.join(head_method_names())}, got "
                             f"{self.kind!r}")  # fmt: skip
        if isinstance(self.train, dict):
            self.train = TrainConfig(**self.train)
        if self.feature_layers is not None:
            self.feature_layers = tuple(self.feature_layers)


def recipe_for(target: str, kind: str = HEAD_METHOD, prompts: str | None = None) -> HeadRecipe:
    """The default recipe for a target: chat prompts for a model with a chat template (the
    default SmolLM2), source-file prompts for a code model (the embedded one)."""
    if prompts is None:
        tokenizer = Tokenizer(resolve_model_path(target))
        prompts = "chat" if tokenizer.chat_template else "code"
    if prompts == "code":
        return HeadRecipe(target=target, kind=kind, prompts="code", num_prompts=1024,
                          draft_vocab_size=4096)  # fmt: skip
    return HeadRecipe(target=target, kind=kind, prompts="chat")


def run_head_stage(stage: str, run_dir: Path, recipe: HeadRecipe, resume: bool,
                   progress: bool = True, device: str = "cpu",
                   head_format: str = "eagle3") -> None:  # fmt: skip
    """Run one stage (one of HEAD_STAGES) in run_dir. device (cpu, cuda, cuda:N or auto) runs
    the target (data) and the head (train) there; the export and its evaluation run on the CPU.
    head_format (one of HEAD_FORMATS) is the export's layout. Neither enters the recipe: a run
    may continue on another device, and its head be exported again in another layout."""
    if stage not in HEAD_STAGES:
        raise ValueError(f"stage must be one of {', '.join(HEAD_STAGES)}; got {stage!r}")
    check_head_format(head_format, recipe)
    where = resolve_device(device)
    _check_recipe(run_dir, recipe, resume)
    export = partial(_export, head_format=head_format)
    {"data": _data, "train": _train, "export": export}[stage](run_dir, recipe, progress, where)


def check_head_format(head_format: str, recipe: HeadRecipe) -> None:
    """The format must be one of HEAD_FORMATS, and the speculators one is for EAGLE heads."""
    if head_format not in HEAD_FORMATS:
        raise ValueError(f"head format must be one of {', '.join(HEAD_FORMATS)}; got "
                         f"{head_format!r}")  # fmt: skip
    if head_format == "speculators" and not fuses_features(recipe):
        raise ValueError(f"the speculators format holds EAGLE-3 heads; {recipe.kind} heads are "
                         "written in their own layout (leave out --format)")  # fmt: skip


def _check_recipe(run_dir: Path, recipe: HeadRecipe, resume: bool) -> None:
    """The run directory keeps its recipe; another recipe in it is an error."""
    path = run_dir / "recipe.json"
    mine = json.loads(json.dumps(asdict(recipe)))
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved != mine:
            changed = sorted(k for k in mine if saved.get(k) != mine[k])
            raise ValueError(f"{run_dir} holds a run with other settings ({changed}); use "
                             "another --out directory")  # fmt: skip
        if not resume and (run_dir / "head").exists():
            raise ValueError(f"{run_dir} already holds a run; pass --resume to continue it")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=2) + "\n")


def _log(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def training_prompts(recipe: HeadRecipe, llm: LLM, split: str) -> list[list[int]]:
    """Token-id prompts of a split ("train" or "heldout") for the recipe's prompt set."""
    n = recipe.num_prompts if split == "train" else recipe.num_heldout
    if recipe.prompts == "chat":
        texts = chat_instructions(split)
        step = max(1, len(texts) // n)
        return chat_prompt_ids(llm.tokenizer, texts[::step][:n])
    encode = llm.engine.tokenizer.encode
    room = llm.engine.max_model_len - recipe.max_tokens  # prompt tokens that leave room to answer
    prompts = build_prompts("code", corpus_files(split), n, fits=lambda t: len(encode(t)) <= room)
    return [encode(p.text) for p in prompts]


def _data(run_dir: Path, recipe: HeadRecipe, progress: bool, device: torch.device) -> None:
    """Responses (greedy and sampled) and features, for the training and held-out prompts.
    The target runs in float32 on any device; an accelerator batches wider (256 sequences
    sharing a KV cache of 256 x 2048 tokens: GPU memory is allocated up front)."""
    wide = device.type != "cpu"
    llm = LLM(model=recipe.target, speculative=None, dtype="float32", device=str(device),
              max_num_seqs=256 if wide else 32, num_blocks=256 * 128 if wide else None,
              max_num_batched_tokens=4096 if wide else 512, seed=recipe.seed)  # fmt: skip
    layers = stored_layers(recipe, llm.engine.model.config)
    paged = PagedModel(llm.engine.model, num_blocks=2048 if wide else 256, block_size=16)
    shard, batch_tokens = (256, 16384) if wide else (64, 2048)  # prompts/generate, tokens/forward
    for split, out in (("train", run_dir), ("heldout", run_dir / "heldout")):
        prompts = training_prompts(recipe, llm, split)
        n_sampled = round(len(prompts) * recipe.sampled_fraction)
        greedy = SamplingParams(temperature=0, max_tokens=recipe.max_tokens)
        sampled = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=recipe.max_tokens,
                                 seed=recipe.seed)  # fmt: skip
        _log(progress, f"{split}: {len(prompts)} prompts ({n_sampled} sampled)")
        paths = generate_responses(llm, prompts[n_sampled:], out / "responses" / "greedy",
                                   greedy, shard, progress)  # fmt: skip
        if n_sampled:
            paths += generate_responses(llm, prompts[:n_sampled], out / "responses" / "sampled",
                                        sampled, shard, progress)  # fmt: skip
        extract_features(paged, read_responses(paths), layers, recipe.top_k, out / "features",
                         progress=progress, max_batch_tokens=batch_tokens)  # fmt: skip


def stored_layers(recipe: HeadRecipe, target: ModelConfig) -> tuple[int, ...]:
    """Target residual streams the data stage stores: the EAGLE head's (first, in its order),
    then the last layer's output, which Medusa heads read (one data set serves both)."""
    eagle = EagleConfig.for_target(target, recipe.draft_vocab_size, recipe.feature_layers)
    last = () if target.num_layers in eagle.feature_layers else (target.num_layers,)
    return (*eagle.feature_layers, *last)


def head_columns(recipe: HeadRecipe, target: ModelConfig) -> slice:
    """The stored feature columns the recipe's head reads."""
    layers = stored_layers(recipe, target)
    h = target.hidden_size
    if not fuses_features(recipe):
        at = layers.index(target.num_layers)
        return slice(at * h, (at + 1) * h)
    n = len(EagleConfig.for_target(target, 1, recipe.feature_layers).feature_layers)
    return slice(0, n * h)


def _records(directory: Path, device: torch.device = CPU) -> list[dict[str, Any]]:
    """The feature records of a run (or its heldout/) directory, their tensors on device (on
    the CPU they stay memory-mapped: moving there is a no-op)."""
    paths = sorted((directory / "features").glob("features-*.pt"))
    if not paths:
        raise ValueError(f"no features in {directory / 'features'}; run the data stage first")
    return [to_device(r, device) for r in load_features(paths)]


def build_head(recipe: HeadRecipe, run_dir: Path) -> tuple[torch.nn.Module, slice, ModelConfig]:
    """A fresh head of the recipe's kind, the feature columns it reads and the target's
    config. Its draft vocabulary is the training responses' most frequent tokens; its LM head
    rows start as the target's rows of those tokens."""
    target = load_model(resolve_model_path(recipe.target), torch.float32, CPU,
                        "torch")  # fmt: skip
    examples = read_responses(sorted((run_dir / "responses").rglob("responses-*.jsonl")))
    counts = token_frequencies(examples, target.config.vocab_size)
    size = min(recipe.draft_vocab_size, target.config.vocab_size)
    ranked = torch.sort(counts, descending=True, stable=True).indices  # ties: lower id first
    draft_ids = ranked[:size].sort().values
    weight = target.lm_head.weight
    init = (weight if isinstance(weight, torch.Tensor) else target.embed)[draft_ids]
    columns = head_columns(recipe, target.config)
    torch.manual_seed(recipe.seed)
    if not fuses_features(recipe):
        config = MedusaConfig(recipe.medusa_heads, target.config.hidden_size,
                              target.config.vocab_size, size)  # fmt: skip
        heads = TrainableMedusa(config, target.final_norm, target.config.rms_norm_eps, draft_ids,
                                init)  # fmt: skip
        return heads, columns, target.config
    eagle = EagleConfig.for_target(target.config, size, recipe.feature_layers)
    head = TrainableEagle(eagle, target.embed, draft_ids, lm_head_init=init)
    return head, columns, target.config


def fuses_features(recipe: HeadRecipe) -> bool:
    """Whether the recipe's head reads several layers' features fused (EAGLE-3) rather than
    the last layer's output (Medusa residual heads): a trait of its method in the registry."""
    return method(recipe.kind).fuses_features


def batch_maker(
    records: list[dict[str, Any]], config: TrainConfig
) -> Callable[[int], dict[str, torch.Tensor]]:
    """step -> padded batch of config.batch_size sequences (windows of <= seq_len tokens),
    drawn from a generator seeded by (seed, step), so a resumed run sees the same batches."""

    def batch(step: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        picks = torch.randint(0, len(records), (config.batch_size,), generator=g).tolist()
        windows = []
        for i in picks:
            r = records[i]
            n = len(r["token_ids"])
            lo = int(torch.randint(0, max(1, n - config.seq_len) + 1, (1,), generator=g))
            lo = min(lo, max(0, n - config.seq_len))
            windows.append((r, lo, min(n, lo + config.seq_len)))
        return pad_windows(windows)

    return batch


def pad_windows(windows: list[tuple[dict[str, Any], int, int]]) -> dict[str, torch.Tensor]:
    """Stack record windows [lo, hi) into padded tensors (on the records' device); mask [B, T]
    marks the rows whose soft target (row t: the distribution of token t + 1) is of a response
    token, t < length."""
    t = max(hi - lo for _, lo, hi in windows)
    b = len(windows)
    first = windows[0][0]
    f, k = first["features"].shape[1], first["top_ids"].shape[1]
    on = first["features"].device
    ids = torch.zeros(b, t, dtype=torch.long, device=on)
    feats = torch.zeros(b, t, f, device=on)
    top_ids = torch.zeros(b, t, k, dtype=torch.long, device=on)
    top_probs = torch.zeros(b, t, k, device=on)
    mask = torch.zeros(b, t, dtype=torch.bool, device=on)
    rows = torch.arange(t, device=on)
    for i, (r, lo, hi) in enumerate(windows):
        n = hi - lo
        ids[i, :n] = r["token_ids"][lo:hi].long()
        feats[i, :n] = r["features"][lo:hi].float()
        top_ids[i, :n] = r["top_ids"][lo:hi].long()
        top_probs[i, :n] = r["top_probs"][lo:hi].float()
        mask[i] = (rows < n) & (lo + rows + 1 >= int(r["prompt_len"]))
    return {"token_ids": ids, "features": feats, "top_ids": top_ids, "top_probs": top_probs,
            "mask": mask}  # fmt: skip


def head_objective(recipe: HeadRecipe, columns: slice) -> LossFn:
    """The training loss of the recipe's head kind; columns: the stored feature columns it
    reads (EAGLE: its fused layers, first; Medusa: the last layer's output)."""

    def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        value, _ = head_scores(model, recipe, columns, batch)
        return value

    return loss


def head_scores(
    model: torch.nn.Module, recipe: HeadRecipe, columns: slice, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, list[float]]:
    """(loss, top-1 agreement per depth or head) of one batch."""
    ids, weights = soft_targets(model.get_buffer("to_draft"), batch["top_ids"],
                                batch["top_probs"])  # fmt: skip
    features = batch["features"][..., columns]
    if not fuses_features(recipe):
        return medusa_loss(model(features), ids, weights, batch["mask"])
    logits = model(batch["token_ids"], features, recipe.depths)
    return head_loss(logits, ids[:, 1:], weights[:, 1:], batch["mask"][:, 1:])


@torch.no_grad()
def evaluate_head(model: torch.nn.Module, recipe: HeadRecipe, columns: slice,
                  records: list[dict[str, Any]]) -> list[float]:  # fmt: skip
    """Top-1 agreement with the target per draft depth (or Medusa head) on held-out records."""
    model.eval()
    hits: list[float] = []
    total = 0.0
    for start in range(0, len(records), 8):
        batch = pad_windows([(r, 0, min(len(r["token_ids"]), recipe.train.seq_len))
                             for r in records[start : start + 8]])  # fmt: skip
        _, agree = head_scores(model, recipe, columns, batch)
        n = float(batch["mask"].sum())
        hits = [h + a * n for h, a in itertools.zip_longest(hits, agree, fillvalue=0.0)]
        total += n
    model.train()
    return [h / max(total, 1.0) for h in hits]


def _train(run_dir: Path, recipe: HeadRecipe, progress: bool, device: torch.device) -> None:
    records = _records(run_dir, device)
    model, columns, _ = build_head(recipe, run_dir)
    n = sum(p.numel() for p in model.parameters())
    tokens = sum(len(r["token_ids"]) for r in records)
    _log(progress, f"{recipe.kind}: {n / 1e6:.1f}M parameters; {len(records)} sequences, "
                   f"{tokens:,} tokens; {recipe.train.steps} steps")  # fmt: skip
    train(model, batch_maker(records, recipe.train), recipe.train, run_dir / "head",
          head_objective(recipe, columns), resume=True, progress=progress,
          desc=recipe.kind, device=device)  # fmt: skip


def _export(run_dir: Path, recipe: HeadRecipe, progress: bool, device: torch.device,
            head_format: str) -> None:  # fmt: skip
    model, columns, target = build_head(recipe, run_dir)
    state = load_trained(model, run_dir / "head")
    out = run_dir / "export"
    if not fuses_features(recipe):
        save_medusa_heads(model.config, model.state_for_export(), out)
    else:
        meta = None  # the speculators format names the target and the draft length trained for
        if head_format == "speculators":
            meta = SpeculatorsMeta(recipe.target, (target.architecture,), recipe.depths)
        save_eagle_head(model.config, model.state_for_export(), out, speculators=meta)
    started = time.perf_counter()
    agreement = evaluate_head(model, recipe, columns, _records(run_dir / "heldout"))
    report = {
        "kind": recipe.kind, "steps": state.step, "train_seconds": round(state.seconds),
        "final_loss": sum(state.losses[-50:]) / max(1, len(state.losses[-50:])),
        "heldout_top1_agreement": [round(a, 4) for a in agreement],
        "eval_seconds": round(time.perf_counter() - started),
    }  # fmt: skip
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    _log(progress, f"export: {out}; held-out top-1 agreement per depth/head {agreement}")
