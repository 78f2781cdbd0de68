"""Weight-only quantization of the embedded pair: its effect on acceptance, speed and output.

Plain and speculative (draft_model) greedy decoding of the `code` workload, with the target
and/or the draft rounded at load (`quantization=`, `SpecConfig(quantization=)`), all engines
interleaved in one process. See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS = {  # name: (target quantization, speculative, draft quantization)
    "plain": (None, False, None),
    "draft_model": (None, True, None),
    "draft_model, int8 draft": (None, True, "int8"),
    "plain, int8 target": ("int8", False, None),
    "draft_model, int8 target": ("int8", True, None),
    "plain, fp16 target": ("fp16", False, None),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6, help="code prompts (spread over the file)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2, help="measured repeats after a warm-up")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    if min(args.prompts, args.max_tokens, args.k, args.repeats, args.threads) < 1:
        p.error("every option must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    import torch

    from verispec import LLM, SamplingParams, SpecConfig
    from verispec.bench.facts import print_settings, run_facts
    from verispec.bench.report import write_json
    from verispec.bench.workloads import WORKLOADS
    from verispec.models.catalog.default import embedded_model_path
    from verispec.types.stats import SpecStats

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    target, draft = embedded_model_path("target"), embedded_model_path("draft")
    llms = {}
    for name, (tq, spec, dq) in CONFIGS.items():
        sc = SpecConfig(model=str(draft), num_speculative_tokens=args.k, quantization=dq)
        llms[name] = LLM(model=str(target), speculative=sc if spec else None, quantization=tq)
    tokenizer = llms["plain"].tokenizer
    prompts = [tokenizer.encode(p.text) for p in WORKLOADS["code"].prompts(args.prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    outputs: dict[str, list[list[int]]] = {}
    acceptance: dict[str, float | None] = {}
    for rep in range(args.repeats + 1):  # repeat 0 warms up
        for name, llm in llms.items():
            started = time.perf_counter()
            outs = [llm.generate([p], params)[0] for p in prompts]  # concurrency 1
            wall = time.perf_counter() - started
            if rep:
                rates[name].append(sum(len(o.token_ids) for o in outs) / wall)
            outputs[name] = [o.token_ids for o in outs]
            stats = SpecStats()  # this repeat's requests only
            for o in outs:
                stats.merge(o.metrics.spec)
            acceptance[name] = stats.acceptance_rate
        print(f"repeat {rep}/{args.repeats} done", file=sys.stderr)

    def same_target(name: str) -> str:
        """The plain run of the same target, which this row's output must equal."""
        quantization = CONFIGS[name][0]
        return f"plain, {quantization} target" if quantization else "plain"

    rows: list[dict[str, Any]] = []
    plain_rate = statistics.median(rates["plain"])
    for name, (tq, spec, dq) in CONFIGS.items():
        ref = same_target(name)
        rows.append({
            "config": name, "target_quantization": tq, "draft_quantization": dq,
            "speculative": spec, "tokens_per_s": statistics.median(rates[name]),
            "tokens_per_s_runs": rates[name],
            "vs_plain_unquantized": statistics.median(rates[name]) / plain_rate,
            "acceptance_rate": acceptance[name],
            "equals_plain_of_same_target": outputs[name] == outputs[ref],
            "requests_equal_to_unquantized_plain": sum(
                a == b for a, b in zip(outputs[name], outputs["plain"], strict=True)),
        })  # fmt: skip
    settings = {
        "target": str(target), "draft": str(draft), "workload": "code", "prompts": args.prompts,
        "max_tokens": args.max_tokens, "k": args.k, "temperature": 0, "repeats": args.repeats,
        "threads": args.threads, "dtype": "float32", "concurrency": 1,

        **run_facts(load_before),
    }  # fmt: skip
    print_settings(settings)
    print("\n| configuration | tok/s | vs plain | acceptance | = plain of its target | "
          f"requests = unquantized plain (of {args.prompts}) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        print(f"| {r['config']} | {r['tokens_per_s']:.1f} | {r['vs_plain_unquantized']:.2f}x "
              f"| {acc} | {'yes' if r['equals_plain_of_same_target'] else 'NO'} "
              f"| {r['requests_equal_to_unquantized_plain']} |")  # fmt: skip
    if args.json:
        write_json(args.json, settings, rows)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
