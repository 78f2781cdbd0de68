"""Draw the README's headline plot (docs/headline.png) from the figures of its table.

Nothing is measured here: the figures are copied from docs/benchmarks.md, section
"2026-12-03 07:34-09:09, AMD EPYC Zen 5: Q6_K as stored, a8 pairs widening by chunk", the final
run of `real_pair.py --rounds 3` (decode tokens/s, median of 3 rounds) and its SmolLM2 run.
Rerun after changing a figure there and in README.md: `python benchmarks/plot_headline.py`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

VERISPEC = "#2f6db5"
LLAMA_CPP = "#8c8c8c"


@dataclass(frozen=True)
class Bar:
    """One engine's decode tokens/s as docs/benchmarks.md reports it."""

    label: str
    tokens_per_s: float
    is_verispec: bool


@dataclass(frozen=True)
class Panel:
    """One model's bars, with the title naming the model and the command's settings."""

    title: str
    bars: tuple[Bar, ...]


# docs/benchmarks.md: the Qwen panel from "2026-12-03 11:42-15:57 ...: speculation that pays on
# the Qwen pair" (13:00-13:20 UTC, code_chat, medians of 2 rounds), the SmolLM2 one from
# "2026-12-03 07:34-09:09 ...: Q6_K as stored, a8 pairs widening by chunk" (08:38 UTC).
PANELS = (
    Panel(
        "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, code chat\n(draft: the 0.5B; 256 greedy tokens)",
        (
            Bar("llama.cpp llama-bench", 33.95, False),
            Bar("llama.cpp speculative -md", 20.09, False),
            Bar("verispec plain (a8)", 34.99, True),
            Bar("verispec draft k=3 (a8)", 62.76, True),
            Bar("verispec auto (a8)", 64.07, True),
        ),
    ),
    Panel(
        "SmolLM2-135M-Instruct Q4_1\n(96 greedy tokens)",
        (
            Bar("llama.cpp llama-bench", 156.5, False),
            Bar("verispec plain (exact)", 245.2, True),
            Bar("verispec a8", 259.3, True),
        ),
    ),
)
MACHINE = "AMD EPYC Zen 5, 2 cores (AVX-512 VNNI), 2 threads, 2026-12-03"


def draw(out: Path) -> None:
    """Write one figure: a horizontal bar chart per model, llama.cpp grey, verispec blue."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(10, 3.4), dpi=90)
    for ax, panel in zip(axes, PANELS, strict=True):
        labels = [bar.label for bar in panel.bars]
        values = [bar.tokens_per_s for bar in panel.bars]
        colors = [VERISPEC if bar.is_verispec else LLAMA_CPP for bar in panel.bars]
        ax.barh(labels, values, color=colors)
        ax.invert_yaxis()
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:g}", va="center", fontsize=8)
        ax.set_xlim(0, max(values) * 1.18)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("decode tokens/s (median of the rounds)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(MACHINE, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    """Parse the output path and draw."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/headline.png"))
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
