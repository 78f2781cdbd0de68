"""Command line: `verispec generate PROMPT ...` (later: serve, bench, verify, train)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from verispec.config import SpecConfig
from verispec.drafters.registry import PLAIN, method_names, takes_draft_model
from verispec.models.quantization import QUANTIZATIONS

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="verispec", description="Lossless speculative decoding for large language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    gen.add_argument("prompt", help="prompt text")
    gen.add_argument("--model", default=None,
                     help="checkpoint directory or hub id (default: the embedded Python-code "
                     "model, decoded with its embedded draft)")  # fmt: skip
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate (64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1)")
    gen.add_argument("--top-k", type=int, default=-1, help="keep the k likeliest; -1 = off")
    gen.add_argument("--seed", type=int, default=None, help="seed for sampling")
    gen.add_argument("--dtype", default="auto", help="auto, float32, float16, bfloat16")
    gen.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    gen.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                     help="round the model's linear weights at load (output then follows the "
                     "rounded model)")  # fmt: skip
    spec = gen.add_argument_group(
        "speculative decoding (default: the embedded draft for the embedded model, else off)"
    )
    spec.add_argument("--draft", default=None, help="draft checkpoint directory or hub id")
    spec.add_argument("--method", choices=(PLAIN, *method_names()), default=None,
                      help=f"where drafts come from (--draft alone: its draft model; "
                      f"{PLAIN}: plain decoding)")  # fmt: skip
    spec.add_argument("--k", type=int, default=None, help="draft tokens per step (4)")
    spec.add_argument("--prompt-lookup-min", type=int, default=None, metavar="N",
                      help="shortest n-gram prompt lookup matches (2)")  # fmt: skip
    spec.add_argument("--prompt-lookup-max", type=int, default=None, metavar="N",
                      help="longest n-gram prompt lookup matches (4)")  # fmt: skip
    spec.add_argument(
        "--draft-quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="round the draft's linear weights (changes acceptance, never output)",
    )
    gen.add_argument("--batch-invariant", action="store_true",
                     help="logits independent of batch mates: speculative greedy output equals "
                     "plain greedy output bit for bit (slower)")  # fmt: skip
    _add_train_parser(sub)
    _add_bench_parser(sub)
    return parser


def _csv(kind: type) -> Any:
    """An argparse type for comma-separated values: '2,4,8' -> (2, 4, 8)."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__}s, got {text!r}"
            ) from None

    return parse


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="benchmark speculative decoding against plain decoding and transformers",
        description="Runs every configuration interleaved with plain decoding of the same engine "
        "(speedups are ratios measured side by side), verispec and transformers on the same "
        "weights and prompts; prints a table, optionally JSON and PNG plots.",
    )  # fmt: skip
    quick = "each method on its home workload, k=4, 3 prompts, 2 repeats"
    bench.add_argument("--quick", action="store_true", help=quick)
    bench.add_argument("--target", default=None, help="target checkpoint (embedded target)")
    bench.add_argument("--draft", default=None, help="draft checkpoint (embedded draft)")
    bench.add_argument("--workloads", type=_csv(str), default=None, help="code,edit,free")
    bench.add_argument("--methods", type=_csv(str), default=None,
                       help=f"speculative methods ({','.join(method_names())})")  # fmt: skip
    bench.add_argument("--k", type=_csv(int), default=None, help="k values (2,4,8)")
    bench.add_argument("--temperatures", type=_csv(float), default=None, help="(0,1)")
    bench.add_argument("--top-p", type=float, default=None, help="top-p when sampling (0.95)")
    bench.add_argument("--prompts", type=int, default=None, help="prompts per workload (6)")
    bench.add_argument("--max-tokens", type=int, default=None, help="(each workload's own)")
    bench.add_argument("--repeats", type=int, default=None, help="measured repeats (3)")
    bench.add_argument("--concurrency", type=_csv(int), default=None, help="(1)")
    bench.add_argument("--engines", type=_csv(str), default=None, help="verispec,transformers")
    bench.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")
    bench.add_argument("--no-verify-cost", action="store_true", help="skip the q curve")
    bench.add_argument("--json", default=None, metavar="PATH", help="write settings and rows")
    bench.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots")


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    from verispec.train.recipe import STAGES

    train = sub.add_parser(
        "train", help="train the embedded tokenizer, target and draft from scratch",
        description="Reproduce verispec's embedded models on the Python standard library: "
        "tokenizer, target, draft (distilled from the target), export (Hugging Face format).",
    )  # fmt: skip
    train.add_argument("stage", choices=(*STAGES, "all"), help="stage to run ('all': in order)")
    train.add_argument("--out", required=True, help="run directory (checkpoints, exports)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out (keep finished stages)")  # fmt: skip
    train.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")


