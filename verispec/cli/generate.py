"""`verispec generate`: one completion of one prompt, printed with a stats line or as one JSON
object holding the text, the metrics and every setting that ran."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from verispec.cli.options import acceptance_line, add_model_options, load_llm, sampling_params


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    """The `generate` subcommand's options."""
    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    gen.add_argument("prompt", help="prompt text")
    add_model_options(gen, max_tokens=64)
    gen.add_argument("--json", action="store_true", help="print one JSON object")


def run_generate(args: argparse.Namespace) -> int:
    """Generate one completion; print it (or one JSON object) and its stats line."""
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
