"""The recipe that trains verispec's embedded models from scratch: tokenizer, target, draft.

A run directory holds every stage's output, so each stage can be resumed or rerun alone:

    RUN/tokenizer/          tokenizer.json (+ config)
    RUN/tokens/{train,heldout}.pt   token streams of the two corpus splits
    RUN/target/checkpoint.pt        target training state
    RUN/draft/checkpoint.pt         draft distillation state
    RUN/export/{target,draft}/      Hugging Face checkpoints (fp16 safetensors)
    RUN/export/eval.json            held-out losses, acceptance, samples, training times
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedModel,
        PreTrainedTokenizerBase,
    )

from verispec.data.corpus import corpus_files, read_texts, tokenize_files
from verispec.train.prompts import build_prompts, spread
from verispec.train.tokenizer import save_tokenizer, train_bpe_tokenizer
from verispec.train.trainer import (
    TrainConfig,
    distillation_objective,
    heldout_loss,
    language_model_objective,
    load_trained,
    read_checkpoint,
    train,
)

STAGES = ("tokenizer", "target", "draft", "export", "eval")


@dataclass
class ModelShape:
    """Size of a Llama-architecture model."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    context_length: int = 1024

    def llama_config(self, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.context_length, rope_theta=10000.0,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
        )  # fmt: skip


@dataclass
class Recipe:
    """Everything that determines the embedded pair (change it and the weights change)."""

    vocab_size: int = 8192
    target: ModelShape = field(default_factory=lambda: ModelShape(512, 1408, 6, 8, 4))
    draft: ModelShape = field(default_factory=lambda: ModelShape(512, 1408, 2, 8, 4))
    draft_init_layers: tuple[int, ...] | None = (0, 5)
    """Target layers copied into the draft's layers before distillation (with the embeddings
    and final norm); None = a random draft. Needs equal widths."""
    target_train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=1200, seed=1))
    draft_train: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=800, seed=2, lr=1e-3, warmup_steps=30)
    )
    seed: int = 0  # weight initialisation
    corpus_root: str | None = None  # None = the running interpreter's standard library
    eval_prompts: int = 32  # held-out code-completion prompts for the acceptance figure
    eval_max_tokens: int = 128
    eval_k: int = 4

    def files(self, split: str) -> list[Path]:
        """The corpus files of a split ("train" or "heldout")."""
        return corpus_files(split, Path(self.corpus_root) if self.corpus_root else None)


def run_stage(
    stage: str, run_dir: Path, recipe: Recipe, resume: bool, progress: bool = True
) -> None:
    """Run one stage of the recipe (one of STAGES) in run_dir."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}; got {stage!r}")
    stages = {
        "tokenizer": _tokenizer, "target": _target, "draft": _draft, "export": _export,
        "eval": _eval,
    }  # fmt: skip
    stages[stage](run_dir, recipe, resume, progress)


def _log(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def _tokenizer(run_dir: Path, recipe: Recipe, resume: bool, progress: bool) -> None:
    out = run_dir / "tokenizer"
    if (out / "tokenizer.json").is_file() and resume:
        _log(progress, f"tokenizer: {out} exists, kept")
    else:
        if (out / "tokenizer.json").is_file():
            raise ValueError(f"{out} already holds a tokenizer; pass --resume to keep it")
        files = recipe.files("train")
        _log(progress, f"tokenizer: training a {recipe.vocab_size}-token BPE on {len(files)} files")
        tokenizer = train_bpe_tokenizer(read_texts(files), recipe.vocab_size)
        save_tokenizer(tokenizer, out)
    tokenizer = load_tokenizer(run_dir)
    (run_dir / "tokens").mkdir(exist_ok=True)
    for split in ("train", "heldout"):
        path = run_dir / "tokens" / f"{split}.pt"
        if path.is_file() and resume:
            continue
        stream = tokenize_files(tokenizer, recipe.files(split))
        torch.save({"tokens": stream.tokens, "num_documents": stream.num_documents}, path)
        _log(
            progress,
            f"tokens/{split}: {stream.num_documents} files, {stream.tokens.numel():,} tokens",
        )


def load_tokenizer(run_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved by the tokenizer stage."""
    if not (run_dir / "tokenizer" / "tokenizer.json").is_file():
        raise ValueError(f"no tokenizer in {run_dir / 'tokenizer'}; run the tokenizer stage first")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(run_dir / "tokenizer"))


def load_tokens(run_dir: Path, split: str) -> torch.Tensor:
    """The token stream of a split saved by the tokenizer stage: [num_tokens] int32."""
    path = run_dir / "tokens" / f"{split}.pt"
    if not path.is_file():
        raise ValueError(f"{path} is missing; run the tokenizer stage first")
    return torch.load(path, weights_only=True)["tokens"]


def build_model(
    shape: ModelShape, tokenizer: PreTrainedTokenizerBase, seed: int
) -> LlamaForCausalLM:
    """A freshly initialised transformers LlamaForCausalLM of this shape."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(shape.llama_config(tokenizer))


def _target(run_dir: Path, recipe: Recipe, resume: bool, progress: bool) -> None:
    tokenizer = load_tokenizer(run_dir)
    model = build_model(recipe.target, tokenizer, recipe.seed)
    n = sum(p.numel() for p in model.parameters())
    _log(progress, f"target: {n / 1e6:.1f}M parameters, {recipe.target_train.steps} steps")
    train(
        model, load_tokens(run_dir, "train"), recipe.target_train, run_dir / "target",
        language_model_objective(), resume=resume, progress=progress, desc="target",
    )  # fmt: skip


def load_stage_model(run_dir: Path, recipe: Recipe, which: str) -> LlamaForCausalLM:
    """The target or draft model with its latest checkpoint's weights."""
    tokenizer = load_tokenizer(run_dir)
    model = build_model(getattr(recipe, which), tokenizer, recipe.seed)
    if not (run_dir / which / "checkpoint.pt").is_file():
        raise ValueError(f"no {which} checkpoint in {run_dir / which}; run the {which} stage first")
    load_trained(model, run_dir / which)
    return model


