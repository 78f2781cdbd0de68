"""What warping + sampling costs against one plain T=1 decode step, old sort path vs new.

One process: the model decodes one chat prompt at T=1 (no drafter), each Engine.step timed,
each step's logits row kept; those rows are then warped (and the first row sampled, as the
verifier samples one final token per request) by the sort-based path warp used before issue
13 and by warp itself, round-robin, for every setting and row count. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from verispec.api.llm import LLM
from verispec.bench.facts import print_settings, run_facts
from verispec.bench.report import write_json
from verispec.sample import SamplingTensors, sample, warp
from verispec.sample.logits import BOUNDARY_TOL, truncate_sorted
from verispec.types.chat import chat_prompt
from verispec.types.sampling_params import SamplingParams

SETTINGS = {
    "T=1 (no truncation)": {},
    "top-p 0.95": {"top_p": 0.95},
    "top-k 50": {"top_k": 50},
    "min-p 0.05": {"min_p": 0.05},
    "top-k 50 + top-p 0.95": {"top_k": 50, "top_p": 0.95},
}
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
Warp = Callable[[torch.Tensor, SamplingTensors], torch.Tensor]
Clock = Callable[[], float]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="named model or checkpoint (embedded-code when it cannot be loaded)",
    )
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=48, help="plain decode steps timed")
    p.add_argument("--repeats", type=int, default=21, help="timed calls per setting and path")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this thread's CPU time (needs --threads 1), steady on a loaded machine",
    )
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    if min(args.rows) < 1 or min(args.steps, args.repeats, args.threads) < 1:
        p.error("--rows, --steps, --repeats and --threads must be >= 1")
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu counts the calling thread only: use it with --threads 1")
    if args.steps < max(args.rows):
        p.error(f"--steps must be >= the largest --rows ({max(args.rows)}): rows are step logits")
    return args


def load(model: str) -> tuple[LLM, str]:
    """The model without a drafter, or the embedded target when it cannot be had."""
    try:
        return LLM(model=model, speculative=None), model
    except (OSError, RuntimeError, ValueError) as error:
        print(f"cannot load {model} ({error}); using embedded-code", file=sys.stderr)
        return LLM(model="embedded-code", speculative=None), "embedded-code"


def plain_steps(llm: LLM, steps: int, clock: Clock) -> tuple[list[float], torch.Tensor]:
    """Seconds of each decode step (prefill excluded) of one request at T=1, and the logits
    [steps, vocab] the verifier warped at each of them."""
    engine, rows = llm.engine, []
    verify = engine.runner.verify

    def keep_logits(logits: torch.Tensor, *args: Any) -> Any:
        rows.append(logits[-1:].clone())
        return verify(logits, *args)

    engine.runner.verify = keep_logits  # type: ignore[method-assign]
    params = SamplingParams(temperature=1.0, max_tokens=steps + 1, seed=0, ignore_eos=True)
    try:
        prompt: str | list[int] = chat_prompt(llm.tokenizer, [{"role": "user", "content": PROMPT}],
                                              llm.model_name)[1]  # fmt: skip
    except ValueError:  # no chat template (the embedded code model): the plain text
        prompt = PROMPT
    engine.add_request(prompt, params)
    times = []
    while engine.has_unfinished():
        start = clock()
        engine.step()
        times.append(clock() - start)
    engine.runner.verify = verify  # type: ignore[method-assign]
    return times[1:], torch.cat(rows[1:])


def sort_warp(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """warp before issue 13 for rows without penalties or greedy rows: every truncating row
    goes through one stable argsort of the whole vocabulary."""
    x = logits.float() / t.temperature.unsqueeze(1)
    if t.need_top_k or t.need_top_p:
        x = truncate_sorted(x, t)
    if t.need_min_p:
        probs = x.softmax(dim=1)
        floor = (t.min_p - BOUNDARY_TOL).unsqueeze(1) * probs.amax(dim=1, keepdim=True)
        x = x.masked_fill(probs < floor, float("-inf"))
    return x.softmax(dim=1)


def timed(fn: Warp, logits: torch.Tensor, t: SamplingTensors, clock: Clock) -> tuple[float, float]:
    """Seconds of one warp call and of sampling the first row of its result."""
    start = clock()
    p = fn(logits, t)
    middle = clock()
    sample(p[:1], [torch.Generator().manual_seed(0)])
    return middle - start, clock() - middle


def measure(
    logits: torch.Tensor, params: SamplingParams, repeats: int, clock: Clock
) -> dict[str, Any]:
    """Median warp and warp + sample seconds of both paths (round-robin), and whether their
    probabilities are bitwise equal."""
    n, vocab = logits.shape
    t = SamplingTensors.build([params] * n, [[]] * n, [[]] * n, vocab)
    equal = torch.equal(sort_warp(logits, t), warp(logits, t))
    runs: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    for _ in range(repeats):
        runs["old"].append(timed(sort_warp, logits, t, clock))
        runs["new"].append(timed(warp, logits, t, clock))
    out: dict[str, Any] = {"equal": equal}
    for path, pairs in runs.items():
        out[f"{path}_warp_s"] = statistics.median(w for w, _ in pairs)
        out[f"{path}_total_s"] = statistics.median(w + s for w, s in pairs)
    return out


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    llm, model = load(args.model)
    step_times, logits = plain_steps(llm, args.steps, clock)
    step = statistics.median(step_times)
    settings = {
        "model": model, "vocab": logits.shape[1], "threads": args.threads,
        "clock": "thread CPU time" if args.clock == "cpu" else "wall",
        "decode steps": len(step_times), "repeats": args.repeats,
        "plain T=1 step (median)": f"{step * 1e3:.1f} ms", **run_facts(load_before),
    }  # fmt: skip
    print_settings(settings)
    print("\n| setting | rows | old warp+sample ms | new warp+sample ms | new warp ms | speedup "
          "| new / plain step | = old |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    rows = []
    for name, fields in SETTINGS.items():
        for n in args.rows:
            r = measure(logits[:n].contiguous(), SamplingParams(**fields), args.repeats, clock)
            rows.append({"setting": name, "rows": n, **r})
            print(f"| {name} | {n} | {r['old_total_s'] * 1e3:.2f} | {r['new_total_s'] * 1e3:.2f} "
                  f"| {r['new_warp_s'] * 1e3:.2f} | {r['old_total_s'] / r['new_total_s']:.1f}x "
                  f"| {r['new_total_s'] / step:.1%} | {'yes' if r['equal'] else 'NO'} |",
                  flush=True)  # fmt: skip
    settings["load_1min"] = run_facts(load_before)["load_1min"]
    print(f"\nload average (1 min): {settings['load_1min']}")
    if args.json:
        write_json(args.json, settings, rows, step_s=step_times)


if __name__ == "__main__":
    main()
