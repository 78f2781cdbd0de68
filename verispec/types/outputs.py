"""RequestOutput and RequestMetrics: what generate() returns for one prompt; StreamDelta: one
step of a streamed request."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from verispec.types.stats import SpecStats

FinishReason = Literal["stop", "length"]


@dataclass(slots=True)
class RequestMetrics:
    """Timings of one request; TTFT is kept apart from inter-token latency on purpose."""

    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    ttft_s: float | None = None
    """Arrival to first output token (queueing + prefill + first sample)."""
    itl_s: list[float] = field(default_factory=list)
    """Gap before each later output token (tokens emitted in one step share a step's time)."""
    e2e_s: float | None = None
    """Arrival to finish."""
    spec: SpecStats = field(default_factory=SpecStats)
    """Speculative decoding counters (all zero for plain decoding)."""

    @property
    def acceptance_rate(self) -> float | None:
        return self.spec.acceptance_rate

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.spec.mean_acceptance_length

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens over end-to-end time."""
        if not self.e2e_s or not self.num_output_tokens:
            return None
        return self.num_output_tokens / self.e2e_s

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output, tokens_per_s included."""
        plain = {k: v for k, v in asdict(self).items() if k != "spec"}
        return {**plain, "tokens_per_s": self.tokens_per_s, **self.spec.to_dict()}


@dataclass(slots=True)
class TokenLogprobs:
    """One output token's log-probability under the target, and the most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    """(token id, log-probability) of the params.logprobs most likely tokens, likeliest first."""


@dataclass(slots=True)
class RequestOutput:
    """The result of one prompt, in vLLM's shape (one completion per request)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    metrics: RequestMetrics
    logprobs: list[TokenLogprobs] | None = None
    """One per token id when params.logprobs was set, else None."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class StreamDelta:
    """What one engine step added to a streamed request: new text and token ids; the last
    delta also carries the finish reason and the full RequestOutput (with its metrics)."""

    text: str
    """New text since the previous delta; all deltas' texts concatenated = the final text."""
    token_ids: list[int]
    """Token ids accepted this step (text may lag them by an incomplete character)."""
    finish_reason: FinishReason | None = None
    output: RequestOutput | None = None
    """Set on the last delta only."""
    num_accepted: int = 0
    """How many of token_ids are drafts the target accepted; the rest it produced itself (the
    recovered or bonus token)."""
    num_draft_tokens: int = 0
    """Draft tokens the target checked for this request in this step."""
    accepted_text: str = ""
    """The start of text that the accepted drafts completed (the rest, the target's token)."""
    logprobs: list[TokenLogprobs] | None = None
    """One per token id when params.logprobs was set."""

    @property
    def finished(self) -> bool:
        return self.output is not None
