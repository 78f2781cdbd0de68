"""A real GGUF pair on this CPU: load time, peak memory and plain vs draft-model decoding on the
bench's chat workloads, with llama.cpp's llama-bench and llama-speculative-simple (plain and
-md) on the same files and prompts beside it when their binaries are given.

Each verispec configuration runs in a fresh process (so its peak RSS is its own) and answers
--prompts prompts spread over each workload's file, one at a time; llama-speculative-simple
answers the same prompts, rendered by verispec's chat template and read from a file, with the
draft model and without one (llama.cpp plain; llama-bench's empty-context rate stands in
without --llama-speculative). Decode figures are medians over the prompts, then over --rounds;
ratios are taken within a round. At temperature 0 every speculative answer is checked equal to
plain decoding of the same numerics; above it, prompt i samples with seed --seed + i.
Example (the Qwen2.5-Coder pair):

    python benchmarks/real_pair.py --target qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --workloads code_chat,code_edit,agentic \
        --llama-bench /path/to/llama-bench --llama-speculative /path/to/llama-speculative-simple
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from lib.llamacpp_tools import (
    SpeculativeRun,
    llama_bench_command,
    parse_llama_bench,
    run_speculative_simple,
    speculative_command,
)
from lib.pair_report import (
    LLAMA_BENCH,
    LLAMA_DRAFT,
    LLAMA_PLAIN,
    Figure,
    format_table,
    plain_of,
    workload_rows,
)

from verispec.bench.engines import Sampling
from verispec.bench.workloads import WORKLOADS, ChatPrompt

MARGIN = 16  # tokens of slack over prompt + answer for llama.cpp's own tokenization


def workload_prompts(args: argparse.Namespace) -> dict[str, list[ChatPrompt]]:
    """The chat prompts of each chosen workload, --prompts of them spread over its file."""
    chosen = {}
    for name in args.workloads.split(","):
        if name not in WORKLOADS or not WORKLOADS[name].chat:
            chats = ", ".join(n for n, w in WORKLOADS.items() if w.chat)
            raise ValueError(f"--workloads takes chat workloads ({chats}); got {name!r}")
        chosen[name] = [p for p in WORKLOADS[name].prompts(args.prompts)
                        if isinstance(p, ChatPrompt)]  # fmt: skip
    return chosen


def sampling(args: argparse.Namespace, workload: str) -> Sampling:
    """What every engine is asked for on a workload (--tokens, else the workload's own)."""
    return Sampling(args.temperature, args.top_p, args.tokens or WORKLOADS[workload].max_tokens,
                    args.seed)  # fmt: skip


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: load, answer every prompt of every workload, report as one JSON line."""
    import torch

    from verispec import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    spec: Any = None  # plain
    if args.method == "auto":  # the target's default drafter, as `verispec chat` runs it
        spec = "auto"
    elif args.method == "draft_model":
        spec = {
            "method": "draft_model",
            "model": args.draft,
            "num_speculative_tokens": args.k,
            "quantization": args.draft_quantization,
            "draft_vocab_size": args.draft_vocab_size,
        }
    elif args.method != "plain":  # a model-free method (ngram, suffix) at depth k
        spec = {"method": args.method, "num_speculative_tokens": args.k}
    numerics = {}  # no :quantization in the config: the library's default numerics
    if args.quantization is not None:
        numerics["quantization"] = None if args.quantization == "none" else args.quantization
    llm = LLM(model=args.target, speculative=spec, **numerics)
    load_s = time.perf_counter() - start
    llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=4))  # warm-up
    workloads = {}
    for name, prompts in workload_prompts(args).items():
        asked = sampling(args, name)
        runs: dict[str, list[Any]] = {"rates": [], "acceptance": [], "tokens": [],
                                      "prompts": [], "prompt_tokens": []}  # fmt: skip
        for i, prompt in enumerate(prompts):
            params = SamplingParams(temperature=asked.temperature, top_p=asked.top_p,
                                    max_tokens=asked.max_tokens, seed=asked.seed + i)  # fmt: skip
            out = llm.chat(list(prompt.messages), params)[0]
            decode_s = sum(out.metrics.itl_s)
            runs["rates"].append((len(out.token_ids) - 1) / decode_s if decode_s else 0.0)
            runs["acceptance"].append(out.metrics.acceptance_rate)
            runs["tokens"].append(out.token_ids)
            runs["prompts"].append(out.prompt)
            runs["prompt_tokens"].append(len(out.prompt_token_ids))
        workloads[name] = runs
    return {
        "config": args.config, "load_s": round(load_s, 1), "workloads": workloads,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
    }  # fmt: skip


def verispec_runs(args: argparse.Namespace, round_number: int,
                  figures: list[Figure]) -> dict[str, Any] | None:  # fmt: skip
    """Every verispec configuration once, each in a fresh process; adds their figures, prints
    them, then whether each answer equals plain decoding's. Returns the first result (its
    rendered prompts feed llama.cpp), if any ran."""
    results: dict[str, dict[str, Any]] = {}
    for config in args.configs.split(","):
        settings, _, k = config.partition("@")
        method, _, quantization = settings.partition(":")
        command = [sys.executable, __file__, "--one", "--config", config, "--method", method,
                   *forwarded(args, int(k) if k else args.k)]  # fmt: skip
        if quantization:
            command += ["--quantization", quantization]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{config}: failed\n{done.stderr[-2000:]}")
            continue
        result = results[config] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{config}: load {result['load_s']:.1f} s, peak RSS {result['peak_rss_gb']:.2f} GB")
        for name, runs in result["workloads"].items():
            rate = statistics.median(runs["rates"])
            accepted = [a for a in runs["acceptance"] if a is not None]
            acceptance = statistics.median(accepted) if accepted else None
            figures.append(Figure(round_number, name, config, rate, acceptance))
            shown = "-" if acceptance is None else f"{acceptance:.3f}"
            print(f"  {name:>10}: decode {rate:6.2f} tok/s, acceptance {shown}")
    if args.temperature == 0:
        for config, result in results.items():
            if plain_of(config) != config:
                print(f"{config}: {same_tokens(result, results.get(plain_of(config)))}")
    return next(iter(results.values()), None)


def forwarded(args: argparse.Namespace, k: int) -> list[str]:
    """The options a configuration's own process needs, as command-line words."""
    words = ["--target", args.target, "--draft", args.draft, "--k", str(k), "--threads",
             str(args.threads), "--workloads", args.workloads, "--prompts", str(args.prompts),
             "--temperature", str(args.temperature), "--top-p", str(args.top_p), "--seed",
             str(args.seed)]  # fmt: skip
    if args.tokens:
        words += ["--tokens", str(args.tokens)]
    if args.draft_quantization:
        words += ["--draft-quantization", args.draft_quantization]
    if args.draft_vocab_size:
        words += ["--draft-vocab-size", str(args.draft_vocab_size)]
    return words


