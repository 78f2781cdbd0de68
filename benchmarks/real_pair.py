"""A real GGUF pair on this CPU: load time, peak memory and plain vs draft-model decoding, with
llama.cpp's own llama-bench and llama-speculative-simple (-md) on the same files beside it
when their binaries are given.

Each configuration runs in a fresh process (so its peak RSS is its own); the decode figures
are medians over the prompts, greedy, one prompt at a time, and every speculative answer is
checked equal to the plain one. Example (the Qwen2.5-Coder pair):

    python benchmarks/real_pair.py --target qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --llama-bench /path/to/llama-bench \
        --llama-speculative /path/to/llama-speculative-simple
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case.",
    "Write a Python function that merges two sorted lists into one sorted list.",
)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: load, answer every prompt, report figures as one JSON line."""
    import torch

    from verispec import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    spec: Any = None
    if args.method == "draft_model":
        spec = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k,
                "quantization": args.draft_quantization}
    llm = LLM(model=args.target, speculative=spec, quantization=args.quantization)
    load_s = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=4))  # warm-up
    rates, texts, accepted = [], [], []
    for prompt in PROMPTS:
        out = llm.chat([{"role": "user", "content": prompt}], params)[0]
        gaps = out.metrics.itl_s
        decode_s = sum(gaps) if gaps else 0.0
        rates.append((len(out.token_ids) - 1) / decode_s if decode_s else 0.0)
        texts.append(out.token_ids)
        accepted.append(out.metrics.acceptance_rate)
    return {
        "method": args.method, "quantization": args.quantization, "load_s": round(load_s, 1),
        "decode_tok_s": round(statistics.median(rates), 2),
        "acceptance": None if args.method == "plain" else [round(a or 0, 2) for a in accepted],
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
        "tokens": texts,
    }  # fmt: skip


def llama_bench(binary: str, model_path: str, threads: int, tokens: int) -> float:
    """llama-bench's decode tokens/s (tg) on the same file and threads."""
    done = subprocess.run([binary, "-m", model_path, "-t", str(threads), "-p", "0", "-n",
                           str(tokens), "-o", "json"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    rows = json.loads(done.stdout)
    return float(next(r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0))


def llama_speculative(binary: str, target: str, draft: str, threads: int, tokens: int,
                      k: int) -> tuple[float, float]:  # fmt: skip
    """llama-speculative-simple's decode tokens/s and acceptance (-md draft, n_max k, greedy)
    on the first prompt in ChatML, the same files and threads."""
    prompt = f"<|im_start|>user\n{PROMPTS[0]}<|im_end|>\n<|im_start|>assistant\n"
    done = subprocess.run([binary, "-m", target, "-md", draft, "--spec-type", "draft-simple",
                           "--spec-draft-n-max", str(k), "-t", str(threads), "-td", str(threads),
                           "-n", str(tokens), "--temp", "0", "-p", prompt],
                          capture_output=True, text=True, check=True)  # fmt: skip
    log = done.stdout + done.stderr
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)", log)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", log)
    if speed is None or accept is None:
        raise ValueError(f"unexpected llama-speculative-simple output: {log[-500:]}")
    return float(speed.group(1)), float(accept.group(1)) / 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-bench", help="path to llama.cpp's llama-bench binary")
    p.add_argument("--llama-speculative", help="path to llama.cpp's llama-speculative-simple")
    p.add_argument("--configs", default="plain,plain:a8,draft_model",
                   help="comma-separated method[:quantization] runs")  # fmt: skip
    p.add_argument("--draft-quantization", default=None,
                   help="the draft's own quantization (e.g. a8: never changes the output)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat everything, alternating the engines; medians and ratios at the end")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--method", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--quantization", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    print(f"# {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"{args.tokens} tokens, greedy, {len(PROMPTS)} code prompts, {args.rounds} rounds")
    rates: dict[str, list[float]] = {}
    for round_number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"## round {round_number}")
        for name, rate in run_round(args):
            rates.setdefault(name, []).append(rate)
    if args.rounds > 1:
        summarize(rates)


def run_round(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Every configuration once (a fresh process each), then llama.cpp's tools: (name, decode
    tokens/s) pairs, printed as they come."""
    rates, results = [], []
    for config in args.configs.split(","):
        method, _, quantization = config.partition(":")
        command = [sys.executable, __file__, "--one", "--method", method, "--target",
                   args.target, "--draft", args.draft, "--k", str(args.k), "--tokens",
                   str(args.tokens), "--threads", str(args.threads)]  # fmt: skip
        if args.draft_quantization:
            command += ["--draft-quantization", args.draft_quantization]
        if quantization:
            command += ["--quantization", quantization]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{config}: failed\n{done.stderr[-2000:]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        plain = next(r for r in results if r["quantization"] == result["quantization"])
        same = result["tokens"] == plain["tokens"]  # the first run of the same target numerics
        numerics = result["quantization"] or "exact"
        print(f"{config:>16}: decode {result['decode_tok_s']:6.2f} tok/s, load "
              f"{result['load_s']:5.1f} s, peak RSS {result['peak_rss_gb']:.2f} GB, acceptance "
              f"{result['acceptance']}, same tokens as the first {numerics} run: "
              f"{same}")  # fmt: skip
        rates.append((config, result["decode_tok_s"]))
    from verispec.models.weights.loader import resolve_model_path

    if args.llama_bench:
        for name in dict.fromkeys((args.target, args.draft)):
            rate = llama_bench(args.llama_bench, str(resolve_model_path(name)), args.threads,
                               args.tokens)  # fmt: skip
            print(f"llama-bench {name}: decode {rate:.2f} tok/s")
            rates.append((f"llama-bench {name}", rate))
    if args.llama_speculative:
        rate, accepted = llama_speculative(
            args.llama_speculative, str(resolve_model_path(args.target)),
            str(resolve_model_path(args.draft)), args.threads, args.tokens, args.k,
        )  # fmt: skip
        print(f"llama-speculative-simple -md, n_max {args.k}: decode {rate:.2f} tok/s, "
              f"{accepted:.1%} of drafts accepted (first prompt)")  # fmt: skip
        rates.append(("llama-speculative-simple -md", rate))
    return rates


def summarize(rates: dict[str, list[float]]) -> None:
    """Medians over the rounds, and each configuration's median per-round ratio to llama-bench
    on the target (rounds alternate the engines, so a ratio compares runs minutes apart)."""
    print("## medians over rounds")
    peer = next((name for name in rates if name.startswith("llama-bench")), None)
    for name, values in rates.items():
        line = f"{name:>32}: {statistics.median(values):6.2f} tok/s"
        if peer and name != peer and len(rates[peer]) == len(values):
            ratios = [v / p for v, p in zip(values, rates[peer], strict=True)]
            each = ", ".join(f"{r:.2f}" for r in ratios)
            line += f", {statistics.median(ratios):.2f}x {peer} (rounds: {each})"
        print(line)

if __name__ == "__main__":
    main()
