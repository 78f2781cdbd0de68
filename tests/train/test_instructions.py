"""Chat instructions for self-distillation: sizes, distinct and disjoint splits, deterministic,
none taken from the benchmark's held-out chat workload; rendered with a chat template."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import verispec
from verispec.train.instructions import (
    FAMILIES,
    all_instructions,
    chat_instructions,
    chat_prompt_ids,
    topics,
)
from verispec.types.chat import chat_prompt

BENCH_CHAT = Path(verispec.__file__).parent / "bench" / "prompts" / "chat.jsonl"
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def bench_prompts() -> list[str]:
    rows = [json.loads(line) for line in BENCH_CHAT.read_text().splitlines() if line.strip()]
    return [m["content"] for row in rows for m in row["messages"] if m["role"] == "user"]


def test_splits_are_large_distinct_and_disjoint() -> None:
    train, heldout = chat_instructions("train"), chat_instructions("heldout")
    assert len(train) >= 2000 and len(heldout) == 64
    assert len(set(train)) == len(train) and len(set(heldout)) == len(heldout)
    assert not set(train) & set(heldout)
    assert all(text.strip() == text and text for text in train + heldout)


def test_lengths_vary_and_kinds_mix() -> None:
    train = chat_instructions("train")
    lengths = sorted(len(t) for t in train)
    assert lengths[0] < 40 and lengths[-1] > 400
    for marker in ("Python", "\n\n", "Summarise", "Translate", "poem", "email", "How do I"):
        assert sum(marker in t for t in train) >= 20, marker
    assert sum("Python" in t for t in chat_instructions("heldout")) >= 3


def test_none_repeats_or_contains_a_benchmark_prompt() -> None:
    bench = bench_prompts()
    assert len(bench) >= 30
    paragraphs = [p for b in bench for p in b.split("\n\n") if len(p) > 60]
    for text in chat_instructions("train") + chat_instructions("heldout"):
        assert not any(b in text for b in bench), text[:80]
        assert not any(p in text for p in paragraphs), text[:80]
        assert "Velmar" not in text


def test_same_list_in_a_fresh_interpreter() -> None:
    """No hash-seeded or random order: another process with another hash seed agrees."""
    code = (
        "import hashlib; from verispec.train.instructions import chat_instructions as c;"
        "print(hashlib.sha256('\\x00'.join(c('train') + c('heldout')).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    here = "\x00".join(chat_instructions("train") + chat_instructions("heldout"))
    assert out.stdout.strip() == hashlib.sha256(here.encode()).hexdigest()


TOPIC_SIZES = {
    "concepts": 66, "terms": 50, "lists": 50, "compare": 40, "stories": 30, "poems": 30,
    "emails": 30, "how_to": 50, "functions": 50, "snippets": 15, "bugs": 12, "advice": 40,
    "facts": 70, "paragraphs": 22,
}  # fmt: skip
"""The size of each topic list when it moved from code (train/instruction_data.py) to data."""


def test_the_topics_file_loads_well_formed() -> None:
    """Every family's fills are in the shipped file: texts, or tuples of as many texts as the
    templates have slots; the same sizes, ends and instructions as when they were code."""
    data = topics()
    assert {name: len(fills) for name, fills in data.items()} == TOPIC_SIZES
    for templates, name, _ in FAMILIES:
        slots = templates[0].count("{}")
        for item in data[name]:
            parts = item if isinstance(item, tuple) else (item,)
            assert len(parts) == slots and all(isinstance(p, str) and p.strip() for p in parts)
    assert data["concepts"][0] == "inflation"
    assert data["facts"][-1] == "How tall is the Eiffel Tower?"
    assert data["lists"][0] == ("three", "ways to reduce stress")
    assert data["compare"][-1] == ("a spreadsheet", "a database")
    assert len(all_instructions()) == 2154


def test_unknown_split_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="unknown split 'test'; allowed: train, heldout"):
        chat_instructions("test")


def test_chat_prompt_ids_render_one_user_turn(tokenizer) -> None:
    templated = copy.deepcopy(tokenizer)
    templated.chat_template = TEMPLATE
    texts = chat_instructions("heldout")[:3]
    ids = chat_prompt_ids(templated, texts)
    assert len(ids) == 3
    for text, got in zip(texts, ids, strict=True):
        assert got == chat_prompt(templated, [{"role": "user", "content": text}], "m")[1]
        assert templated.decode(got).endswith("assistant:")
        assert text.split()[0] in templated.decode(got)


def test_chat_prompt_ids_need_a_chat_template(tokenizer) -> None:
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        chat_prompt_ids(plain, ["Hello"])
