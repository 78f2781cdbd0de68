"""ServerMetrics: the server's Prometheus metrics, named as vLLM names them under a `verispec:`
prefix, in a registry of the server's own (no global state); updated by the engine thread."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from verispec.api.stream import StepNews
from verispec.engine.engine import Engine
from verispec.engine.request import Request
from verispec.types.stats import SpecStats

PREFIX = "verispec:"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
"""Seconds; from 5 ms (a small model's step on a GPU) to 80 s (a long answer on a CPU)."""


class ServerMetrics:
    """Counters, gauges and histograms of one server, labelled with its model name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        # process_resident_memory_bytes and the rest of Prometheus' process metrics (Linux)
        ProcessCollector(registry=self.registry)
        self.model_name = model_name
        label = ["model_name"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, label, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, label, registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(PREFIX + name, doc, label, buckets=LATENCY_BUCKETS,
                             registry=self.registry)  # fmt: skip

        m = model_name
        self.num_drafts = counter("spec_decode_num_drafts",
                                  "Verify steps that checked at least one draft token").labels(m)
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens",
                                        "Draft tokens checked by the target").labels(m)
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens",
                                           "Draft tokens the target accepted").labels(m)
        self.accepted_per_pos = Counter(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Verify steps whose draft at this position (0 = first) was accepted",
            ["model_name", "position"], registry=self.registry,
        )  # fmt: skip
        self.running = gauge("num_requests_running", "Requests in the running batch").labels(m)
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled").labels(m)
        self.kv_usage = gauge("kv_cache_usage_perc",
                              "Fraction of the target's KV cache blocks in use (0-1)").labels(m)
        self.kv_memory = gauge("kv_cache_memory_bytes",
                               "Bytes of the KV caches, the target's and a drafter's own, "
                               "committed at start").labels(m)  # fmt: skip
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens prefilled").labels(m)
        self.generation_tokens = counter("generation_tokens", "Output tokens emitted").labels(m)
        self.num_preemptions = counter("num_preemptions",
                                       "Requests whose KV was freed to make room").labels(m)
        self.request_success = Counter(
            PREFIX + "request_success", "Requests that finished, by finish reason",
            ["model_name", "finished_reason"], registry=self.registry,
        )  # fmt: skip
        self.ttft = histogram("time_to_first_token_seconds",
                              "Arrival to first output token").labels(m)
        self.itl = histogram("inter_token_latency_seconds",
                             "Time between a request's consecutive steps that emitted tokens "
                             "(one observation per step, as vLLM)").labels(m)  # fmt: skip
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish").labels(m)
        self.prefix_queries = counter("prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache").labels(m)
        self.prefix_hits = counter("prefix_cache_hits",
                                   "Prompt tokens whose KV the prefix cache held").labels(m)
        self.num_speculative_tokens = gauge(
            "spec_decode_num_speculative_tokens",
            "Draft tokens per decoding request the adaptive policy chose at the last step "
            "(mean; 0 = speculation off)").labels(m)  # fmt: skip
        self.drafting_factor = gauge(
            "spec_decode_drafting_cost_factor",
            "Recent drafting steps' measured / predicted seconds over plain steps' (the "
            "adaptive policy's correction of drafting costs; 1 = as its cost model predicts)",
        ).labels(m)
        self._spec_seen = SpecStats()
        self._prefix_seen = (0, 0)
        self._preemptions_seen = 0

    def observe_news(
        self, request: Request, news: StepNews, last_time: float | None, now: float
    ) -> None:
        """Count what one step gave one request (last_time: its previous step with tokens)."""
        self.generation_tokens.inc(news.num_new)
        if last_time is None:  # first tokens: the prompt was prefilled
            self.prompt_tokens.inc(len(request.prompt_token_ids))
            self.ttft.observe(now - request.arrival_time)
        else:
            self.itl.observe(now - last_time)
        output = news.output
        if output is not None and output.finish_reason is not None:
            self.e2e.observe(now - request.arrival_time)
            self.request_success.labels(self.model_name, output.finish_reason).inc()

    def observe_engine(self, engine: Engine) -> None:
        """Queue lengths, KV usage, and the speculation and preemption counters' growth."""
        self.running.set(len(engine.scheduler.running))
        self.waiting.set(len(engine.scheduler.waiting))
        allocator = engine.allocator
        self.kv_usage.set(allocator.num_used / allocator.num_blocks)
        self.kv_memory.set(engine.kv_memory.total_bytes)
        total, seen = engine.spec_stats, self._spec_seen
        self.num_drafts.inc(total.num_verify_steps - seen.num_verify_steps)
        self.num_draft_tokens.inc(total.num_draft_tokens - seen.num_draft_tokens)
        self.num_accepted_tokens.inc(total.num_accepted_tokens - seen.num_accepted_tokens)
        for pos, n in enumerate(total.accepted_per_position):
            before = seen.accepted_per_position[pos] if pos < len(seen.accepted_per_position) else 0
            if n > before:
                self.accepted_per_pos.labels(self.model_name, str(pos)).inc(n - before)
        self._spec_seen = SpecStats(
            total.num_verify_steps, total.num_draft_tokens, total.num_accepted_tokens,
            list(total.accepted_per_position),
        )  # fmt: skip
        self.num_preemptions.inc(engine.num_preemptions - self._preemptions_seen)
        self._preemptions_seen = engine.num_preemptions
        policy = engine.spec_policy
        if policy is not None:
            if policy.last_choice:
                self.num_speculative_tokens.set(sum(policy.last_choice) / len(policy.last_choice))
            self.drafting_factor.set(policy.cost.drafting_factor())
        cache = engine.prefix_cache
        if cache is not None:
            queries, hits = self._prefix_seen
            self.prefix_queries.inc(cache.num_queries - queries)
            self.prefix_hits.inc(cache.num_hits - hits)
            self._prefix_seen = (cache.num_queries, cache.num_hits)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
