"""The named Qwen2.5-Coder pair, opt-in (VERISPEC_REAL_PAIR=1: it fetches 1.6 GB once and
loads the 1.5B in transformers as float32, about 7 GB): verispec's greedy chat answers, plain
and with the 0.5B drafting, equal transformers' greedy decoding of the same GGUF file."""

from __future__ import annotations

import os

import pytest
import torch

from verispec import LLM, SamplingParams
from verispec.models.catalog.hub import pull

pytestmark = pytest.mark.skipif(
    os.environ.get("VERISPEC_REAL_PAIR") != "1",
    reason="fetches the 1.6 GB Qwen2.5-Coder pair and runs transformers on it (set "
    "VERISPEC_REAL_PAIR=1)",
)
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPTS = ("Write a Python function that reverses a string.", "What does `git stash` do?")
TOKENS = 24


def transformers_greedy(ids: list[int]) -> list[int]:
    """transformers' own greedy continuation of ids, from its GGUF loader (float32)."""
    from transformers import AutoModelForCausalLM

    path = pull(TARGET, progress=None)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)  # fmt: skip
    out = model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)
    return out[0, len(ids) :].tolist()


def test_greedy_chat_equals_transformers_plain_and_with_the_draft() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    plain = LLM(model=TARGET, speculative=None)
    drafted = LLM(model=TARGET, speculative={"method": "draft_model", "model": DRAFT,
                                             "num_speculative_tokens": 4})  # fmt: skip
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ids = plain.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(getattr(ids, "input_ids", ids))
        ours = plain.generate([ids], params)[0].token_ids
        assert drafted.generate([ids], params)[0].token_ids == ours
        assert ours == transformers_greedy(ids)
