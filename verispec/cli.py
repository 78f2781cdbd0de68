"""Command line: `verispec generate PROMPT ...` (later: serve, bench, verify, train)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="verispec", description="Lossless speculative decoding for large language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    gen.add_argument("prompt", help="prompt text")
    gen.add_argument("--model", default=None, help="checkpoint directory or hub id (default: demo)")
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate (64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1)")
    gen.add_argument("--top-k", type=int, default=-1, help="keep the k likeliest; -1 = off")
    gen.add_argument("--seed", type=int, default=None, help="seed for sampling")
    gen.add_argument("--dtype", default="auto", help="auto, float32, float16, bfloat16")
    gen.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    gen.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `verispec` command; bad input exits 2 with a one-line message."""
    args = build_parser().parse_args(argv)
    try:
        return _generate(args)
    except ValueError as e:
        print(f"verispec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _generate(args: argparse.Namespace) -> int:
    import torch

    from verispec import LLM, SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed,
    )  # fmt: skip
    print(f"loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    llm = LLM(
        model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        progress=True,
    )  # fmt: skip
    out = llm.generate(args.prompt, params)[0]
    metrics = out.metrics.to_dict()
    engine = llm.engine
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
