"""Streaming: a request's new text after each engine step that accepted tokens for it, and
the request aborted (its KV blocks freed) when the consumer stops early."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from verispec.engine.engine import Engine
from verispec.engine.request import Request
from verispec.tokenizer import Tokenizer
from verispec.types.outputs import RequestOutput, StreamDelta, TokenLogprobs

REPLACEMENT = "\ufffd"
"""What a decoder writes for an incomplete UTF-8 character (a multi-byte one split over tokens)."""


def stable_text(text: str, hold_back: int = 0, hold_whitespace: bool = False) -> str:
    """The part of a partial decode that later tokens cannot change: without trailing U+FFFD
    (an incomplete character), without trailing whitespace when the tokenizer cleans up spaces
    (" ." later becomes "."), and without the last `hold_back` characters (a stop string may be
    starting there; hold_back = longest stop string - 1).

    >>> stable_text("caf\\ufffd"), stable_text("say ST", hold_back=2), stable_text("a ", 0, True)
    ('caf', 'say ', 'a')
    """
    text = text.rstrip(REPLACEMENT)
    if hold_whitespace:
        text = text.rstrip()
    return text[: max(len(text) - hold_back, 0)]


class TextStream:
    """Incremental detokenizer: text deltas of a growing list of token ids, each released only
    once later tokens cannot change it, so the deltas concatenate to the final text.

    Example: "€" is three byte tokens; after two of them the decode ends in U+FFFD and update()
    returns ""; after the third it returns "€".
    """

    def __init__(
        self, decode: Callable[[list[int]], str], hold_back: int = 0, hold_whitespace: bool = False
    ) -> None:
        self._decode = decode
        self._hold_back = hold_back
        self._hold_whitespace = hold_whitespace
        self.sent = ""
        """The text released so far."""

    def update(self, token_ids: list[int]) -> str:
        """New stable text of all output ids so far ("" when nothing new is stable)."""
        stable = stable_text(self._decode(token_ids), self._hold_back, self._hold_whitespace)
        if len(stable) <= len(self.sent) or not stable.startswith(self.sent):
            return ""
        delta, self.sent = stable[len(self.sent) :], stable
        return delta

    def finish(self, text: str) -> str:
        """The rest of the final text (the request's, already cut at a stop string). Should a
        tokenizer's decode ever rewrite text already released, the rest follows the longest
        common prefix: nothing can be taken back."""
        start = 0
        while start < min(len(self.sent), len(text)) and self.sent[start] == text[start]:
            start += 1
        self.sent = text
        return text[start:]


@dataclass(slots=True)
class StepNews:
    """What the engine steps since the last look gave one request: a snapshot safe to hand to
    another thread (the server's engine thread hands it to the request's HTTP handler)."""

    token_ids: list[int]
    """All output token ids so far (a copy)."""
    num_new: int
    """How many of them are new."""
    num_accepted: int
    """How many of the new ones are drafts the target accepted."""
    num_draft_tokens: int
    """Draft tokens the target checked for this request meanwhile."""
    logprobs: list[TokenLogprobs] | None
    """The new tokens' logprobs, when the request asks for them."""
    output: RequestOutput | None
    """The final output once the request finished, else None."""


class ProgressTracker:
    """Remembers how much of one request was already reported, to report only what is new."""

    def __init__(self) -> None:
        self.num_sent = 0
        self._accepted = 0
        self._drafted = 0

    def news(self, engine: Engine, request: Request) -> StepNews | None:
        """The request's news since the last call; None when it has none."""
        ids = request.output_token_ids
        if len(ids) == self.num_sent and not request.finished:
            return None
        num_new = len(ids) - self.num_sent
        stats = request.spec_stats
        accepted = stats.num_accepted_tokens - self._accepted
        logprobs = None if request.logprobs is None else request.logprobs[self.num_sent :]
        news = StepNews(
            token_ids=list(ids),
            num_new=num_new,
            # drafts after a stop are counted as accepted but never appended
            num_accepted=min(accepted, num_new),
            num_draft_tokens=stats.num_draft_tokens - self._drafted,
            logprobs=logprobs,
            output=engine.output(request) if request.finished else None,
        )
        self.num_sent = len(ids)
        self._accepted = stats.num_accepted_tokens
        self._drafted = stats.num_draft_tokens
        return news


class DeltaMaker:
    """Turns a request's StepNews into StreamDeltas: the new text, released only once stable
    (see TextStream), split into the part the accepted drafts completed and the rest."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        hold_back = max((len(s) for s in stop), default=1) - 1
        cleans_spaces = bool(getattr(tokenizer.hf, "clean_up_tokenization_spaces", False))
        self._text = TextStream(tokenizer.decode, hold_back, cleans_spaces)

    def delta(self, news: StepNews) -> StreamDelta:
        """The delta of one piece of news (the last one carries the output)."""
        ids, new = news.token_ids, news.token_ids[len(news.token_ids) - news.num_new :]
        if news.num_accepted == news.num_new:  # all drafts (or no tokens): no split to make
            accepted_text = None
        else:  # text up to the last accepted draft; it completes no stop string (else the
            # request would have ended there), so the held-back text is safe to release
            accepted_text = self._text.update(ids[: len(ids) - news.num_new + news.num_accepted])
        output = news.output
        rest = self._text.finish(output.text) if output else self._text.update(ids)
        text = rest if accepted_text is None else accepted_text + rest
        return StreamDelta(
            text=text,
            token_ids=new,
            finish_reason=output.finish_reason if output else None,
            output=output,
            num_accepted=news.num_accepted,
            num_draft_tokens=news.num_draft_tokens,
            accepted_text=text if accepted_text is None and news.num_new else accepted_text or "",
            logprobs=news.logprobs,
        )


class RequestStream(Iterator[StreamDelta]):
    """StreamDeltas of one queued request: each next() steps the engine (every queued request
    advances, so streams interleave) until this one has new tokens; the last delta carries the
    RequestOutput. close(), leaving a `with` block, or garbage collection aborts an unfinished
    request, freeing its KV blocks."""

    def __init__(self, engine: Engine, request: Request) -> None:
        self.engine = engine
        self.request = request
        self._progress = ProgressTracker()
        self._deltas = DeltaMaker(engine.tokenizer, request.params.stop)
        self._done = False

    def __next__(self) -> StreamDelta:
        if self._done:
            raise StopIteration
        try:
            while (news := self._progress.news(self.engine, self.request)) is None:
                self.engine.step()
        except BaseException:
            self.close()
            raise
        self._done = news.output is not None
        return self._deltas.delta(news)

    def close(self) -> None:
        """Stop streaming; an unfinished request is aborted and its KV blocks freed."""
        if not self.request.finished:
            self.engine.abort_request(self.request)
        self._done = True

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
