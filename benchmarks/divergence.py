"""How often speculative greedy output differs from plain greedy output of the same engine.

In the default mode (batch_invariant=False) a verify forward computes 1 + k rows at once, and a
multi-row matrix product may round differently from the single-row one plain decoding uses; a
near-tie in the logits then flips a greedy token and the two outputs part ways. batch_invariant=
True computes every row on its own, so speculative greedy output must equal plain greedy output.
See benchmarks/README.md for the pair, the workload and the columns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from plain_decode import thread_env
from spec_decode import num_parameters, resolve_pair, workload

from verispec.bench.facts import print_settings, run_facts
from verispec.bench.report import write_json
from verispec.drafters.registry import method_names, takes_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, default=None, help="target checkpoint (default: made)")
    p.add_argument("--draft", type=Path, default=None, help="draft checkpoint (default: made)")
    p.add_argument("--methods", nargs="+", choices=method_names(), default=list(method_names()))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--invariant-prompts", type=int, default=8,
                   help="the first N prompts also run with batch_invariant=True")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=1, help="requests decoding at once")
    p.add_argument("--dtype", default="float32", help="float32 (default) or bfloat16")
    p.add_argument("--linear-backend", default="auto", help="auto, onednn, fp16 or torch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    if (args.target is None) != (args.draft is None):
        p.error("give both --target and --draft, or neither (the made pair)")
    if min(args.prompts, args.k, args.concurrency, args.threads, args.max_tokens) < 1:
        p.error("--prompts, --k, --concurrency, --threads, --max-tokens must be >= 1")
    if not 0 <= args.invariant_prompts <= args.prompts:
        p.error("--invariant-prompts must be in [0, --prompts]")
    return args


def greedy(options: dict[str, Any], prompts: list[str], n: int, spec: Any = None) -> dict:
    """Token ids of every prompt (all submitted at once), and the run's acceptance counters."""
    from verispec import LLM, SamplingParams

    llm = LLM(**options, speculative=spec)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return {"ids": [o.token_ids for o in outs], "stats": llm.engine.spec_stats}


def run_mode(
    args: argparse.Namespace, target: Path, draft: Path, prompts: list[str], invariant: bool
) -> tuple[dict, list[dict[str, Any]]]:
    """Plain greedy, then each method's greedy, in one mode; rows compare each with plain."""
    from verispec import SpecConfig

    mode = "batch-invariant" if invariant else "default"
    options = {"model": str(target), "dtype": args.dtype, "device": "cpu",
               "linear_backend": args.linear_backend, "max_num_seqs": args.concurrency,
               "max_model_len": 2048, "batch_invariant": invariant}  # fmt: skip
    plain = greedy(options, prompts, args.max_tokens)
    print(f"{mode}: plain done", file=sys.stderr)
    rows = []
    for method in args.methods:
        model = str(draft) if takes_model(method) else None
        spec = SpecConfig(method=method, model=model, num_speculative_tokens=args.k)
        run = greedy(options, prompts, args.max_tokens, spec)
        rows.append(compare(mode, plain, run, method, args.k))
        print(f"{mode}: {method} done", file=sys.stderr)
    return plain, rows


def compare(name: str, ref: dict, run: dict, method: str, k: int | None) -> dict[str, Any]:
    """Fraction of requests that differ and where they first differ (output position)."""
    firsts = []
    for a, b in zip(ref["ids"], run["ids"], strict=True):
        if a != b:
            diffs = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
            firsts.append(next(diffs, min(len(a), len(b))))
    n = len(ref["ids"])
    return {
        "mode": name, "method": method, "k": k, "requests": n, "differing": len(firsts),
        "fraction_differing": len(firsts) / n,
        "mean_first_divergence": statistics.mean(firsts) if firsts else None,
        "median_first_divergence": statistics.median(firsts) if firsts else None,
        "first_divergences": firsts, "draft_tokens": run["stats"].num_draft_tokens,
        "acceptance_rate": run["stats"].acceptance_rate,
    }  # fmt: skip


def main() -> None:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    target, draft = resolve_pair(args.target, args.draft, None)
    prompts = workload(args.prompts)
    if len(prompts) < args.prompts:
        sys.exit(f"the stdlib gave only {len(prompts)} prompts; use --prompts {len(prompts)}")
    subset = prompts[: args.invariant_prompts]
    n = args.max_tokens
    plain, rows = run_mode(args, target, draft, prompts, invariant=False)
    if subset:
        plain_invariant, invariant_rows = run_mode(args, target, draft, subset, invariant=True)
        rows += invariant_rows
        plain_subset = {"ids": plain["ids"][: len(subset)], "stats": plain["stats"]}
        rows.append(compare("batch-invariant vs default", plain_subset, plain_invariant,
                            "plain", None))  # fmt: skip

    settings = {
        "target": f"{target} ({num_parameters(target):,} parameters)",
        "draft": f"{draft} ({num_parameters(draft):,} parameters)",
        "workload": f"{len(prompts)} copy-this-code prompts (stdlib functions), greedy, "
                    f"{n} new tokens each, ignore_eos; batch-invariant runs: first {len(subset)}",
        "concurrency": args.concurrency, "k": args.k, "dtype": args.dtype,
        "linear_backend": args.linear_backend,
        "threads": args.threads,
        **run_facts(load_before), "env": thread_env(),
    }  # fmt: skip
    print_settings(settings)
    print()
    print("| mode | method | k | requests | differ from plain | fraction | mean first divergence "
          "| median first divergence | draft tokens | acceptance rate |")  # fmt: skip
    print("|---" * 10 + "|")
    for r in rows:
        mean, med, acc = (r["mean_first_divergence"], r["median_first_divergence"],
                          r["acceptance_rate"])  # fmt: skip
        print(f"| {r['mode']} | {r['method']} | {r['k'] or '-'} | {r['requests']} "
              f"| {r['differing']} | {r['fraction_differing']:.2f} "
              f"| {'-' if mean is None else f'{mean:.1f}'} | {'-' if med is None else med} "
              f"| {r['draft_tokens']} | {'-' if acc is None else f'{acc:.2f}'} |")  # fmt: skip
    if args.json:
        write_json(args.json, settings, rows)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
