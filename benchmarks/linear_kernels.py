"""The linear kernels verispec can run, timed on decode and verify shapes (1-16 rows).

Each kernel computes y = x W^T for the products of one layer of a model shape, over enough
distinct weight copies that they do not fit the CPU's caches (as in a real forward, where every
weight is read once per step), so the figures are effective weight-streaming bandwidths. All
kernels run interleaved in one process; see benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from verispec.bench.facts import print_settings, run_facts
from verispec.bench.report import write_json
from verispec.models.kernels import packing
from verispec.models.kernels.backends import fp16_kernel_available, onednn_available
from verispec.models.kernels.build import NativeKernel, native_kernel
from verispec.models.kernels.linear import Linear, pack_together

SHAPES = {  # name: [(out, in)] of one decoder layer's fused products
    "llama-125m": [(2304, 768), (768, 768), (6144, 768), (768, 3072)],
    "llama-1b": [(2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632)],
    "embedded": [(1024, 512), (512, 512), (2816, 512), (512, 1408)],
    "smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="llama-125m")
    p.add_argument("--rows", default="1,2,4,5,8,9,16", help="rows of x (tokens in a forward)")
    p.add_argument(
        "--stream-mb",
        type=float,
        default=256.0,
        help="float32 megabytes of distinct weights per timed pass (beyond the caches)",
    )
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    if min(args.rows) < 1 or args.repeats < 1 or args.threads < 1 or args.stream_mb <= 0:
        p.error("--rows, --repeats, --threads must be >= 1 and --stream-mb > 0")
    return args


def kernels_here() -> list[str]:
    out = ["torch", "int8"]
    if onednn_available():
        out.insert(1, "onednn")
    if fp16_kernel_available():
        out.insert(2, "fp16")
    if isinstance(native_kernel(), NativeKernel):
        out += ["native", "native-fp32"]
    return out


def make_linear(kernel: str, weight: torch.Tensor) -> Linear:
    """One layer on one kernel; "native-fp32" is the native kernel over a float32 packing (what
    it streams for weights float16 cannot hold), the other names are Linear's own kernels."""
    if kernel == "int8":
        return Linear(weight, None, "auto", quantization="int8")
    linear = Linear(weight, None, "native" if kernel == "native-fp32" else kernel)
    if kernel == "native-fp32":
        linear.packed = packing.pack(weight, torch.float32)
    return linear


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    layer = SHAPES[args.shape]
    layer_bytes = sum(o * i * 4 for o, i in layer)
    copies = max(1, round(args.stream_mb * 1e6 / layer_bytes))
    gen = torch.Generator().manual_seed(0)
    # float16-exact values, so the fp16 kernel runs the very same weights as the others
    weights = [
        [(torch.randn(o, i, generator=gen) * 0.02).half().float() for o, i in layer]
        for _ in range(copies)
    ]
    kernels = kernels_here()
    linears = {k: [[make_linear(k, w) for w in ws] for ws in weights] for k in kernels}
    for k in ("native", "native-fp32"):  # in one huge-page arena, in pass order, as a model has
        if k in linears:
            pack_together([lin for layer_linears in linears[k] for lin in layer_linears])
    times: dict[tuple[str, int], list[float]] = {(k, m): [] for k in kernels for m in args.rows}
    xs = {m: torch.randn(m, max(i for _, i in layer), generator=gen) for m in args.rows}

    def one_pass(kernel: str, m: int) -> Callable[[], None]:
        def run() -> None:
            for layer_linears in linears[kernel]:
                for lin in layer_linears:
                    lin(xs[m][:, : lin.in_features])

        return run

    plain = [w for ws in weights for w in ws]  # float32 originals, kept for the read reference
    read_times: list[float] = []
    with torch.inference_mode():
        for rnd in range(args.repeats + 1):  # round 0 warms up
            started = time.perf_counter()
            for w in plain:
                w.sum()  # what merely reading the same float32 bytes costs
            if rnd:
                read_times.append(time.perf_counter() - started)
            for m in args.rows:
                for kernel in kernels:
                    run = one_pass(kernel, m)
                    started = time.perf_counter()
                    run()
                    if rnd:
                        times[(kernel, m)].append(time.perf_counter() - started)
            print(f"round {rnd}/{args.repeats}", file=sys.stderr)
    rows = []
    for m in args.rows:
        row: dict[str, object] = {"rows": m}
        for kernel in kernels:
            t = statistics.median(times[(kernel, m)])
            row[f"{kernel}_us_per_layer"] = 1e6 * t / copies
            row[f"{kernel}_fp32_gb_s"] = copies * layer_bytes / t / 1e9
        rows.append(row)
    settings = {
        "shape": args.shape, "layer_products": layer, "copies": copies,
        "fp32_mb_per_pass": copies * layer_bytes / 1e6, "repeats": args.repeats,
        "read_gb_s": copies * layer_bytes / statistics.median(read_times) / 1e9,
        "threads": args.threads,
        **run_facts(load_before),
    }  # fmt: skip
    print_settings(settings)
    print()
    head = " | ".join(kernels)
    print(f"us per layer (float32-equivalent GB/s)\n\n| rows | {head} | fp16 vs onednn |")
    print("|---" * (len(kernels) + 2) + "|")
    for r in rows:
        cells = " | ".join(
            f"{r[f'{k}_us_per_layer']:.0f} ({r[f'{k}_fp32_gb_s']:.0f})" for k in kernels
        )
        ratio = ""
        if "fp16" in kernels and "onednn" in kernels:
            ratio = f"{r['onednn_us_per_layer'] / r['fp16_us_per_layer']:.2f}x"
        print(f"| {r['rows']} | {cells} | {ratio} |")
    if args.json:
        write_json(args.json, settings, rows)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