def same_tokens(result: dict[str, Any], plain: dict[str, Any] | None) -> str:
    """Whether a run's greedy answers equal plain decoding's, prompt by prompt, per workload."""
    if plain is None:
        return "not compared: no plain run of the same numerics"
    counts = {}
    for name, runs in result["workloads"].items():
        pairs = zip(runs["tokens"], plain["workloads"][name]["tokens"], strict=True)
        counts[name] = (sum(a == b for a, b in pairs), len(runs["tokens"]))
    same = all(equal == total for equal, total in counts.values())
    each = ", ".join(f"{name} {equal}/{total}" for name, (equal, total) in counts.items())
    return f"{'equal to plain' if same else 'DIFFERENT FROM PLAIN'} ({each} prompts)"


def llama_runs(args: argparse.Namespace, round_number: int, rendered: dict[str, Any] | None,
               figures: list[Figure]) -> None:  # fmt: skip
    """llama-bench on both files, and llama-speculative-simple plain and -md on every prompt of
    every workload (rendered by verispec's chat template); adds the figures."""
    from verispec.models.weights.loader import resolve_model_path

    target, draft = (str(resolve_model_path(n)) for n in (args.target, args.draft))
    bench_tokens = args.tokens or max(WORKLOADS[w].max_tokens for w in args.workloads.split(","))
    if args.llama_bench:
        for name, path in dict.fromkeys(((args.target, target), (args.draft, draft))):
            command = llama_bench_command(args.llama_bench, path, args.threads, bench_tokens)
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rate = parse_llama_bench(done.stdout)
            print(f"llama-bench {name}: decode {rate:.2f} tok/s (empty context, {bench_tokens} "
                  "tokens)")  # fmt: skip
            if path == target:
                figures.extend(Figure(round_number, w, LLAMA_BENCH, rate)
                               for w in args.workloads.split(","))  # fmt: skip
    if not args.llama_speculative:
        return
    if rendered is None:
        print("llama-speculative-simple skipped: no verispec run rendered the prompts")
        return
    for workload, runs in rendered["workloads"].items():
        for config, model in ((LLAMA_PLAIN, None), (LLAMA_DRAFT, draft)):
            prompts = zip(runs["prompts"], runs["prompt_tokens"], strict=True)
            try:
                outcome = [speculative_run(args, workload, target, model, i, text, count)
                           for i, (text, count) in enumerate(prompts)]  # fmt: skip
            except ValueError as e:
                print(f"{config} {workload}: failed: {e}")
                continue
            rate = statistics.median(r.tokens_per_s for r in outcome)
            accepted = [r.acceptance for r in outcome if r.acceptance is not None]
            acceptance = statistics.median(accepted) if accepted else None
            figures.append(Figure(round_number, workload, config, rate, acceptance))
            shown = "-" if acceptance is None else f"{acceptance:.3f} (n_max {args.k})"
            print(f"{config} {workload:>10}: decode {rate:6.2f} tok/s, acceptance {shown}")


