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


@pytest.mark.parametrize("speculative", [
    "auto",  # the named pair's default drafter: the 0.5B in w4a8, head cut, adaptive
    {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 5},  # as stored
    {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 2,
     "quantization": "w4a8", "draft_vocab_size": 4096},  # a small head: many rejections
    {"method": "ngram", "num_speculative_tokens": 8},
    {"method": "suffix", "num_speculative_tokens": 8},
], ids=["auto", "draft-k5", "draft-w4a8-vocab4096-k2", "ngram-k8", "suffix-k8"])  # fmt: skip
def test_every_drafter_keeps_the_a8_targets_greedy_output(speculative: object) -> None:
    """On the a8 target (8-bit inputs, as llama.cpp computes this file), every drafter's greedy
    answer to a code chat and a code edit equals plain decoding's, token for token."""
    from verispec.bench.workloads import WORKLOADS, prompt_token_ids

    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    plain = LLM(model=TARGET, speculative=None, quantization="a8")
    drafted = LLM(model=TARGET, speculative=speculative, quantization="a8")
    for workload in ("code_chat", "code_edit"):
        ids = prompt_token_ids(plain.tokenizer, WORKLOADS[workload].prompts(1)[0])
        want = plain.generate([ids], params)[0].token_ids
        assert drafted.generate([ids], params)[0].token_ids == want, workload
