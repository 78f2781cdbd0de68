"""Benchmark output: a terminal table, one JSON object, PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verispec.drafters.registry import PLAIN

COLUMNS = (  # (header, row field, format, scale)
    ("engine", "engine", "s", 1),
    ("method", "method", "s", 1),
    ("k", "k", "d", 1),
    ("T", "temperature", "g", 1),
    ("top_p", "top_p", "g", 1),
    ("workload", "workload", "s", 1),
    ("conc", "concurrency", "d", 1),
    ("tok/s", "tokens_per_s", ".1f", 1),
    ("TTFT ms", "ttft_s_median", ".0f", 1e3),
    ("p90", "ttft_s_p90", ".0f", 1e3),
    ("ITL ms", "itl_s_median", ".1f", 1e3),
    ("p90", "itl_s_p90", ".1f", 1e3),
    ("TPOT ms", "tpot_s_mean", ".1f", 1e3),
    ("accept", "acceptance_rate", ".2f", 1),
    ("len", "mean_acceptance_length", ".2f", 1),
    ("speedup", "speedup", ".2f", 1),
    ("decode", "decode_speedup", ".2f", 1),
    ("predicted", "predicted_speedup", ".2f", 1),
    ("c", "draft_cost_ratio", ".2f", 1),
    ("step c", "step_cost_ratio", ".2f", 1),
    ("=plain", "greedy_mismatches", "d", 1),
    ("draft/target/verify/other %", "time_fractions", "s", 1),
)
TIME_PHASES = ("draft", "target", "verify", "other")  # schedule and update fold into other


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as aligned text; '-' where a figure does not apply (e.g. acceptance of plain)."""
    cells = [[h for h, *_ in COLUMNS]]
    for row in rows:
        line = []
        for _, key, spec, scale in COLUMNS:
            value = row.get(key)
            if key == "time_fractions" and value is not None:
                line.append("/".join(f"{100 * value[p]:.0f}" for p in TIME_PHASES))
            elif key == "greedy_mismatches" and value is not None:
                line.append("yes" if value == 0 else f"{value} differ")
            elif key == "k":
                line.append("-" if row["method"] == PLAIN else shape(row))
            elif value is None:
                line.append("-")
            else:
                line.append(format(value * scale if scale != 1 else value, spec))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if i > 5 else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    )


def shape(row: dict[str, Any]) -> str:
    """What a row's drafter drafted per step: its chain's k ('4') or its tree ('4x6:16')."""
    if row.get("tree_topk") is None:
        return str(row["k"])
    lookup = f"+{row['tree_lookup']}" if row.get("tree_lookup") else ""
    return f"{row['tree_topk']}x{row['tree_depth']}:{row['budget']}{lookup}"


def verify_table(curve: list[dict[str, Any]]) -> str:
    """The verification-cost curve: one line per model, t(q) in ms and t(q)/t(1)."""
    lines = []
    for model in dict.fromkeys(p["model"] for p in curve):
        points = [p for p in curve if p["model"] == model]
        cells = ", ".join(f"q={p['q']}: {p['ms']:.1f} ms ({p['ratio']:.2f}x)" for p in points)
        lines.append(f"{model}: {cells}")
    return "\n".join(lines)


def write_json(
    path: Path, settings: dict[str, Any], rows: list[dict[str, Any]], **extra: Any
) -> None:
    """One object: settings, rows, and any extra top-level keys (e.g. verify_cost)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "rows": rows, **extra}, indent=1) + "\n")


def write_plots(
    directory: Path, rows: list[dict[str, Any]], curve: list[dict[str, Any]]
) -> list[Path]:
    """speedup_vs_k.png, acceptance_per_position.png, verify_cost.png (when the curve was
    measured) and speedup_vs_concurrency.png (when more than one concurrency was run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    spec_rows = [r for r in rows if r["method"] != PLAIN and r["concurrency"] == 1]

    engines = sorted({r["engine"] for r in spec_rows}, reverse=True)  # verispec first
    fig, axes = plt.subplots(1, max(1, len(engines)), figsize=(12, 4.5), sharey=True, squeeze=False)
    for ax, engine in zip(axes[0], engines, strict=False):
        series: dict[tuple, list[tuple[int, float]]] = {}
        for r in spec_rows:
            if r["engine"] == engine:
                tree = "" if r.get("tree_topk") is None else f" tree {shape(r).split(':')[0]}"
                key = (r["method"] + tree, r["workload"], r["temperature"])
                series.setdefault(key, []).append((r["k"], r["speedup"]))
        for (method, workload, temperature), points in sorted(series.items()):
            ks, speedups = zip(*sorted(points), strict=True)
            style = "-" if temperature == 0 else "--"
            ax.plot(ks, speedups, style, marker="o", label=f"{method} {workload} T={temperature:g}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(xlabel="k (draft tokens or tree nodes per step)",
               title=f"{engine}: speedup over its own plain")  # fmt: skip
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("speedup (tokens/s ratio, same run)")
    written.append(_save(fig, directory / "speedup_vs_k.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in spec_rows:
        rates = r["per_position_acceptance_rate"]
        if rates and r["k"] == max(x["k"] for x in spec_rows):
            label = f"{r['engine']} {r['method']} {r['workload']} T={r['temperature']:g}"
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
    ax.set(xlabel="draft position", ylabel="fraction of steps accepting it", ylim=(0, 1),
           title="Acceptance per position (largest k)")  # fmt: skip
    ax.legend(fontsize=7)
    written.append(_save(fig, directory / "acceptance_per_position.png"))

    if curve:
        fig, ax = plt.subplots(figsize=(6, 4))
        for model in dict.fromkeys(p["model"] for p in curve):
            points = [p for p in curve if p["model"] == model]
            ax.plot([p["q"] for p in points], [p["ratio"] for p in points], marker="o", label=model)
        qs = sorted({p["q"] for p in curve})
        ax.set(xlabel="q (new tokens in one forward)", ylabel="t(q) / t(1)", xscale="log",
               title="Verification cost (warm cache)")  # fmt: skip
        ax.set_xticks(qs, labels=[str(q) for q in qs])
        ax.legend()
        written.append(_save(fig, directory / "verify_cost.png"))

    if len({r["concurrency"] for r in rows}) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        conc: dict[tuple, list[tuple[int, float]]] = {}
        for r in rows:
            if r["method"] != PLAIN:
                key = (r["engine"], r["method"], shape(r), r["workload"], r["temperature"])
                conc.setdefault(key, []).append((r["concurrency"], r["speedup"]))
        for key, points in sorted(conc.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", label=" ".join(map(str, key)))
        ax.set(xlabel="concurrency", ylabel="speedup over plain", title="Speedup vs concurrency")
        ax.legend(fontsize=7)
        written.append(_save(fig, directory / "speedup_vs_concurrency.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
