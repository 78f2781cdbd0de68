"""A real model's native products by weight format and instruction set: the bytes each format
streams per token and the rate it streams them at, AVX-512 against AVX2 on the same weights.

Every native layer of the model is grouped by its WeightFormat; each group's products run
once per repeat over the whole group (more bytes than the caches hold, as in a forward), for
1 and for --rows rows of input, with each instruction-set path this CPU runs, interleaved in
one process so the ratios share the machine's state. This is the evidence behind the rule in
docs/design.md ("Dispatch by capability"): where a CPU has both, AVX-512 is taken.

    python benchmarks/kernel_formats.py --model qwen2.5-coder-1.5b-instruct
    python benchmarks/kernel_formats.py --model smollm2-135m-instruct --quantization a8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch

from verispec import LLM
from verispec.bench.floor import read_bandwidth
from verispec.cli.bench import print_settings, run_facts
from verispec.models.kernels.build import NativeKernel, loaded
from verispec.models.kernels.linear import WEIGHT_FORMATS
from verispec.models.kernels.packing import PackedWeight
from verispec.models.kernels.product import product_on

ISA_NAMES = {1: "avx2", 2: "avx512"}


def native_weights(llm: LLM) -> dict[str, list[PackedWeight]]:
    """The target's packed weights, by what their format holds (WEIGHT_FORMATS' words)."""
    groups: dict[str, list[PackedWeight]] = defaultdict(list)
    for linear in llm.engine.runner.target.model.linears():
        if linear.packed is not None:
            groups[WEIGHT_FORMATS[linear.packed.format]].append(linear.packed)
    return dict(groups)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--quantization", default=None, help="e.g. a8 (8-bit inputs)")
    p.add_argument("--rows", type=int, default=8, help="rows of the second shape (a verify)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, quantization=args.quantization, speculative=None)
    kernel = loaded()
    kernels = [NativeKernel(kernel.lib, isa, isa == 2 and kernel.vnni)
               for isa in range(1, kernel.isa + 1)]  # fmt: skip
    load_before = os.getloadavg()[0]
    print_settings({**run_facts(load_before), "threads": args.threads, "model": args.model,
                    "quantization": args.quantization,
                    "read bandwidth (1 GiB)": f"{read_bandwidth() / 1e9:.1f} GB/s"})  # fmt: skip
    print("| format | products | MB | rows | " + " | ".join(
        f"{ISA_NAMES[k.isa]} ms | {ISA_NAMES[k.isa]} GB/s" for k in kernels)
        + " | avx512 / avx2 |" * (len(kernels) == 2))  # fmt: skip
    print("|---" * (4 + 2 * len(kernels) + (len(kernels) == 2)) + "|")
    for name, weights in sorted(native_weights(llm).items()):
        size = sum(w.bytes for w in weights)
        for rows in (1, args.rows):
            xs = {w.columns: torch.randn(rows, w.columns) for w in weights}
            times: dict[int, list[float]] = {k.isa: [] for k in kernels}
            for _ in range(args.repeats):
                for k in kernels:  # interleaved: each repeat times every path once
                    start = time.perf_counter()
                    for w in weights:
                        product_on(k, xs[w.columns], w, None)
                    times[k.isa].append(time.perf_counter() - start)
            medians = {isa: statistics.median(t) for isa, t in times.items()}
            cells = " | ".join(f"{medians[k.isa] * 1e3:.2f} | {size / medians[k.isa] / 1e9:.1f}"
                               for k in kernels)  # fmt: skip
            ratio = f" | {medians[2] / medians[1]:.2f} |" if len(kernels) == 2 else " |"
            print(f"| {name} | {len(weights)} | {size / 1e6:.1f} | {rows} | {cells}{ratio}")


if __name__ == "__main__":
    main()
