"""The pair benchmark's tables (benchmarks/real_pair.py): per workload, each configuration's
decode tokens/s (median over rounds of its median over prompts), its ratios to verispec plain
decoding with the same numerics and to the fastest of llama.cpp's rows of the same round
(llama-bench, llama.cpp plain, llama.cpp -md: medians over rounds of the ratio within a round;
rounds alternate the engines, so one round's runs are minutes apart), and its acceptance.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

LLAMA_PLAIN = "llama.cpp plain"
"""llama-speculative-simple without a draft, on the workload's prompts."""
LLAMA_DRAFT = "llama.cpp -md"
"""llama-speculative-simple with the draft model, on the workload's prompts."""
LLAMA_BENCH = "llama-bench tg"
"""llama-bench's decode rate on an empty context: the llama.cpp plain reference without
llama-speculative-simple."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One configuration on one workload in one round: medians over the prompts."""

    round: int
    workload: str
    config: str  # a verispec method[:quantization], or one of the LLAMA_ names
    tokens_per_s: float
    acceptance: float | None = None  # None: nothing drafted


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a workload's table."""

    config: str
    tokens_per_s: float
    vs_plain: float | None  # x verispec plain with the same numerics
    vs_llama: float | None  # x the fastest llama.cpp row of the round (LLAMA_ROWS)
    acceptance: float | None


def plain_of(config: str) -> str:
    """The verispec plain configuration a configuration is compared with: the same numerics
    (its quantization); llama.cpp's rows against exact plain decoding.

    >>> plain_of("draft_model:a8"), plain_of("ngram:a8@8"), plain_of("auto"), plain_of(LLAMA_DRAFT)
    ('plain:a8', 'plain:a8', 'plain', 'plain')
    """
    if config.startswith("llama"):
        return "plain"
    quantization = config.partition("@")[0].partition(":")[2]  # "@k" sets only the depth
    return f"plain:{quantization}" if quantization else "plain"


LLAMA_ROWS = (LLAMA_BENCH, LLAMA_PLAIN, LLAMA_DRAFT)


def median_ratio(figures: list[Figure], config: str, *references: str) -> float | None:
    """The median over rounds of config's tokens/s over the fastest of references' in the same
    round (of one workload's figures); None when no round has both.

    >>> f = [Figure(1, "w", "a", 30.0), Figure(1, "w", "b", 10.0), Figure(1, "w", "c", 20.0)]
    >>> median_ratio(f, "a", "b", "c")
    1.5
    """
    by_round = {(f.round, f.config): f.tokens_per_s for f in figures}
    ratios = []
    for (r, c), rate in by_round.items():
        best = max((by_round.get((r, ref), 0.0) for ref in references), default=0.0)
        if c == config and best:
            ratios.append(rate / best)
    return statistics.median(ratios) if ratios else None


def workload_rows(figures: list[Figure], workload: str) -> list[Row]:
    """A workload's table rows, configurations in the order they first ran."""
    mine = [f for f in figures if f.workload == workload]
    configs = list(dict.fromkeys(f.config for f in mine))
    rows = []
    for config in configs:
        runs = [f for f in mine if f.config == config]
        accepted = [f.acceptance for f in runs if f.acceptance is not None]
        rows.append(Row(
            config, statistics.median(f.tokens_per_s for f in runs),
            median_ratio(mine, config, plain_of(config)), median_ratio(mine, config, *LLAMA_ROWS),
            statistics.median(accepted) if accepted else None,
        ))  # fmt: skip
    return rows


def format_table(workload: str, rows: list[Row]) -> str:
    """A workload's rows as a markdown table under a heading."""

    def cell(value: float | None, spec: str) -> str:
        return "" if value is None else format(value, spec)

    lines = [f"### {workload}", "",
             "| config | decode tok/s | x verispec plain | x best llama.cpp | acceptance |",
             "|---|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {r.config} | {r.tokens_per_s:.2f} | {cell(r.vs_plain, '.2f')} | "
        f"{cell(r.vs_llama, '.2f')} | {cell(r.acceptance, '.3f')} |"
        for r in rows
    ]
    return "\n".join(lines)