def speculative_run(args: argparse.Namespace, workload: str, target: str, draft: str | None,
                    index: int, text: str, prompt_tokens: int) -> SpeculativeRun:  # fmt: skip
    """One llama-speculative-simple answer to one rendered prompt (no draft: plain)."""
    asked = sampling(args, workload)
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        command = speculative_command(
            args.llama_speculative, target, f.name, asked, args.threads, seed=asked.seed + index,
            draft=draft, k=args.k, context_tokens=prompt_tokens + asked.max_tokens + MARGIN,
        )  # fmt: skip
        run = run_speculative_simple(command)
    if draft is None and run.drafted:
        raise ValueError(f"llama-speculative-simple drafted {run.drafted} tokens without a draft")
    return run


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--k", type=int, default=4, help="draft tokens a step (verispec, llama.cpp)")
    p.add_argument("--workloads", default="code_chat",
                   help="comma-separated chat workloads of verispec/bench/prompts (code_chat, "
                   "code_edit, agentic, chat)")  # fmt: skip
    p.add_argument(
        "--prompts", type=int, default=4, help="prompts per workload, spread over its file"
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="most tokens an answer (default: each workload's own max_tokens)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling above T=0")
    p.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i (T>0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-bench", help="path to llama.cpp's llama-bench binary")
    p.add_argument("--llama-speculative", help="path to llama.cpp's llama-speculative-simple: "
                   "adds llama.cpp plain and -md on the same prompts")  # fmt: skip
    p.add_argument("--configs", default="plain,plain:none,draft_model",
                   help="comma-separated method[:quantization][@k] runs (none: exact floats; "
                   "without one, the library's default numerics); method plain, auto "
                   "(the target's default drafter), draft_model, ngram or suffix; k defaults "
                   "to --k")  # fmt: skip
    p.add_argument(
        "--draft-quantization",
        default=None,
        help="the draft's own quantization (e.g. a8: never changes the output)",
    )
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="ids the draft's LM head keeps (default: the whole vocabulary)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat everything, alternating the engines; medians and ratios at the end",
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    for name in ("--config", "--method", "--quantization"):
        p.add_argument(name, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prompts < 1 or args.rounds < 1 or (args.tokens is not None and args.tokens < 1):
        p.error("--prompts, --rounds and --tokens must be >= 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error(f"need --temperature >= 0 and 0 < --top-p <= 1, got {args.temperature}, "
                f"{args.top_p}")  # fmt: skip
    try:
        workload_prompts(args)
    except ValueError as e:
        p.error(str(e))
    return args


def main() -> None:
    args = parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    mode = "greedy" if args.temperature == 0 else f"T={args.temperature}, top-p {args.top_p}"
    print(
        f"# {platform.processor() or platform.machine()}, {args.threads} threads, {mode}, "
        f"workloads {args.workloads}, {args.prompts} prompts each, {args.rounds} rounds"
    )
    figures: list[Figure] = []
    for round_number in range(1, args.rounds + 1):
        print(f"## round {round_number}")
        rendered = verispec_runs(args, round_number, figures)
        llama_runs(args, round_number, rendered, figures)
    print(f"## medians over {args.rounds} rounds (ratios within a round)")
    for workload in args.workloads.split(","):
        print("\n" + format_table(workload, workload_rows(figures, workload)))


if __name__ == "__main__":
    main()
