"""What each weight group of a model costs for T rows of input against one row: the products
of every layer's q/k/v, o, gate/up and down weights and of the LM head, timed group by group
(median of --repeats calls over all layers), each with the format it is packed in. A verify
step of T tokens is cheap only where every group's T-row product keeps close to its one-row
time (the weights' stream); this names the group that does not. Example:

    python benchmarks/verify_rows.py --model qwen2.5-coder-1.5b-instruct --quantization a8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.models.weights.loader import load_model, resolve_model_path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--quantization", default="a8", help="none: as stored")
    p.add_argument("--rows", default="1,2,4,8", help="comma-separated T; 1 comes first")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = sorted({1, *(int(t) for t in args.rows.split(","))})
    quantization = None if args.quantization == "none" else args.quantization
    model = load_model(resolve_model_path(args.model), torch.float32, torch.device("cpu"),
                       quantization=quantization)  # fmt: skip
    linears = model.linears()
    groups = {"qkv": linears[0:-1:4], "o": linears[1:-1:4], "gate_up": linears[2:-1:4],
              "down": linears[3:-1:4], "head": [linears[-1]]}  # fmt: skip
    ms: dict[tuple[str, int], float] = {}
    with torch.inference_mode():
        for t in rows:
            for name, group in groups.items():
                x = torch.randn(t, group[0].in_features)
                times = []
                for _ in range(args.repeats + 1):  # the first call warms up
                    started = time.perf_counter()
                    for lin in group:
                        lin(x)
                    times.append(time.perf_counter() - started)
                ms[name, t] = 1e3 * statistics.median(times[1:])
    print(f"{args.model} ({quantization or 'as stored'}), {args.threads} threads")
    print("| weights | format | MB | " + " | ".join(f"T={t} ms (x T=1)" for t in rows) + " |")
    print("|---|---|---|" + "---|" * len(rows))
    for name, group in groups.items():
        packed = group[0].packed
        fmt = packed.format.name if packed is not None else group[0].kernel
        mb = sum(lin.packed.bytes for lin in group if lin.packed is not None) / 1e6
        cells = " | ".join(f"{ms[name, t]:.2f} ({ms[name, t] / ms[name, 1]:.2f})" for t in rows)
        print(f"| {name} | {fmt} | {mb:.1f} | {cells} |")
    total = {t: sum(ms[name, t] for name in groups) for t in rows}
    print("| all | | | " + " | ".join(f"{total[t]:.1f} ({total[t] / total[1]:.2f})"
                                       for t in rows) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
