"""A real model's native products by weight format and path: the bytes each format streams per
token and the time its products take on every instruction set and 8-bit dot product this CPU
runs (build.NativeKernel.paths: AVX-512, AVX2, the 8-bit products' AVX-512 VNNI, AVX-VNNI,
AVX2 vpmaddubsw and scalar loop).

Every native layer of the model is grouped by its WeightFormat; each group's products run
once per repeat over the whole group (more bytes than the caches hold, as in a forward), for
1 and for --rows rows of input, on each path, interleaved in one process so the ratios share
the machine's state. Under --quantization a8 each 8-bit-input group is also timed as the same
layers with exact float inputs (the model loaded again with quantization None: the float
path's formats of the same weights) on the kernel's own path. This is the evidence behind the
rule in docs/design.md ("Dispatch by capability"): where a CPU has both, AVX-512 is taken.

    python benchmarks/kernel_formats.py --model qwen2.5-coder-1.5b-instruct
    python benchmarks/kernel_formats.py --model smollm2-135m-instruct --quantization a8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from lib.weight_floor import read_bandwidth

from verispec import LLM
from verispec.bench.facts import print_settings, run_facts
from verispec.models.kernels.build import NativeKernel, loaded
from verispec.models.kernels.linear import A8_FORMATS, WEIGHT_FORMATS, Linear
from verispec.models.kernels.packing import PackedWeight
from verispec.models.kernels.product import product_on

Group = list[tuple[PackedWeight, PackedWeight | None]]
"""A format's layers: each packed weight, and under a8 the same layer packed for float inputs."""


def native_linears(llm: LLM) -> list[Linear]:
    return [lin for lin in llm.engine.runner.target.model.linears() if lin.packed is not None]


def groups(model: str, quantization: str | None) -> dict[str, Group]:
    """The target's packed weights by what their format holds (WEIGHT_FORMATS' words), each
    with its float-input twin when the model is loaded with 8-bit inputs."""
    llm = LLM(model=model, quantization=quantization, speculative=None)
    linears = native_linears(llm)
    twins: list[PackedWeight | None] = [None] * len(linears)
    if quantization is not None:
        exact = native_linears(LLM(model=model, quantization=None, speculative=None))
        assert len(exact) == len(linears)
        twins = [lin.packed for lin in exact]
    out: dict[str, Group] = defaultdict(list)
    for lin, twin in zip(linears, twins, strict=True):
        assert lin.packed is not None
        out[WEIGHT_FORMATS[lin.packed.format]].append((lin.packed, twin))
    return dict(out)


def label(kernel: NativeKernel) -> str:
    return kernel.isa_name if kernel.isa == 0 else f"{kernel.isa_name} {kernel.dot_name}"


def products(kernel: NativeKernel, weights: list[PackedWeight], rows: int) -> Callable[[], None]:
    """One product of rows random rows with each of weights, on kernel."""
    xs = {w.columns: torch.randn(rows, w.columns) for w in weights}

    def run() -> None:
        for w in weights:
            product_on(kernel, xs[w.columns], w, None)

    return run


def median_times(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Each run's median seconds, the runs interleaved: each repeat times every run once."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--quantization", default=None, help="e.g. a8 (8-bit inputs)")
    p.add_argument("--rows", type=int, default=8, help="rows of the second shape (a verify)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    by_format = groups(args.model, args.quantization)
    kernel = loaded()
    paths = kernel.paths()
    load_before = os.getloadavg()[0]
    print_settings({**run_facts(load_before), "threads": args.threads, "model": args.model,
                    "quantization": args.quantization, "kernel": label(kernel),
                    "read bandwidth (1 GiB)": f"{read_bandwidth() / 1e9:.1f} GB/s"})  # fmt: skip
    names = [label(k) for k in paths]
    print("| format | products | MB | rows | " + " | ".join(f"{n} ms" for n in names)
          + f" | {label(kernel)} GB/s | exact float ({label(kernel)}) ms |")  # fmt: skip
    print("|---" * (6 + len(names)) + "|")
    for name, group in sorted(by_format.items()):
        size = sum(w.bytes for w, _ in group)
        a8 = group[0][0].format in A8_FORMATS
        # the float-input formats run the same code whatever the dot product: one path an isa
        chosen = paths if a8 else [k for k in paths
                                   if k.dot == kernel.lib.verispec_linear_dot(k.isa)]
        weights = [w for w, _ in group]
        twins = [t for _, t in group if t is not None]
        for rows in (1, args.rows):
            runs = {label(k): products(k, weights, rows) for k in chosen}
            if twins:
                runs["float"] = products(kernel, twins, rows)
            medians = median_times(runs, args.repeats)
            cells = " | ".join(f"{medians[n] * 1e3:.2f}" if n in medians else "" for n in names)
            own = medians[label(kernel)]
            exact = f"{medians['float'] * 1e3:.2f}" if "float" in medians else ""
            print(f"| {name} | {len(group)} | {size / 1e6:.1f} | {rows} | {cells} | "
                  f"{size / own / 1e9:.1f} | {exact} |")  # fmt: skip


if __name__ == "__main__":
    main()
