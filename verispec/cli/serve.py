"""`verispec serve`: the OpenAI-compatible server over the model, its flags checked before the
model loads, and one start line saying what runs (speculation, caching, numerics, kernels,
memory)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from verispec.cli.comma_list import comma_list
from verispec.cli.options import add_model_options, load_llm

if TYPE_CHECKING:
    from verispec.serve import ServerLimits


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand's options: the model's, then the server's address, access and
    limits."""
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
    serve.add_argument("--allowed-origins", type=comma_list(str), default=(), metavar="ORIGINS",
                       help="let browser pages from these origins call the API (CORS), "
                       "comma-separated, e.g. http://localhost:3000; * for any (default: "
                       "none)")  # fmt: skip


def run_serve(args: argparse.Namespace) -> int:
    """Check the flags, load the model, print one start line and serve until stopped."""
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
    limits = server_limits(args)
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
          f"{kernel_line(engine.model.kernels())}; memory: {memory}", file=sys.stderr,
          flush=True)  # fmt: skip
    server.run()
    return 0


def server_limits(args: argparse.Namespace) -> ServerLimits:
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


def kernel_line(kernels: dict[str, str]) -> str:
    """{"float32": "native avx2", ...} -> "float32 on native avx2, ..." for a start line."""
    return ", ".join(f"{fmt} on {kernel}" for fmt, kernel in kernels.items())
