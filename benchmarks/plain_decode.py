"""Plain greedy decoding: verispec (BLAS and torch linears) against transformers' generate().

All engines run interleaved in one process, on the same weights, prompt and threads; every
engine's token ids are checked against transformers'. See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verispec.bench.facts import print_settings, run_facts
from verispec.bench.report import write_json
from verispec.bench.verify_cost import random_llama_125m

RANDOM_125M = "llama-125m"
RANDOM_125M_FP16 = "llama-125m-fp16"
Run = tuple[list[int], float, float, list[float]]  # token ids, wall s, TTFT s, ITL gaps s


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=RANDOM_125M,
                   help="llama-125m, llama-125m-fp16 (the same weights stored in float16), "
                   "embedded, or a directory")  # fmt: skip
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    if min(args.prompt_len, args.repeats, args.threads) < 1 or args.new_tokens < 2:
        p.error("--prompt-len, --repeats, --threads must be >= 1 and --new-tokens >= 2 (for ITL)")
    return args


def resolve_model(name: str) -> Path:
    if name == RANDOM_125M:
        return random_llama_125m()
    if name == RANDOM_125M_FP16:
        return random_llama_125m("float16")
    if name == "embedded":
        from verispec.models.catalog.default import embedded_model_path

        return embedded_model_path("target")
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        sys.exit(f"--model {name}: not llama-125m(-fp16), embedded, or a directory with "
                 "config.json")  # fmt: skip
    return path


def verispec_engine(
    path: Path, backend: str, max_len: int
) -> tuple[Callable[[list[int], int], Run], set[str]]:
    """A run function, and the linear kernels the loaded model uses."""
    from verispec import LLM, SamplingParams

    llm = LLM(model=str(path), dtype="float32", device="cpu", max_model_len=max_len,
              linear_backend=backend)  # fmt: skip
    model = llm.engine.model
    kernels = {model.lm_head.kernel} | {
        lin.kernel
        for layer in model.layers
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
    }

    def run(prompt: list[int], n: int) -> Run:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        out = llm.generate([prompt], params)[0]
        wall = time.perf_counter() - t0
        return out.token_ids, wall, out.metrics.ttft_s or 0.0, list(out.metrics.itl_s)

    return run, kernels


def hf_engine(path: Path) -> tuple[Callable[[list[int], int], Run], int]:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()

    class TimingStreamer(BaseStreamer):
        """Records time.perf_counter() at each put(); generate() puts the prompt first."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def run(prompt: list[int], n: int) -> Run:
        ids = torch.tensor([prompt])
        streamer = TimingStreamer()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=n, min_new_tokens=n, streamer=streamer)  # fmt: skip
            wall = time.perf_counter() - t0
        times = streamer.times[1:]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return out[0, len(prompt) :].tolist(), wall, times[0] - t0, gaps

    return run, sum(p.numel() for p in model.parameters())


def p90(xs: list[float]) -> float:
    import numpy as np

    return float(np.percentile(xs, 90))


def summarise(runs: list[Run]) -> dict[str, float]:
    med = statistics.median
    decode = [(len(ids) - 1) / sum(itl) for ids, _, _, itl in runs]
    return {
        "decode_tok_s": med(decode),
        "e2e_tok_s": med([len(ids) / wall for ids, wall, _, _ in runs]),
        "ttft_med_ms": 1e3 * med([r[2] for r in runs]),
        "ttft_p90_ms": 1e3 * p90([r[2] for r in runs]),
        "itl_med_ms": 1e3 * med([med(r[3]) for r in runs]),
        "itl_p90_ms": 1e3 * med([p90(r[3]) for r in runs]),
    }


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when equal."""
    if a == b:
        return None
    diffs = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(diffs, min(len(a), len(b)))


def thread_env() -> str:
    """Environment variables that change BLAS/OpenMP behaviour, as set for this run."""
    prefixes = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_PRELOAD")
    return " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(prefixes))


def main() -> None:
    args = parse_args()
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    path = resolve_model(args.model)
    hf, n_params = hf_engine(path)
    max_len = args.prompt_len + args.new_tokens
    engines: dict[str, Callable[[list[int], int], Run]] = {"transformers": hf}
    for backend in ("auto", "onednn", "torch"):
        run, kernels = verispec_engine(path, backend, max_len)
        if backend == "auto":
            auto_kernels = kernels
        elif kernels == auto_kernels:
            continue  # the same kernels as auto (e.g. onednn for a float32 checkpoint)
        engines[f"verispec ({backend})"] = run
    print(f"verispec (auto) uses the {'/'.join(sorted(auto_kernels))} linear kernel(s)",
          file=sys.stderr)  # fmt: skip
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist()
    for run in engines.values():  # warm-up: same prompt, a few tokens
        run(prompt, min(args.new_tokens, 8))
    runs: dict[str, list[Run]] = {name: [] for name in engines}
    for rep in range(args.repeats):
        for name, run in engines.items():
            runs[name].append(run(prompt, args.new_tokens))
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)

    reference = runs["transformers"][0][0]
    rows = []
    for name, rs in runs.items():
        row: dict[str, Any] = {"engine": name, **summarise(rs)}
        row["decode_vs_hf"] = row["decode_tok_s"] / summarise(runs["transformers"])["decode_tok_s"]
        bad = [(i, first_mismatch(r[0], reference)) for i, r in enumerate(rs)]
        row["mismatches"] = [{"repeat": i, "first_diff": d} for i, d in bad if d is not None]
        for m in row["mismatches"]:
            print(f"MISMATCH {name} repeat {m['repeat']}: differs from transformers at output "
                  f"position {m['first_diff']}", file=sys.stderr)  # fmt: skip
        row["runs"] = [{"wall_s": w, "ttft_s": t, "itl_s": itl} for _, w, t, itl in rs]
        rows.append(row)

    settings = {
        "model": args.model, "path": str(path), "params": n_params, "dtype": "float32",
        "method": "plain greedy decoding", "auto_kernels": sorted(auto_kernels),
        "concurrency": 1, "threads": args.threads,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats,
        "transformers": transformers.__version__,
        **run_facts(load_before), "env": thread_env(),
    }  # fmt: skip
    print_settings(settings)
    print()
    print("| engine | decode tok/s | e2e tok/s | TTFT med ms | TTFT p90 ms | ITL med ms "
          "| ITL p90 ms | decode vs HF | greedy = HF |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        match = "yes" if not r["mismatches"] else f"NO ({len(r['mismatches'])} runs)"
        print(f"| {r['engine']} | {r['decode_tok_s']:.1f} | {r['e2e_tok_s']:.1f} "
              f"| {r['ttft_med_ms']:.0f} | {r['ttft_p90_ms']:.0f} | {r['itl_med_ms']:.1f} "
              f"| {r['itl_p90_ms']:.1f} | {r['decode_vs_hf']:.2f}x | {match} |")  # fmt: skip
    if args.json:
        write_json(args.json, settings, rows)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
