"""The server through the official `openai` client: completions and chat, streamed and not,
n choices, seeds, stop strings, usage, logprobs; greedy answers equal LLM's own."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.serving import speculative_llm
from verispec import LLM, SamplingParams
from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "def add(a, b):"
MESSAGES = [{"role": "user", "content": "for i in range(10):"}]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny-chat"]


def test_greedy_completion_equals_llm_generate(client: openai.OpenAI, reference: LLM) -> None:
    out = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=24,
                                    temperature=0)  # fmt: skip
    expected = reference.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24))[0]
    choice = out.choices[0]
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert out.usage.completion_tokens == len(expected.token_ids)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    spec = out.model_extra["speculation"]  # what speculation did, beside usage
    assert spec["num_draft_tokens"] > 0 and 0 <= spec["num_accepted_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_tokens"] / spec["num_verify_steps"]
    )


def test_greedy_chat_equals_llm_chat(client: openai.OpenAI, reference: LLM) -> None:
    out = client.chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=20,
                                         temperature=0)  # fmt: skip
    expected = reference.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=20))[0]
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected.text
    assert out.usage.completion_tokens == len(expected.token_ids)
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)


def test_max_completion_tokens_and_default_max_tokens(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(messages=MESSAGES, max_completion_tokens=3,
                                         temperature=0, model="tiny-chat")  # fmt: skip
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"
    default = client.completions.create(model="tiny-chat", prompt=PROMPT, temperature=0,
                                        extra_body={"ignore_eos": True})  # fmt: skip
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens


def stream_text(chunks: Iterator) -> tuple[str, list, str | None]:
    """(text of every content delta, the chunks, the finish reason) of a streamed chat."""
    chunks = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    return text, chunks, next((r for r in reasons if r), None)


def test_streamed_chat_equals_the_whole_answer_and_ends_with_usage(
    client: openai.OpenAI, reference: LLM
) -> None:
    stream = client.chat.completions.create(
        model="tiny-chat", messages=MESSAGES, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, chunks, reason = stream_text(stream)
    expected = reference.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=20))[0]
    assert text == expected.text and reason == expected.finish_reason
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(expected.token_ids)
    steps = [c.choices[0].model_extra["speculation"] for c in chunks[1:-1]]
    assert sum(s["num_tokens"] for s in steps) == len(expected.token_ids)
    # each step emits its accepted drafts and one token of the target's own
    assert all(s["num_tokens"] - s["num_accepted_tokens"] in (0, 1) for s in steps)
    assert any(s["num_accepted_tokens"] > 0 for s in steps)
    for chunk, s in zip(chunks[1:-1], steps, strict=True):
        assert chunk.choices[0].delta.content.startswith(s["accepted_text"])
    totals = last.model_extra["speculation"]
    assert totals["num_accepted_tokens"] == sum(s["num_accepted_tokens"] for s in steps)
    assert totals["num_draft_tokens"] == sum(s["num_draft_tokens"] for s in steps)


def test_streamed_completion_without_usage(client: openai.OpenAI, reference: LLM) -> None:
    stream = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=12,
                                       temperature=0, stream=True)  # fmt: skip
    chunks = list(stream)
    expected = reference.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12))[0]
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_choices_and_seed_reproducibility(client: openai.OpenAI) -> None:
    def ask(seed: int) -> list[str]:
        out = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=12, n=2,
                                        temperature=1.0, seed=seed)  # fmt: skip
        assert [c.index for c in out.choices] == [0, 1]
        return [c.text for c in out.choices]

    first, again, other = ask(7), ask(7), ask(8)
    assert first == again  # a seed fixes every choice
    assert first[0] != first[1]  # choices are not copies of each other
    assert first != other


def test_n_choices_stream_by_index(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=8,
                                            temperature=0, n=2, stream=True)  # fmt: skip
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1] != ""  # greedy: both choices are the same answer


def test_a_list_of_prompts_and_token_id_prompts(client: openai.OpenAI, reference: LLM) -> None:
    ids = reference.tokenizer.encode(PROMPT)
    out = client.completions.create(model="tiny-chat", prompt=[PROMPT, "class Point:"],
                                    max_tokens=6, temperature=0)  # fmt: skip
    by_ids = client.completions.create(model="tiny-chat", prompt=ids, max_tokens=6,
                                       temperature=0)  # fmt: skip
    expected = reference.generate([PROMPT, "class Point:"],
                                  SamplingParams(temperature=0, max_tokens=6))  # fmt: skip
    assert [c.text for c in out.choices] == [e.text for e in expected]
    assert by_ids.choices[0].text == expected[0].text


def test_stop_strings_cut_the_answer(client: openai.OpenAI, reference: LLM) -> None:
    full = reference.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24)).pop().text
    stop = full[5:8]
    assert stop and full.find(stop) == 5, "pick a stop string that first occurs at 5"
    for stream in (False, True):
        out = client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=24,
                                        temperature=0, stop=[stop], stream=stream)  # fmt: skip
        chunks = list(out) if stream else [out]
        text = "".join(c.choices[0].text for c in chunks)
        assert text == full[:5]
        assert chunks[-1].choices[0].finish_reason == "stop"


def target_logprobs(path: str, ids: list[int], n: int) -> torch.Tensor:
    """transformers' log-softmax of the target at the last n positions of ids: [n, vocab]."""
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -n - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("speculate", [True, False], ids=["speculative", "plain"])
def test_logprobs_are_the_targets_log_softmax(chat_pair, speculate: bool) -> None:
    llm = (speculative_llm(chat_pair) if speculate
           else LLM(model=str(chat_pair[0]), speculative=None))  # fmt: skip
    with Server(llm.engine, port=0) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        out = client.completions.create(prompt=PROMPT, max_tokens=16, temperature=0.8, seed=3,
                                        logprobs=2, model=server.model_name,
                                        extra_body={"return_token_ids": True})  # fmt: skip
        chat = client.chat.completions.create(
            messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
            model=server.model_name,
        )  # fmt: skip
        spec = out.model_extra["speculation"]
        assert (spec["num_draft_tokens"] > 0) == speculate
    lp = out.choices[0].logprobs
    prompt_ids = out.choices[0].model_extra["prompt_token_ids"]
    out_ids = out.choices[0].model_extra["token_ids"]
    assert prompt_ids == llm.tokenizer.encode(PROMPT) and len(out_ids) == len(lp.tokens)
    expected = target_logprobs(str(chat_pair[0]), prompt_ids + out_ids, len(out_ids))
    got = torch.tensor(lp.token_logprobs)
    want = expected.gather(1, torch.tensor(out_ids)[:, None])[:, 0]
    assert torch.allclose(got, want, atol=1e-4), (got, want)
    assert not torch.all(got == 0)  # vLLM once sent zeros under speculation
    for i, top in enumerate(lp.top_logprobs):  # tokens of equal text share one key
        values = sorted(top.values(), reverse=True)
        best = expected[i].topk(2).values.tolist()
        assert values == pytest.approx(best[: len(values)], abs=1e-4) and values
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-6)  # greedy
        assert bytes(entry.bytes).decode(errors="replace") == entry.token
        assert math.isfinite(entry.logprob)


def test_concurrent_clients_each_get_their_own_greedy_answer(
    server: Server, reference: LLM
) -> None:
    """Eight clients at once, batched together by the engine, and one stream nobody reads
    meanwhile: every answer equals the lone plain answer (batch-invariant mode)."""
    import concurrent.futures

    prompts = [f"def f{i}(x):" for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=16)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    stalled = client.completions.create(model="tiny-chat", prompt="class A:", max_tokens=200,
                                        temperature=0, stream=True,
                                        extra_body={"ignore_eos": True})  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(
            lambda p: client.completions.create(model="tiny-chat", prompt=p, max_tokens=16,
                                                temperature=0).choices[0].text,
            prompts,
        ))  # fmt: skip
    assert answers == [o.text for o in reference.generate(prompts, params)]
    stalled.close()
