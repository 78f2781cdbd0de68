"""Decode and verify steps against the weight-streaming floor, per model, dtype and mode.

For each model: the bytes of weights a decode token must read, this machine's read bandwidth
(measured in the same run), the floor (bytes / bandwidth), the median time of one decode step
and its ratio to the floor; then one verify forward of q = 2, 4, 8, 16 tokens as t(q) / t(1);
and the embedded pair's draft cost ratio c (one draft step / one target step). Eager and
compiled (torch.compile) modes are measured one after the other in the same process.
See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch
from lib.weight_floor import (
    GIB,
    FloorRow,
    interleaved_decode_ms,
    interleaved_greedy_step_ms,
    measure,
    read_bandwidth,
)

from verispec.bench.facts import print_settings, run_facts
from verispec.models.catalog.default import embedded_model_path
from verispec.models.catalog.hub import pull
from verispec.models.kernels.backends import BACKENDS
from verispec.models.kernels.native_layer import can_step_greedily
from verispec.models.weights.loader import load_model

MODELS = {  # label -> (path getter, quantization)
    "smollm2-fp32": (lambda: pull("smollm2-135m-instruct"), None),
    "smollm2-fp16": (lambda: pull("smollm2-135m-instruct"), "fp16"),
    "smollm2-a8": (lambda: pull("smollm2-135m-instruct"), "a8"),  # its codes times 8-bit inputs
    "qwen1.5b": (lambda: pull("qwen2.5-coder-1.5b-instruct"), None),  # Q4_K_M as stored
    "qwen1.5b-a8": (lambda: pull("qwen2.5-coder-1.5b-instruct"), "a8"),
    "qwen0.5b": (lambda: pull("qwen2.5-coder-0.5b-instruct"), None),
    "embedded-target": (lambda: embedded_model_path("target"), None),
    "embedded-draft": (lambda: embedded_model_path("draft"), None),
    "embedded-draft-q8_0": (lambda: embedded_model_path("draft"), "q8_0"),  # lossy: a draft may be
    # as the embedded pair drafts by default where the CPU has AVX-512 VNNI (SpecConfig "auto")
    "embedded-draft-w8a8": (lambda: embedded_model_path("draft"), "w8a8"),
}
QS = (1, 2, 4, 8, 16)
GREEDY_STEPS = 3  # a chain of k = 4 drafts: its first step, then 3 in one call


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, compiled")
    p.add_argument(
        "--backends", default="auto",
        help="comma list of linear backends to load each model with (auto, torch, native, fp16, "
        "onednn), measured one after the other; the mode column names the kernel auto chose",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=20, help="timed rounds per q (medians)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    args.models, args.modes = args.models.split(","), args.modes.split(",")
    args.backends = args.backends.split(",")
    bad = [m for m in args.models if m not in MODELS] + [
        m for m in args.modes if m not in ("eager", "compiled")
    ] + [b for b in args.backends if b not in BACKENDS]
    if bad or args.repeats < 1 or args.threads < 1:
        p.error(f"unknown models, modes or backends {bad}, or --repeats/--threads below 1")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    dram = read_bandwidth(GIB)
    rows: list[FloorRow] = []
    for label in args.models:
        path_of, quantization = MODELS[label]
        for mode, backend in itertools.product(args.modes, args.backends):
            model = load_model(path_of(), torch.float32, torch.device("cpu"), backend,
                               quantization=quantization, compile=mode == "compiled")  # fmt: skip
            kernel = f"{mode}, {model.layers[0].gate_up.kernel}"
            print(f"measuring {label} ({kernel}) ...", file=sys.stderr, flush=True)
            rows.append(measure(model, label, kernel, QS, args.repeats, dram))
            del model
    # The floor takes the faster of two 1 GiB reads, at the start and at the end: one read
    # disturbed by the machine (13.5 GB/s against 20-22 in two of seven runs on 2026-12-01)
    # would otherwise put decode below its floor.
    first, last = dram, read_bandwidth(GIB)
    dram = max(first, last)
    rows = [replace(row, dram_bandwidth=dram) for row in rows]
    settings = {
        "threads": args.threads, "repeats": args.repeats, "context": "256 tokens (warm cache)",
        "dtype": "float32 compute",
        "read bandwidth (1 GiB)": f"{dram / 1e9:.1f} GB/s (start {first / 1e9:.1f}, "
                                  f"end {last / 1e9:.1f})",
        **run_facts(load_before),
    }  # fmt: skip
    print_settings(settings)
    print_table(rows)
    print_draft_cost([label for label in args.models if label.startswith("embedded")],
                     max(args.repeats, 50))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"settings": settings, "rows": [asdict(r) for r in rows]}))


def print_table(rows: list[FloorRow]) -> None:
    print("\n| model | mode | weight MB read / floor | BW GB/s (same size) | floor ms | "
          "decode ms | decode / floor | decode / cached floor | "
          + " | ".join(f"t({q})/t(1)" for q in QS[1:]) + " |")  # fmt: skip
    print("|" + "---|" * (8 + len(QS) - 1))
    for r in rows:
        curve = " | ".join(f"{r.verify_ms[q] / r.decode_ms:.2f}" for q in QS[1:])
        print(f"| {r.model} | {r.mode} | {r.weights.read / 1e6:.0f} / {r.weights.floor / 1e6:.0f} "
              f"| {r.bandwidth / 1e9:.1f} | {r.floor_ms:.1f} | {r.decode_ms:.1f} | {r.ratio:.2f} "
              f"| {r.decode_ms / r.cached_floor_ms:.2f} | {curve} |")  # fmt: skip


def print_draft_cost(labels: list[str], repeats: int) -> None:
    """c = one draft decode step / one target decode step for the embedded pair (the draft as
    stored, and rounded to q8_0), eager, default kernels: the models' steps interleaved in one
    loop (lib.weight_floor.interleaved_decode_ms), so that machine drift touches both alike."""
    drafts = [label for label in labels if label.startswith("embedded-draft")]
    if "embedded-target" not in labels or not drafts:
        return
    models = {}
    for label in ["embedded-target", *drafts]:
        path_of, quantization = MODELS[label]
        models[label] = load_model(path_of(), torch.float32, torch.device("cpu"),
                                   quantization=quantization)  # fmt: skip
    ms = interleaved_decode_ms(models, repeats)
    target = ms["embedded-target"]
    print(f"\ndraft cost ratio c (eager, {repeats} interleaved decode steps each):")
    for label in drafts:
        print(f"  {label}: c = {ms[label]:.2f} / {target:.2f} ms = {ms[label] / target:.2f}")
    print(f"\nc of a greedy draft step after a chain's first ({GREEDY_STEPS} steps in one native "
          f"call, as the draft-model proposer takes them; {repeats} rounds, interleaved):")
    for label in drafts:
        if not can_step_greedily(models[label]):
            print(f"  {label}: - (the model cannot take greedy steps in one call)")
            continue
        t_ms, d_ms = interleaved_greedy_step_ms(models["embedded-target"], models[label],
                                                GREEDY_STEPS, repeats)  # fmt: skip
        print(f"  {label}: c = {d_ms:.2f} / {t_ms:.2f} ms = {d_ms / t_ms:.2f}")


if __name__ == "__main__":
    main()
