"""The speedup a drafter can reach on a target, bounded from measurements before any goal is
timed: the target's verify curve t(q) / t(1) and the draft's step on a warm cache (one run,
interleaved), and how many drafts a speculative run at depth --k-max accepts per position.

A greedy chain of k drafts is the first k of the chain of k-max (the same draft, the same
context), so one run at k-max gives every shorter depth's tokens a step: 1 + sum over i < k of
the share of verify steps that accepted draft i. A step of k drafts costs k draft steps and
one verify of k + 1 tokens, so the bound at depth k is

    tokens a step / ((k * t_draft + t_target(k + 1)) / t_target(1))

in units of plain decoding's speed (engine overhead and the draft's catch-up rows left out:
the measured speedup sits below it). Sampled runs (--temperature) count the same way, the
chain of k being the first k of the chain drawn at k-max. Example (the Qwen2.5-Coder pair):

    python benchmarks/pair_bound.py --target qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --quantization a8 --workloads code --prompts 4
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Any

import torch

from verispec import LLM, SamplingParams
from verispec.bench.verify_cost import step_ms
from verispec.bench.workloads import WORKLOADS, prompt_token_ids
from verispec.drafters.draft_vocab import draft_vocab
from verispec.models.weights.loader import load_model, resolve_model_path
from verispec.spec.resolve import DraftRuntime
from verispec.tokenizer import Tokenizer
from verispec.types.stats import SpecStats


def costs(args: argparse.Namespace, draft_quantization: str | None) -> dict[tuple[str, int], float]:
    """Median ms of one forward over q new tokens on a warm 256-token cache: the target for q
    = 1 .. k-max + 1 and the draft for q = 1, interleaved round by round."""
    cpu = torch.device("cpu")
    models = {"target": load_model(resolve_model_path(args.target), torch.float32, cpu,
                                   quantization=args.quantization)}  # fmt: skip
    if args.method == "draft_model":
        path = resolve_model_path(args.draft)
        ids = None
        if args.draft_vocab_size:
            limit = models["target"].config.vocab_size
            ids = draft_vocab(Tokenizer(path), args.draft_vocab_size, limit)
        models["draft"] = load_model(path, torch.float32, cpu, quantization=draft_quantization,
                                     vocab_ids=ids)  # fmt: skip
    qs = tuple(range(1, args.k_max + 2))
    ms = step_ms(models, qs, 256, args.repeats)
    return {key: value for key, value in ms.items() if key[0] == "target" or key[1] == 1}


def acceptance(args: argparse.Namespace, draft_quantization: str | None) -> dict[str, Any]:
    """Per-position acceptance of a speculative run at depth k-max over the workload's prompts,
    and that run's and plain decoding's decode tokens/s (median over prompts)."""
    spec: dict[str, Any] = {"method": args.method, "num_speculative_tokens": args.k_max}
    if args.method == "draft_model":
        spec |= {"model": args.draft, "quantization": draft_quantization,
                 "draft_vocab_size": args.draft_vocab_size}
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.tokens, seed=0)  # fmt: skip
    stats, rates = SpecStats(), {"plain": [], "speculative": []}
    for name, speculative in (("plain", None), ("speculative", spec)):
        llm = LLM(model=args.target, speculative=speculative, quantization=args.quantization)
        tokenizer = llm.tokenizer
        for workload in args.workloads.split(","):
            for prompt in WORKLOADS[workload].prompts(args.prompts):
                ids = prompt_token_ids(tokenizer, prompt)
                out = llm.generate([ids], params)[0]
                gaps = out.metrics.itl_s
                rates[name].append((len(out.token_ids) - 1) / sum(gaps) if gaps else 0.0)
                if speculative is not None:
                    stats.merge(out.metrics.spec)
        del llm
    return {"stats": stats, "plain": statistics.median(rates["plain"]),
            "speculative": statistics.median(rates["speculative"])}  # fmt: skip


def bound_rows(rates: list[float], ms: dict[tuple[str, int], float], k_max: int) -> list[dict]:
    """The bound at each depth k <= k_max from per-position acceptance rates and step costs.
    Example: rates [0.9, 0.8], t_target(1) 10, (2) 11, (3) 12 ms, t_draft 3 ms: k = 2 takes
    2.7 tokens a step for (6 + 12) / 10 = 1.8 steps, a bound of 1.5."""
    t1, draft = ms["target", 1], ms.get(("draft", 1), 0.0)
    rows = []
    for k in range(1, k_max + 1):
        tokens = 1 + sum(rates[:k])
        cost = (k * draft + ms["target", k + 1]) / t1
        rows.append({"k": k, "tokens_per_step": tokens, "verify_ratio": ms["target", k + 1] / t1,
                     "draft_ratio": draft / t1, "step_cost": cost, "bound": tokens / cost})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--method", default="draft_model", choices=("draft_model",),
                   help="a drafter that drafts every step (model-free drafters skip steps "
                   "without a match: bound those by lib.replay.copy_bound)")
    p.add_argument("--quantization", default="a8", help="the target's (none: as stored)")
    p.add_argument("--draft-quantization", default="auto")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="the draft's head over the most frequent ids (default: whole)")
    p.add_argument("--workloads", default="code")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.quantization == "none":
        args.quantization = None
    torch.set_num_threads(args.threads)
    draft_q = DraftRuntime(device="cpu", dtype="float32").draft_quantization(
        None if args.draft_quantization == "none" else args.draft_quantization)
    started = time.strftime("%H:%M UTC", time.gmtime())
    ms = costs(args, draft_q)
    run = acceptance(args, draft_q)
    stats: SpecStats = run["stats"]
    rates = stats.per_position_acceptance_rate + [0.0] * args.k_max
    print(f"{args.target} ({args.quantization or 'as stored'}), {args.method}"
          f"{' ' + args.draft + ' (' + str(draft_q) + ')' if args.method == 'draft_model' else ''},"
          f" draft vocabulary {args.draft_vocab_size or 'whole'},"
          f" {args.workloads} x {args.prompts}, {args.tokens} tokens, T={args.temperature}, "
          f"{args.threads} threads, {platform.processor() or platform.machine()}, {started}")
    print(f"t_target(1) {ms['target', 1]:.1f} ms, t_draft {ms.get(('draft', 1), 0.0):.1f} ms; "
          f"{stats.num_verify_steps} verify steps at k {args.k_max}, acceptance "
          f"{stats.acceptance_rate or 0.0:.2f}")
    print("| k | tokens/step | t(k+1)/t(1) | draft/t(1) | step cost | bound |")
    print("|---|---|---|---|---|---|")
    for row in bound_rows(rates, ms, args.k_max):
        print(f"| {row['k']} | {row['tokens_per_step']:.2f} | {row['verify_ratio']:.2f} | "
              f"{row['draft_ratio']:.2f} | {row['step_cost']:.2f} | {row['bound']:.2f}x |")
    print(f"measured decode tokens/s (median over prompts): plain {run['plain']:.2f}, "
          f"k={args.k_max} {run['speculative']:.2f} ({run['speculative'] / run['plain']:.2f}x)")


if __name__ == "__main__":
    main()
