"""A model's decode and verify forwards on each instruction-set path of the native kernel
(VERISPEC_ISA: portable, avx2, avx512 where the CPU has it), the paths taking turns forward by
forward in one process, so that their ratios share the machine's state.

The model is loaded once (its packed weights are the same on every path); before each forward
the kernel is re-read under the path's VERISPEC_ISA. Each forward is q new tokens on the same
warm 256-token cache (rolled back after it, as a rejected draft would be), logits for every
row, as verification needs. Under "a8" the portable path runs the 8-bit products' scalar loop
(what every CPU without AVX-512 VNNI ran before the 256-bit integer tiles) and avx2 runs them
on AVX-VNNI or vpmaddubsw. Example:

    python benchmarks/isa_paths.py --model smollm2-135m-instruct --quantization a8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from lib.weight_floor import read_bandwidth

from verispec.bench.facts import print_settings, run_facts
from verispec.models.kernels.build import ISA_NAMES, isa_cap, loaded, native_kernel
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import load_model, resolve_model_path

CONTEXT = 256


def use_path(name: str) -> str:
    """Set VERISPEC_ISA to name and re-read the kernel; its path's words (isa, dot product)."""
    os.environ["VERISPEC_ISA"] = name
    native_kernel.cache_clear()
    kernel = loaded()
    return f"{kernel.isa_name} {kernel.dot_name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--quantization", default="a8", help="none: exact float inputs")
    p.add_argument("--qs", default="1,2,4,8", help="new tokens a forward; 1 comes first")
    p.add_argument("--paths", default=None, help="comma list of VERISPEC_ISA values "
                   "(default: every one this CPU runs)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    qs = sorted({1, *(int(q) for q in args.qs.split(","))})
    quantization = None if args.quantization == "none" else args.quantization
    cpu = loaded().lib.verispec_linear_isa()  # the CPU's, whatever VERISPEC_ISA says
    names = args.paths.split(",") if args.paths else [n for n, i in ISA_NAMES.items() if i <= cpu]
    for name in names:
        os.environ["VERISPEC_ISA"] = name
        isa_cap()  # an unknown name fails here, not after the load
    load_before = os.getloadavg()[0]
    model = load_model(resolve_model_path(args.model), torch.float32, torch.device("cpu"),
                       quantization=quantization)  # fmt: skip
    paged = PagedModel(model, (CONTEXT + max(qs)) // 16 + 2, 16)
    table = paged.new_table()
    ids = torch.randint(3, model.config.vocab_size, (CONTEXT + max(qs),),
                        generator=torch.Generator().manual_seed(0)).tolist()  # fmt: skip
    words = {name: use_path(name) for name in names}
    times: dict[tuple[str, int], list[float]] = {(n, q): [] for n in names for q in qs}
    with torch.inference_mode():
        paged.forward([append_chunk(table, ids[:CONTEXT], 1)])
        for round_ in range(args.repeats + 1):  # round 0 warms every shape up
            for (name, q), samples in times.items():
                use_path(name)
                started = time.perf_counter()
                paged.forward([append_chunk(table, ids[CONTEXT : CONTEXT + q], q)])
                elapsed = time.perf_counter() - started
                table.truncate(CONTEXT)
                if round_:
                    samples.append(elapsed)
    ms = {key: 1e3 * statistics.median(samples) for key, samples in times.items()}
    print_settings({**run_facts(load_before), "threads": args.threads, "model": args.model,
                    "quantization": args.quantization, "repeats": args.repeats,
                    "context": f"{CONTEXT} tokens (warm cache)",
                    "read bandwidth (1 GiB)": f"{read_bandwidth() / 1e9:.1f} GB/s"})  # fmt: skip
    first = names[0]
    print("| VERISPEC_ISA | path | decode ms | x " + first + " | "
          + " | ".join(f"t({q})/t(1)" for q in qs[1:]) + " |")  # fmt: skip
    print("|---" * (4 + len(qs) - 1) + "|")
    for name in names:
        curve = " | ".join(f"{ms[name, q] / ms[name, 1]:.2f}" for q in qs[1:])
        print(f"| {name} | {words[name]} | {ms[name, 1]:.2f} | "
              f"{ms[name, 1] / ms[first, 1]:.2f} | {curve} |")  # fmt: skip


if __name__ == "__main__":
    main()
