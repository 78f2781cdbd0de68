"""Model-free drafters replayed on a target's recorded greedy outputs (lib.replay):
tokens per target step for prompt lookup and suffix decoding at several k, the bound for any
drafter that copies from its context, and the end-to-end speedup each would give if verifying
cost nothing (prefill and decode times from the recording run, with prefix caching as the
bench). Acceptance needs no timing, so this runs beside anything. See benchmarks/README.md.

    python benchmarks/replay_drafters.py [--model smollm2-135m-instruct] [--quantization a8]
        [--workload agentic] [--k 3,5,8,16] [--save F | --load F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from lib.replay import (
    Recorded,
    ReplayStats,
    copy_bound,
    end_to_end_ceiling,
    replay,
)

from verispec import LLM, SamplingParams, SpecConfig
from verispec.bench.facts import print_settings
from verispec.bench.workloads import WORKLOADS, prompt_token_ids
from verispec.config import MAX_SPECULATIVE_TOKENS
from verispec.drafters.registry import make_model_free_proposer

DRAFTERS = {  # label -> SpecConfig options besides method and k
    "ngram": {"method": "ngram"},
    "suffix": {"method": "suffix"},
    "suffix factor 4, min prob 0": {"method": "suffix", "suffix_decoding_max_spec_factor": 4.0,
                                    "suffix_decoding_min_token_prob": 0.0},
}  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--quantization", default="a8", help="the target's (as the bench's engine)")
    p.add_argument("--workload", default="agentic", choices=sorted(WORKLOADS))
    p.add_argument("--k", default="3,5,8,16", help="draft budgets, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save", type=Path, help="write the recorded outputs and times here")
    p.add_argument("--load", type=Path, help="replay outputs saved by --save (no model run)")
    args = p.parse_args()
    try:
        args.k = [int(k) for k in args.k.split(",")]
    except ValueError:
        p.error(f"--k takes integers separated by commas, got {args.k!r}")
    if any(not 1 <= k <= MAX_SPECULATIVE_TOKENS for k in args.k):
        p.error(f"--k values must be in [1, {MAX_SPECULATIVE_TOKENS}] (prompt lookup's limit)")
    return args


def record(args: argparse.Namespace) -> dict:
    """The target's plain greedy outputs on the workload, one request at a time (as a bench
    pass at concurrency 1), with the summed time to first tokens and inter-token gaps."""
    torch.set_num_threads(args.threads)
    quantization = None if args.quantization == "none" else args.quantization
    llm = LLM(model=args.model, quantization=quantization, speculative=None,
              enable_prefix_caching=True)  # fmt: skip
    workload = WORKLOADS[args.workload]
    prompts = [prompt_token_ids(llm.tokenizer, p) for p in workload.prompts()]
    params = SamplingParams(temperature=0, max_tokens=workload.max_tokens)
    llm.generate(prompts[:1], params)  # warm-up, then a cold prefix cache as the bench's passes
    llm.reset_prefix_cache()
    rows, prefill, decode = [], 0.0, 0.0
    for ids in prompts:
        out = llm.generate([ids], params)[0]
        rows.append({"prompt": ids, "output": list(out.token_ids)})
        prefill += out.metrics.ttft_s or 0.0
        decode += sum(out.metrics.itl_s)
    return {"model": args.model, "quantization": args.quantization, "workload": args.workload,
            "prefill_s": prefill, "decode_s": decode, "rows": rows}  # fmt: skip


def main() -> None:
    args = parse_args()
    run = json.loads(args.load.read_text()) if args.load else record(args)
    if args.save:
        args.save.write_text(json.dumps(run))
    recorded = [Recorded(r["prompt"], r["output"]) for r in run["rows"]]
    prefill, decode = run["prefill_s"], run["decode_s"]
    print_settings({
        "model": run["model"], "quantization": run["quantization"], "workload": run["workload"],
        "requests": len(recorded), "output tokens": sum(len(r.output) for r in recorded),
        "plain run": f"prefill {prefill:.2f} s, decode {decode:.2f} s (summed TTFT and gaps)",
        "order": "one request at a time, in file order; finished outputs feed suffix's cache",
    })  # fmt: skip
    print("\n| drafter | k | tokens/step | len | steps drafted | nodes/verify | "
          "end-to-end if verifying were free |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")

    def row(label: str, k: int, s: ReplayStats, drafts: bool = True) -> None:
        ceiling = end_to_end_ceiling(s.tokens_per_step, prefill, decode)
        nodes = f"{s.nodes_per_verify:.1f}" if drafts else "-"  # a bound drafts what it keeps
        print(
            f"| {label} | {k} | {s.tokens_per_step:.2f} | {s.mean_length:.2f} | "
            f"{s.verify_steps}/{s.steps} | {nodes} | {ceiling:.2f}x |"
        )
        sys.stdout.flush()

    for label, options in DRAFTERS.items():
        for k in args.k:
            spec = SpecConfig(num_speculative_tokens=k, **options)
            row(label, k, replay(make_model_free_proposer(spec), recorded, k))
    for k in args.k:
        for m in (1, 2):
            row(f"copy bound (match >= {m}, chosen knowing the output)", k,
                copy_bound(recorded, k, m), drafts=False)  # fmt: skip


if __name__ == "__main__":
    main()
