"""The named Qwen2.5-Coder pair, opt-in (VERISPEC_REAL_PAIR=1: it fetches 1.6 GB once and
loads the 1.5B in transformers as float32, about 7 GB): verispec's greedy chat answers, plain
and with the 0.5B drafting, equal transformers' greedy decoding of the same GGUF file."""

from __future__ import annotations

import json
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
    plain = LLM(model=TARGET, speculative=None, quantization=None)  # transformers' numerics
    drafted = LLM(model=TARGET, speculative={"method": "draft_model", "model": DRAFT,
                                             "num_speculative_tokens": 4},
                  quantization=None)  # fmt: skip
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


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}  # fmt: skip


def test_tools_and_json_schema_through_the_server_on_the_real_pair() -> None:
    """Qwen2.5's own template renders the tools; with tool_choice "required" (the Coder models
    answer "auto" with a fenced JSON object instead of a <tool_call> block: docs/serving.md)
    the a8 1.5B with its drafter calls the function, parsed into tool_calls; a JSON-schema
    answer validates; both equal the same request with speculation off."""
    import jsonschema
    import openai

    from verispec.serve import Server

    llm = LLM(model=TARGET, speculative="auto", quantization="a8")
    with Server(llm.engine, port=0, model_name=TARGET) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
        answers = [client.chat.completions.create(
            model=TARGET, messages=messages, tools=[WEATHER], tool_choice="required",
            temperature=0, max_tokens=64, extra_body={"speculative": on}) for on in (True, False)]
        calls = [a.choices[0].message.tool_calls for a in answers]
        assert calls[0] and calls[0][0].function.name == "get_weather"
        assert "Paris" in calls[0][0].function.arguments
        assert answers[0].choices[0].finish_reason == "tool_calls"
        assert [c.function.arguments for c in calls[0]] == [c.function.arguments
                                                           for c in calls[1] or []]
        schema = {"type": "object", "additionalProperties": False,
                  "required": ["language", "year"],
                  "properties": {"language": {"type": "string"}, "year": {"type": "integer"}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "lang", "schema": schema,
                                                      "strict": True}}
        texts = [client.chat.completions.create(
            model=TARGET, messages=[{"role": "user", "content": "Which language did Guido van "
                                     "Rossum create, and in which year was it released?"}],
            response_format=fmt, temperature=0, max_tokens=64,
            extra_body={"speculative": on}).choices[0].message.content for on in (True, False)]
        assert texts[0] == texts[1]
        jsonschema.validate(json.loads(texts[0]), schema)
