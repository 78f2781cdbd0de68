"""The pair benchmark's tables: medians over rounds, ratios within a round, references."""

from __future__ import annotations

import pytest

from benchmarks.lib.pair_report import (
    LLAMA_BENCH,
    LLAMA_DRAFT,
    LLAMA_PLAIN,
    Figure,
    Row,
    format_table,
    median_ratio,
    plain_of,
    workload_rows,
)


def test_plain_of_keeps_the_numerics() -> None:
    assert plain_of("plain") == "plain" and plain_of("plain:a8") == "plain:a8"
    assert plain_of("draft_model:a8") == "plain:a8" and plain_of("draft_model") == "plain"
    assert plain_of(LLAMA_DRAFT) == "plain" and plain_of(LLAMA_BENCH) == "plain"


def test_ratios_are_taken_within_a_round() -> None:
    """Round 2 ran on a machine twice as fast: per-round ratios stay 2.0 while the ratio of
    the medians over rounds would not."""
    figures = [Figure(1, "w", "plain", 10.0), Figure(1, "w", "draft_model", 20.0, 0.8),
               Figure(2, "w", "plain", 20.0), Figure(2, "w", "draft_model", 40.0, 0.7),
               Figure(3, "w", "draft_model", 99.0, 0.9)]  # fmt: skip
    assert median_ratio(figures, "draft_model", "plain") == 2.0  # round 3 has no plain run
    assert median_ratio(figures, "draft_model", LLAMA_PLAIN) is None
    rows = workload_rows(figures, "w")
    assert rows[0] == Row("plain", 15.0, 1.0, None, None)
    assert rows[1] == Row("draft_model", 40.0, 2.0, None, 0.8)


def test_workload_rows_compare_with_the_fastest_llama_cpp_row() -> None:
    """Against the fastest of llama.cpp's rows of the round (llama-bench, plain and -md on the
    same prompts); each config against verispec plain of its own numerics; one workload's
    figures only."""
    figures = [
        Figure(1, "code_chat", "plain", 30.0), Figure(1, "code_chat", "plain:a8", 40.0),
        Figure(1, "code_chat", "draft_model:a8", 80.0, 0.75),
        Figure(1, "code_chat", LLAMA_BENCH, 33.0), Figure(1, "code_chat", LLAMA_PLAIN, 20.0),
        Figure(1, "code_chat", LLAMA_DRAFT, 10.0, 0.9), Figure(1, "agentic", "plain", 1.0),
    ]  # fmt: skip
    rows = {r.config: r for r in workload_rows(figures, "code_chat")}
    assert list(rows) == ["plain", "plain:a8", "draft_model:a8", LLAMA_BENCH, LLAMA_PLAIN,
                          LLAMA_DRAFT]  # fmt: skip
    assert rows["draft_model:a8"].vs_plain == 2.0
    assert rows["draft_model:a8"].vs_llama == pytest.approx(80 / 33)  # llama-bench: fastest
    assert rows[LLAMA_DRAFT].vs_plain == pytest.approx(1 / 3)
    assert rows[LLAMA_DRAFT].vs_llama == pytest.approx(10 / 33)
    assert rows[LLAMA_BENCH].vs_llama == 1.0 and rows[LLAMA_DRAFT].acceptance == 0.9
    faster_draft = [*figures, Figure(2, "code_chat", "plain", 30.0),
                    Figure(2, "code_chat", LLAMA_DRAFT, 60.0)]  # fmt: skip
    ratios = {r.config: r.vs_llama for r in workload_rows(faster_draft, "code_chat")}
    assert ratios["plain"] == pytest.approx((30 / 33 + 30 / 60) / 2)  # each round's fastest


def test_format_table() -> None:
    rows = [Row("plain", 30.0, 1.0, 1.5, None), Row(LLAMA_DRAFT, 12.344, 0.41, None, 0.8971)]
    assert format_table("code_edit", rows).splitlines() == [
        "### code_edit",
        "",
        "| config | decode tok/s | x verispec plain | x best llama.cpp | acceptance |",
        "|---|---|---|---|---|",
        "| plain | 30.00 | 1.00 | 1.50 |  |",
        "| llama.cpp -md | 12.34 | 0.41 |  | 0.897 |",
    ]
