"""Streaming: a request's new text after each engine step that accepted tokens for it, and
the request aborted (its KV blocks freed) when the consumer stops early."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import TracebackType

from verispec.engine import Engine
from verispec.outputs import StreamDelta
from verispec.request import Request

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


class RequestStream(Iterator[StreamDelta]):
    """StreamDeltas of one queued request: each next() steps the engine (every queued request
    advances, so streams interleave) until this one has new tokens; the last delta carries the
    RequestOutput. close(), leaving a `with` block, or garbage collection aborts an unfinished
    request, freeing its KV blocks."""

    def __init__(self, engine: Engine, request: Request) -> None:
        self.engine = engine
        self.request = request
        hold_back = max((len(s) for s in request.params.stop), default=1) - 1
        cleans_spaces = bool(getattr(engine.tokenizer.hf, "clean_up_tokenization_spaces", False))
        self._text = TextStream(engine.tokenizer.decode, hold_back, cleans_spaces)
        self._num_sent = 0  # output tokens already delivered
        self._done = False

    def __next__(self) -> StreamDelta:
        if self._done:
            raise StopIteration
        request = self.request
        try:
            while not request.finished and len(request.output_token_ids) == self._num_sent:
                self.engine.step()
        except BaseException:
            self.close()
            raise
        new_ids = request.output_token_ids[self._num_sent :]
        self._num_sent = len(request.output_token_ids)
        if not request.finished:
            return StreamDelta(self._text.update(request.output_token_ids), new_ids)
        self._done = True
        output = self.engine.output(request)
        return StreamDelta(self._text.finish(output.text), new_ids, output.finish_reason, output)

    def close(self) -> None:
        """Stop streaming; an unfinished request is aborted and its KV blocks freed."""
        if not self.request.finished:
            self.engine.abort_request(self.request)
        self._done = True

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