def spec_config(args: argparse.Namespace) -> SpecConfig | str | None:
    """The SpecConfig the options ask for, None for plain decoding, or "auto" (the embedded
    draft when no --model is given); ValueError on a contradiction. Method names stay in the
    registry: whether a method takes a draft checkpoint is asked of SpecConfig itself."""
    flags = {  # option flag: (SpecConfig field, value)
        "--k": ("num_speculative_tokens", args.k),
        "--prompt-lookup-min": ("prompt_lookup_min", args.prompt_lookup_min),
        "--prompt-lookup-max": ("prompt_lookup_max", args.prompt_lookup_max),
        "--draft-quantization": ("quantization", args.draft_quantization),
    }
    given = {flag: fv for flag, fv in flags.items() if fv[1] is not None}
    if args.method == PLAIN:
        if given or args.draft is not None:
            extra = [*given, *(["--draft"] if args.draft is not None else [])]
            raise ValueError(f"--method {PLAIN} decodes without drafts; drop {', '.join(extra)}")
        return None
    embedded_draft = None
    if args.model is None:  # the embedded target comes with its embedded draft
        from verispec.config import default_speculative

        embedded_draft = default_speculative(None).model
    if args.draft is None and args.method is None:
        if args.model is None:
            return SpecConfig(model=embedded_draft, **dict(given.values())) if given else "auto"
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --draft or --method")
        return None
    options: dict[str, Any] = dict(given.values())
    if args.method is not None:
        options["method"] = args.method
        takes_draft = method_takes_draft(args.method)
        if takes_draft and args.draft is None and embedded_draft is not None:
            options["model"] = embedded_draft
        elif takes_draft and args.draft is None:
            raise ValueError(f"--method {args.method} needs --draft (a draft checkpoint or hub id)")
        if not takes_draft and args.draft is not None:
            raise ValueError(f"--method {args.method} takes no draft model; drop --draft")
    if args.draft is not None:
        options["model"] = args.draft
    return SpecConfig(**options)


def method_takes_draft(method: str) -> bool:
    """Whether `method` needs a draft checkpoint (asked of the registry)."""
    return takes_draft_model(method)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `verispec` command; bad input exits 2 with a one-line message."""
    args = build_parser().parse_args(argv)
    try:
        commands = {"train": _train, "bench": _bench, "generate": _generate}
        return commands[args.command](args)
    except ValueError as e:
        print(f"verispec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _train(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from verispec.train.recipe import STAGES, Recipe, run_stage

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        # 'all' keeps stages that are already done, so it can be rerun after an interruption
        run_stage(stage, Path(args.out), Recipe(), resume=args.resume or args.stage == "all")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from verispec.bench.main import bench_config, run

    return run(bench_config(args), args)


def _generate(args: argparse.Namespace) -> int:
    import torch

    from verispec import LLM, SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed,
    )  # fmt: skip
    spec = spec_config(args)
    print(f"loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    llm = LLM(
        model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        progress=True, speculative=spec, batch_invariant=args.batch_invariant,
        quantization=args.quantization,
    )  # fmt: skip
    engine = llm.engine
    spec = engine.config.speculative  # "auto" resolved
    out = llm.generate(args.prompt, params)[0]
    metrics = out.metrics.to_dict()
    settings: dict[str, Any] = {
        "model": str(engine.model_path),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "device": str(engine.device),
        "threads": torch.get_num_threads(),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": params.seed,
        "method": spec.method if spec else None,
        "k": spec.num_speculative_tokens if spec else None,
        "draft": spec.model if spec else None,
        "batch_invariant": args.batch_invariant,
        "quantization": args.quantization,
        "draft_quantization": spec.quantization if spec else None,
    }
    if args.json:
        result = {
            "text": out.text,
            "token_ids": out.token_ids,
            "finish_reason": out.finish_reason,
            "metrics": metrics,
            "settings": settings,
        }
        print(json.dumps(result))
        return 0
    print(args.prompt + out.text)
    ttft_ms = (metrics["ttft_s"] or 0.0) * 1e3
    print(
        f"[{len(out.token_ids)} tokens, {metrics['tokens_per_s'] or 0.0:.1f} tokens/s, "
        f"TTFT {ttft_ms:.0f} ms, finish: {out.finish_reason}; {settings['model']}, "
        f"{settings['dtype']} on {settings['device']}, temperature {params.temperature}]",
        file=sys.stderr,
    )
    if spec is not None:
        print(f"[{_acceptance_line(metrics)} ({spec.method}, k={spec.num_speculative_tokens})]",
              file=sys.stderr)  # fmt: skip
    return 0


def _acceptance_line(metrics: dict[str, Any]) -> str:
    """'accepted 71% of drafts, 3.1 tokens/step', or why there is no rate."""
    if not metrics["num_draft_tokens"]:
        return "no drafts proposed"
    return (f"accepted {metrics['acceptance_rate']:.0%} of {metrics['num_draft_tokens']} "
            f"drafts, {metrics['mean_acceptance_length']:.1f} tokens/step")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