def _draft(run_dir: Path, recipe: Recipe, resume: bool, progress: bool) -> None:
    tokenizer = load_tokenizer(run_dir)
    teacher = load_stage_model(run_dir, recipe, "target")
    model = build_model(recipe.draft, tokenizer, recipe.seed + 1)
    if recipe.draft_init_layers is not None:
        init_from_target(model, teacher, recipe.draft_init_layers)
    n = sum(p.numel() for p in model.parameters())
    _log(progress, f"draft: {n / 1e6:.1f}M parameters, distilled from the target")
    train(
        model, load_tokens(run_dir, "train"), recipe.draft_train, run_dir / "draft",
        distillation_objective(teacher), resume=resume, progress=progress, desc="draft",
    )  # fmt: skip


def init_from_target(
    draft: LlamaForCausalLM, target: LlamaForCausalLM, layers: tuple[int, ...]
) -> None:
    """Copy the target's embeddings, final norm and the given layers into the draft's layers.

    E.g. layers=(0, 5) makes a 2-layer draft start as the target with layers 1-4 skipped, a
    better starting point for distillation than random weights.
    """
    if len(layers) != draft.config.num_hidden_layers:
        raise ValueError(
            f"draft_init_layers names {len(layers)} layers; the draft has "
            f"{draft.config.num_hidden_layers}"
        )
    if draft.config.hidden_size != target.config.hidden_size or not all(
        0 <= i < target.config.num_hidden_layers for i in layers
    ):
        raise ValueError(
            f"cannot initialise the draft from target layers {layers}: widths "
            f"{draft.config.hidden_size} vs {target.config.hidden_size}, target has "
            f"{target.config.num_hidden_layers} layers"
        )
    with torch.no_grad():
        draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
        for mine, theirs in zip(draft.model.layers, layers, strict=True):
            mine.load_state_dict(target.model.layers[theirs].state_dict())


def _export(run_dir: Path, recipe: Recipe, resume: bool, progress: bool) -> None:
    for which in ("target", "draft"):
        out = run_dir / "export" / which
        export_checkpoint(load_stage_model(run_dir, recipe, which), load_tokenizer(run_dir), out)
        _log(progress, f"export: {out}")
    (run_dir / "export" / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2) + "\n")


def export_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    dtype: torch.dtype = torch.float16,
) -> None:
    """Write a Hugging Face checkpoint (config, safetensors in `dtype`, tokenizer) atomically."""
    from transformers import GenerationConfig

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(dtype).save_pretrained(str(tmp))
    config = model.config
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(tmp))  # fmt: skip
    save_tokenizer(tokenizer, tmp)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)


def _eval(run_dir: Path, recipe: Recipe, resume: bool, progress: bool) -> None:
    """Measure the exported pair: held-out losses, greedy acceptance, three samples."""
    export = run_dir / "export"
    report = evaluate_pair(
        export / "target", export / "draft", recipe, load_tokens(run_dir, "heldout")
    )
    for which in ("target", "draft"):
        state = read_checkpoint(run_dir / which / "checkpoint.pt")["state"]
        last = state["losses"][-50:]
        report[which]["train_steps"] = state["step"]
        report[which]["train_minutes"] = round(state["seconds"] / 60, 1)
        report[which]["final_train_loss"] = sum(last) / len(last)
    (export / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    _log(progress, json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))


def evaluate_pair(
    target: Path, draft: Path, recipe: Recipe, heldout: torch.Tensor
) -> dict[str, Any]:
    """Held-out loss of both checkpoints (fp32) and greedy acceptance of the draft.

    Acceptance uses the `code` workload's prompts built from the held-out modules (those that
    fit the context with their output; with the default recipe, the shipped code.jsonl),
    recipe.eval_max_tokens tokens each, temperature 0, k = recipe.eval_k.
    """
    from transformers import AutoModelForCausalLM

    from verispec import LLM, SamplingParams, SpecConfig
    from verispec.types.stats import SpecStats

    report: dict[str, Any] = {}
    for name, path in (("target", target), ("draft", draft)):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        report[name] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "heldout_loss": heldout_loss(model, heldout, model.config.max_position_embeddings),
            "heldout_tokens": heldout.numel(),
        }
    llm = LLM(
        model=str(target), dtype="float32",
        speculative=SpecConfig(model=str(draft), num_speculative_tokens=recipe.eval_k),
    )  # fmt: skip
    room = llm.engine.max_model_len - recipe.eval_max_tokens  # prompts that fit with their output
    prompts = build_prompts(
        "code", recipe.files("heldout"), recipe.eval_prompts,
        fits=lambda text: len(llm.tokenizer(text).input_ids) <= room,
    )  # fmt: skip
    if not prompts:
        raise ValueError(f"no held-out prompt fits in {room} tokens; raise the context length")
    params = SamplingParams(temperature=0.0, max_tokens=recipe.eval_max_tokens)
    outputs = llm.generate([p.text for p in prompts], params)
    stats = SpecStats()
    for out in outputs:
        stats.merge(out.metrics.spec)
    report["acceptance"] = {
        "k": recipe.eval_k, "temperature": 0.0, "prompts": len(prompts),
        "max_tokens": recipe.eval_max_tokens, **stats.to_dict(),
    }  # fmt: skip
    pairs = list(zip(prompts, outputs, strict=True))
    report["samples"] = [
        {"id": p.id, "prompt": p.text, "completion": o.text} for p, o in spread(pairs, 3)
    ]
    return report
