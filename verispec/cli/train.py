"""`verispec train`: a stage of the embedded pair's recipe, or an EAGLE or Medusa head trained
for any target (resumable)."""

from __future__ import annotations

import argparse

from verispec.drafters.registry import head_method_names

HEAD_KINDS = head_method_names()  # verispec train eagle|medusa: a head of that method
HEAD_OPTIONS = ("target", "prompts", "num_prompts", "max_tokens", "steps", "draft_vocab",
                "batch_size", "only", "device", "format")  # fmt: skip


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """The `train` subcommand's options: a stage of the embedded recipe, or a head's."""
    from verispec.train.head_recipe import HEAD_FORMATS, HEAD_STAGES
    from verispec.train.recipe import STAGES

    train = sub.add_parser(
        "train", help="train the embedded models, or an EAGLE head for any target",
        description="STAGE of the embedded pair's recipe (tokenizer, target, draft distilled "
        f"from the target, export, eval; 'all' in order), or {' / '.join(HEAD_KINDS)}: a "
        "drafter head for --target trained on the target's own responses (data, train, "
        "export; resumable).",
    )  # fmt: skip
    train.add_argument("stage", choices=(*STAGES, "all", *HEAD_KINDS),
                       help="stage to run ('all': in order; eagle, medusa: a head)")  # fmt: skip
    train.add_argument("--out", required=True, help="run directory (checkpoints, exports)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out (keep finished stages)")  # fmt: skip
    train.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")
    head = train.add_argument_group("eagle and medusa options")
    head.add_argument("--target", help="the model the head drafts for (name, directory, .gguf)")
    head.add_argument("--prompts", choices=("chat", "code"), default=None,
                      help="prompt set (default: chat for a model with a chat template)")
    head.add_argument("--num-prompts", type=int, default=None, help="training prompts")
    head.add_argument("--max-tokens", type=int, default=None, help="tokens per response")
    head.add_argument("--steps", type=int, default=None, help="training steps")
    head.add_argument("--batch-size", type=int, default=None, help="sequences per step")
    head.add_argument("--only", choices=HEAD_STAGES, default=None,
                      help="run only this stage of the head recipe (default: all, in order)")
    head.add_argument("--device", default=None,
                      help="where the target and head run: cpu (default), cuda, cuda:N, auto")
    head.add_argument("--draft-vocab", type=int, default=None,
                      help="draft vocabulary size (the target's most frequent output tokens)")
    head.add_argument("--format", choices=HEAD_FORMATS, default=None,
                      help="layout of the exported EAGLE head: eagle3 (default; vLLM and "
                      "SGLang's EAGLE-3 layout) or speculators (the speculators package's, "
                      "vLLM's standard for speculator checkpoints)")  # fmt: skip


def run_train(args: argparse.Namespace) -> int:
    """Run the stage asked for ('all': every stage, keeping those already done)."""
    from pathlib import Path

    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.stage in HEAD_KINDS:
        return _train_head(args)
    from verispec.train.recipe import STAGES, Recipe, run_stage

    given = [f"--{n.replace('_', '-')}" for n in HEAD_OPTIONS if getattr(args, n) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} apply to 'verispec train eagle|medusa' only")
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        # 'all' keeps stages that are already done, so it can be rerun after an interruption
        run_stage(stage, Path(args.out), Recipe(), resume=args.resume or args.stage == "all")
    return 0


def _train_head(args: argparse.Namespace) -> int:
    """verispec train eagle|medusa: every stage of the head recipe, resumable."""
    from dataclasses import replace
    from pathlib import Path

    from verispec.train.head_recipe import HEAD_STAGES, recipe_for

    if not args.target:
        raise ValueError(f"verispec train {args.stage} needs --target (the model the head "
                         "drafts for)")  # fmt: skip
    recipe = recipe_for(args.target, args.stage, args.prompts)
    if args.num_prompts is not None:
        recipe.num_prompts = _at_least_one("--num-prompts", args.num_prompts)
    if args.max_tokens is not None:
        recipe.max_tokens = _at_least_one("--max-tokens", args.max_tokens)
    if args.draft_vocab is not None:
        recipe.draft_vocab_size = _at_least_one("--draft-vocab", args.draft_vocab)
    if args.steps is not None:
        recipe.train = replace(recipe.train, steps=_at_least_one("--steps", args.steps))
    if args.batch_size is not None:
        size = _at_least_one("--batch-size", args.batch_size)
        recipe.train = replace(recipe.train, batch_size=size)
    from verispec.train.head_recipe import run_head_stage

    settings = {"device": args.device or "cpu", "head_format": args.format or "eagle3"}
    if args.only is not None:  # one stage continues a run
        run_head_stage(args.only, Path(args.out), recipe, resume=True, **settings)
        return 0
    for i, stage in enumerate(HEAD_STAGES):  # later stages continue what the first began
        run_head_stage(stage, Path(args.out), recipe, resume=args.resume or i > 0, **settings)
    return 0


def _at_least_one(flag: str, value: int) -> int:
    """value, when it is at least 1; a ValueError naming the flag otherwise."""
    if value < 1:
        raise ValueError(f"{flag} must be >= 1, got {value}")
    return value
