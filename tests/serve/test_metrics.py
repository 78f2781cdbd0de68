"""/metrics: Prometheus' text format, parsed with prometheus_client's own parser; its counters
equal what the responses said about the requests sent."""

from __future__ import annotations

import sys
from collections import defaultdict

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.serving import call, speculative_llm, wait_until
from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = (
    "spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos", "num_requests_running", "num_requests_waiting",
    "kv_cache_usage_perc", "prompt_tokens", "generation_tokens", "num_preemptions",
    "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
    "request_success", "prefix_cache_queries", "prefix_cache_hits",
    "spec_decode_num_speculative_tokens", "spec_decode_drafting_cost_factor",
    "kv_cache_memory_bytes",
)  # fmt: skip


def scrape(server: Server) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted labels minus model_name: value}} of one scrape of /metrics (the
    process's own metrics, Prometheus' process_*, have no model_name)."""
    status, text = call(server.url, "/metrics")
    assert status == 200
    samples: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not family.name.startswith("process_"):
                assert s.labels.get("model_name") == server.model_name
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            samples[s.name][labels] = s.value
    return samples


def value(samples: dict[str, dict[tuple, float]], name: str) -> float:
    return samples[f"verispec:{name}"][()]


def test_every_metric_is_exposed_under_the_verispec_prefix(chat_pair) -> None:
    with Server(speculative_llm(chat_pair, enable_prefix_caching=True).engine, port=0) as server:
        text = call(server.url, "/metrics")[1]
    families = {f.name for f in text_string_to_metric_families(text)}
    for name in NAMES:
        assert f"verispec:{name}" in families, name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process metrics read /proc")
def test_resident_memory_and_the_committed_kv_cache_are_exposed(chat_pair) -> None:
    """Before any request: the process's resident memory (Prometheus' process collector) and
    the bytes of the KV caches committed at start, the target's and the draft model's."""
    llm = speculative_llm(chat_pair, kv_cache_memory=3 * 2**20)
    engine = llm.engine
    drafter = engine.proposer.kv_cache.nbytes
    with Server(engine, port=0) as server:
        samples = scrape(server)
    assert value(samples, "kv_cache_memory_bytes") == engine.kv_memory.total_bytes
    assert engine.kv_memory.target_bytes <= 3 * 2**20 < engine.kv_memory.total_bytes
    assert engine.kv_memory.drafter_bytes == drafter > 0
    assert samples["process_resident_memory_bytes"][()] > engine.kv_memory.total_bytes


def test_adaptive_speculation_gauges_show_the_policy(chat_pair) -> None:
    """The chosen draft count and the drafting cost correction are the policy's own."""
    llm = speculative_llm(chat_pair, adaptive=True)
    policy = llm.engine.spec_policy
    assert policy is not None
    with Server(llm.engine, port=0) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        for prompt in ("def add(a, b):", "class A:", "import os"):
            client.completions.create(model=server.model_name, prompt=prompt, max_tokens=16,
                                      temperature=0)  # fmt: skip
        wait_until(lambda: value(scrape(server), "num_requests_running") == 0)
        m = scrape(server)
    choice = policy.last_choice
    assert value(m, "spec_decode_num_speculative_tokens") == sum(choice) / len(choice)
    assert value(m, "spec_decode_drafting_cost_factor") == pytest.approx(
        policy.cost.drafting_factor()
    )
    assert policy.cost.drafting_factor() > 0


def test_counters_match_the_requests_sent(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    answers = [
        client.completions.create(model="tiny-chat", prompt="def add(a, b):", max_tokens=12,
                                  temperature=0),
        client.completions.create(model="tiny-chat", prompt="class A:", max_tokens=5, n=2,
                                  temperature=1.0, seed=1),
        client.chat.completions.create(model="tiny-chat", max_tokens=9, temperature=0,
                                       messages=[{"role": "user", "content": "hello"}]),
    ]  # fmt: skip
    num_choices = sum(len(a.choices) for a in answers)
    prompt_tokens = sum(a.usage.prompt_tokens * len(a.choices) for a in answers)  # per choice
    generated = sum(a.usage.completion_tokens for a in answers)
    spec = [a.model_extra["speculation"] for a in answers]
    reasons: dict[str, int] = defaultdict(int)
    for a in answers:
        for c in a.choices:
            reasons[c.finish_reason] += 1
    wait_until(lambda: value(scrape(server), "num_requests_running") == 0)
    m = scrape(server)
    assert value(m, "generation_tokens_total") == generated
    assert value(m, "prompt_tokens_total") == prompt_tokens
    assert value(m, "spec_decode_num_drafts_total") == sum(s["num_verify_steps"] for s in spec)
    assert value(m, "spec_decode_num_draft_tokens_total") == sum(
        s["num_draft_tokens"] for s in spec
    )
    accepted = sum(s["num_accepted_tokens"] for s in spec)
    assert value(m, "spec_decode_num_accepted_tokens_total") == accepted > 0
    per_pos = m["verispec:spec_decode_num_accepted_tokens_per_pos_total"]
    assert sum(per_pos.values()) == accepted  # each accepted draft counted at its position
    assert per_pos[(("position", "0"),)] >= per_pos.get((("position", "1"),), 0)
    for reason, n in reasons.items():
        assert m["verispec:request_success_total"][(("finished_reason", reason),)] == n
    assert value(m, "time_to_first_token_seconds_count") == num_choices
    assert value(m, "e2e_request_latency_seconds_count") == num_choices
    assert value(m, "inter_token_latency_seconds_count") > 0
    assert value(m, "num_requests_waiting") == 0
    assert value(m, "kv_cache_usage_perc") == 0
    assert value(m, "num_preemptions_total") == 0


def test_preemptions_are_counted(chat_pair) -> None:
    """Three long requests on a cache for about two: some are preempted and recomputed."""
    llm = speculative_llm(chat_pair, num_blocks=24, max_num_seqs=3)
    with Server(llm.engine, port=0) as small:
        client = openai.OpenAI(base_url=small.url + "/v1", api_key="x", max_retries=0)
        out = client.completions.create(model=small.model_name,
                                        prompt=["def a():", "def b():", "def c():"],
                                        max_tokens=150, temperature=0,
                                        extra_body={"ignore_eos": True})  # fmt: skip
        assert [c.finish_reason for c in out.choices] == ["length"] * 3
        m = scrape(small)
        assert value(m, "num_preemptions_total") == llm.engine.num_preemptions > 0
        assert value(m, "generation_tokens_total") == 450


def test_prefix_cache_counters_and_answers(chat_pair, reference) -> None:
    """A shared system prompt: later requests hit the cache, answers unchanged."""
    from verispec import SamplingParams

    system = {"role": "system", "content": "def helper(x):\n    return x + 1\n" * 6}
    conversations = [[system, {"role": "user", "content": q}] for q in ("a", "b", "c")]
    llm = speculative_llm(chat_pair, enable_prefix_caching=True)
    with Server(llm.engine, port=0) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        answers = [client.chat.completions.create(model=server.model_name, messages=c,
                                                  max_tokens=6, temperature=0)
                   for c in conversations]  # fmt: skip
        m = scrape(server)
    cache = llm.engine.prefix_cache
    assert value(m, "prefix_cache_queries_total") == cache.num_queries == sum(
        a.usage.prompt_tokens for a in answers
    )
    assert value(m, "prefix_cache_hits_total") == cache.num_hits > 0
    params = SamplingParams(temperature=0, max_tokens=6)
    assert [a.choices[0].message.content for a in answers] == [
        o.text for o in reference.chat(conversations, params)
    ]
