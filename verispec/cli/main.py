"""Command line: `verispec generate|chat|pull|bench|train|serve|verify ...`; bad input exits 2
with one line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verispec.bench.plan import ENGINES
from verispec.cli.options import (
    DRAFT_FLAG_VALUES,
    acceptance_line,
    add_model_options,
    load_llm,
    sampling_params,
)
from verispec.cli.verify import add_verify_parser, run_verify
from verispec.drafters.registry import PLAIN, head_method_names, method_names
from verispec.models.catalog.hub import model_names, pull
from verispec.models.kernels.quantization import AUTO_DRAFT

if TYPE_CHECKING:
    from verispec.serve import ServerLimits

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="verispec", description="Lossless speculative decoding for large language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    gen.add_argument("prompt", help="prompt text")
    add_model_options(gen, max_tokens=64)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    chat = sub.add_parser(
        "chat", help="chat with an instruct model (its chat template), answers streamed",
        description="With PROMPT: one streamed answer and a stats line. Without: a multi-turn "
        "session reading lines from stdin; /reset clears the history, /stats shows acceptance "
        "and speed so far, /exit or end of input ends it.",
    )  # fmt: skip
    chat.add_argument("prompt", nargs="?", default=None,
                      help="one question (none: an interactive session)")  # fmt: skip
    add_model_options(chat, max_tokens=256)
    pull = sub.add_parser(
        "pull", help="fetch a named model into verispec's cache (done on first use otherwise)",
        description=f"Named models: {', '.join(model_names())}. Prints the local path.",
    )  # fmt: skip
    pull.add_argument("name", choices=model_names(), help="model name")
    _add_serve_parser(sub)
    _add_train_parser(sub)
    _add_bench_parser(sub)
    add_verify_parser(sub)
    return parser


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API with a chat page",
        description="POST /v1/completions and /v1/chat/completions (streamed with SSE or not), "
        "GET /v1/models, /health, /metrics (Prometheus) and a chat page at / that shows which "
        "tokens were accepted drafts. See docs/serving.md.",
    )  # fmt: skip
    add_model_options(serve, max_tokens=None)
    serve.add_argument("--speculative-config", default=None, metavar="JSON",
                       help="speculative decoding as vLLM's JSON object, e.g. "
                       '\'{"model": "draft/", "num_speculative_tokens": 4}\' (instead of '
                       "--method/--draft/--k); null = plain decoding")  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on /v1 routes (default: "
                       "$VERISPEC_API_KEY, else none)")  # fmt: skip
    serve.add_argument("--served-model-name", default=None,
                       help="the model's name in the API (default: --model, or the default "
                       "model's name)")  # fmt: skip
    serve.add_argument("--max-num-seqs", type=int, default=None,
                       help="most requests decoded at once (the engine's default: 8)")
    serve.add_argument("--long-prefill-chunk", type=int, default=None, metavar="N",
                       help="a prompt with more than N tokens left prefills after other "
                       "requests' decodes and short prompts, at most N tokens a step beside "
                       "them, paced by measured step times (256)")  # fmt: skip
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="reuse the KV of prompt prefixes earlier requests computed (exact; "
                       "on by default)")  # fmt: skip
    serve.add_argument("--max-request-bytes", type=int, default=None, metavar="N",
                       help="largest request body in bytes; a larger one is answered 413 "
                       "(default 16 MiB)")  # fmt: skip
    serve.add_argument("--max-sequences-per-request", type=int, default=None, metavar="N",
                       help="most sequences (prompts x n) one request may queue; more is a 400 "
                       "(default 64)")  # fmt: skip
    serve.add_argument("--body-timeout", type=float, default=None, metavar="S",
                       help="seconds a request body may take to arrive whole; slower is a 408 "
                       "(default 30)")  # fmt: skip
    serve.add_argument("--max-prompt-bytes", type=int, default=None, metavar="N",
                       help="largest rendered chat prompt in bytes, refused (413) before it is "
                       "tokenized (default 64 per token of the context)")  # fmt: skip
    serve.add_argument("--trust-request-chat-template", action="store_true",
                       help="let requests send their own Jinja chat template "
                       "(chat_template_kwargs.chat_template), rendered in a worker process "
                       "under --template-timeout and a memory cap; off, it is a 400")  # fmt: skip
    serve.add_argument("--template-timeout", type=float, default=None, metavar="S",
                       help="with --trust-request-chat-template: seconds a request's template "
                       "may render (default 2)")  # fmt: skip
    serve.add_argument("--allowed-origins", type=_csv(str), default=(), metavar="ORIGINS",
                       help="let browser pages from these origins call the API (CORS), "
                       "comma-separated, e.g. http://localhost:3000; * for any (default: "
                       "none)")  # fmt: skip


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
    bench.add_argument("--target", "--model", dest="target", default=None,
                       help="target: checkpoint directory, .gguf file or model name "
                       "(embedded-code)")  # fmt: skip
    bench.add_argument("--draft", default=None,
                       help="draft checkpoint or model name (embedded-code-draft)")  # fmt: skip
    bench.add_argument("--draft-quantization", choices=DRAFT_FLAG_VALUES,
                       default=AUTO_DRAFT,
                       help="the draft model's, in its rows and its cost runs (as verispec run "
                       "uses a named model's own draft): auto = w8a8 where the CPU has AVX-512 "
                       "VNNI, else none (as stored)")  # fmt: skip
    bench.add_argument("--workloads", type=_csv(str), default=None,
                       help="code,edit,free,chat,agentic,code_chat,code_edit (the last "
                       "four: for chat models)")  # fmt: skip
    bench.add_argument("--methods", type=_csv(str), default=None,
                       help=f"methods ({','.join((PLAIN, *method_names()))}; default: those "
                       "that need no head, and eagle/medusa given --eagle/--medusa)")  # fmt: skip
    bench.add_argument("--k", type=_csv(int), default=None, help="k values (2,4,8)")
    bench.add_argument("--eagle", default=None, metavar="PATH",
                       help="EAGLE head directory (runs method eagle)")  # fmt: skip
    bench.add_argument("--medusa", default=None, metavar="PATH",
                       help="Medusa heads directory (runs method medusa)")  # fmt: skip
    bench.add_argument("--trees", type=_csv(str), default=None, metavar="SHAPES",
                       help="eagle/medusa draft trees KxD:N besides each k's chain: topk K, "
                       "depth D, at most N nodes; KxD:N+L (eagle) grafts a prompt-lookup chain "
                       "of up to L more (e.g. 4x6:16,3x4:8+4)")  # fmt: skip
    bench.add_argument("--temperatures", type=_csv(float), default=None, help="(0,1)")
    bench.add_argument("--top-p", type=float, default=None, help="top-p when sampling (0.95)")
    bench.add_argument("--prompts", type=int, default=None, help="prompts per workload (6)")
    bench.add_argument("--max-tokens", type=int, default=None, help="(each workload's own)")
    bench.add_argument("--repeats", type=int, default=None, help="measured repeats (3)")
    bench.add_argument("--concurrency", type=_csv(int), default=None, help="(1)")
    bench.add_argument("--engines", type=_csv(str), default=None,
                       help=f"({','.join(ENGINES)})")  # fmt: skip
    bench.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")
    bench.add_argument("--no-verify-cost", action="store_true", help="skip the q curve")
    bench.add_argument("--json", default=None, metavar="PATH", help="write settings and rows")
    bench.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots")
    serving = bench.add_argument_group(
        "serving mode (--serving): a concurrency sweep through HTTP, speculation settings side "
        "by side; uses --target, --concurrency (1,2,4,8,16,32), --max-tokens (64), --repeats "
        "(rounds, median; 1), --json, --plot"
    )
    serving.add_argument("--serving", action="store_true",
                         help="sweep concurrency through verispec serve instead")  # fmt: skip
    serving.add_argument("--settings", type=_csv(str), default=None,
                         help="off, auto (adaptive), fixed (the model's own drafter at its k), "
                         "kN (its method as a chain of N) (off,auto,fixed)")  # fmt: skip
    serving.add_argument("--requests", type=int, default=None,
                         help="requests per concurrency and setting (max(8, 2 x concurrency))")
    serving.add_argument("--url", default=None,
                         help="benchmark a running server instead (one setting: its own)")


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `verispec` command; bad input exits 2 with a one-line message."""
    args = build_parser().parse_args(argv)
    try:
        commands = {
            "train": _train, "bench": _bench, "generate": _generate, "chat": _chat, "pull": _pull,
            "serve": _serve, "verify": run_verify,
        }  # fmt: skip
        return commands[args.command](args)
    except ValueError as e:
        print(f"verispec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _train(args: argparse.Namespace) -> int:
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


HEAD_KINDS = head_method_names()  # verispec train eagle|medusa: a head of that method
HEAD_OPTIONS = ("target", "prompts", "num_prompts", "max_tokens", "steps", "draft_vocab",
                "batch_size", "only", "device", "format")  # fmt: skip


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
    if value < 1:
        raise ValueError(f"{flag} must be >= 1, got {value}")
    return value


def _bench(args: argparse.Namespace) -> int:
    if args.serving:
        from verispec.cli.bench import run_serving

        return run_serving(args)
    from verispec.cli.bench import bench_config, run

    return run(bench_config(args), args)


def _serve(args: argparse.Namespace) -> int:
    import os

    from verispec.kv.memory import format_size, resident_bytes
    from verispec.models.kernels.quantization import numerics_name
    from verispec.serve import Server
    from verispec.serve.middleware import check_origins

    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs must be >= 1, got {args.max_num_seqs}")
    if args.long_prefill_chunk is not None and args.long_prefill_chunk < 1:
        raise ValueError(f"--long-prefill-chunk must be >= 1, got {args.long_prefill_chunk}")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ValueError("--served-model-name must not be empty")
    limits = _server_limits(args)
    origins = check_origins(args.allowed_origins)
    api_key = args.api_key if args.api_key is not None else os.environ.get("VERISPEC_API_KEY")
    llm = load_llm(args)
    server = Server(llm.engine, args.host, args.port, api_key, args.served_model_name,
                    log_level="info", limits=limits,
                    allowed_origins=origins)  # fmt: skip
    engine = llm.engine
    spec = engine.config.speculative
    drafting = "off" if spec is None else (
        f"{spec.method}, {'adaptive' if spec.adaptive else 'fixed'} up to "
        f"{spec.num_speculative_tokens} tokens"
    )  # fmt: skip
    caching = "on" if engine.prefix_cache is not None else "off"
    resident = resident_bytes()
    memory = engine.kv_memory.describe() if resident is None else (
        f"{format_size(resident)} resident ({engine.kv_memory.describe()}; the rest weights "
        f"and runtime)"
    )  # fmt: skip
    print(f"verispec: serving {server.model_name} on http://{args.host}:{args.port} "
          f"(chat page at /, API at /v1); speculation: {drafting}; prefix caching: "
          f"{caching}; numerics: {numerics_name(engine.config.quantization)}; kernels: "
          f"{_kernel_line(engine.model.kernels())}; memory: {memory}", file=sys.stderr,
          flush=True)  # fmt: skip
    server.run()
    return 0


def _server_limits(args: argparse.Namespace) -> ServerLimits:
    """The ServerLimits `verispec serve`'s flags ask for (the defaults where none is given)."""
    import math

    from verispec.serve import ServerLimits

    counts = ("max_request_bytes", "max_sequences_per_request", "max_prompt_bytes")
    given = {name: getattr(args, name) for name in counts if getattr(args, name) is not None}
    for name, value in given.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    for flag in ("body_timeout", "template_timeout"):
        value = getattr(args, flag)
        if value is None:
            continue
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{flag.replace('_', '-')} must be a number of seconds > 0, "
                             f"got {value}")  # fmt: skip
        given[f"{flag}_s"] = value
    return ServerLimits(**given, trust_request_chat_template=args.trust_request_chat_template)


def _pull(args: argparse.Namespace) -> int:
    print(pull(args.name))
    return 0


def _chat(args: argparse.Namespace) -> int:
    from verispec.cli.chat import run_chat

    return run_chat(args)


def _kernel_line(kernels: dict[str, str]) -> str:
    """{"float32": "native avx2", ...} -> "float32 on native avx2, ..." for a start line."""
    return ", ".join(f"{fmt} on {kernel}" for fmt, kernel in kernels.items())


def _generate(args: argparse.Namespace) -> int:
    import torch

    from verispec.models.kernels.quantization import numerics_name

    params = sampling_params(args)
    llm = load_llm(args)
    engine = llm.engine
    spec = engine.config.speculative  # resolved (spec/resolve.py): what runs
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
        "compile": args.compile,
        "quantization": engine.config.quantization,
        "numerics": numerics_name(engine.config.quantization),
        "draft_quantization": spec.quantization if spec else None,
        "speculative": dataclasses.asdict(spec) if spec else None,
        "kernels": engine.model.kernels(),
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
        print(f"[{acceptance_line(out.metrics.spec)} ({spec.method}, "
              f"k={spec.num_speculative_tokens})]", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
