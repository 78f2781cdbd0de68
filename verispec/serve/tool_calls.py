"""The Hermes tool-call format (Qwen2.5's and others'): `<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>` blocks, one or more, parsed out of an answer whole or as it streams. The
same parser serves both, so a streamed answer gives the same calls and content as a whole one."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FENCE = "```"
DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One tool call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(slots=True)
class Parsed:
    """What a piece of the answer held: content to show, and calls whose blocks closed."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


class CallParser(Protocol):
    """A parser of one answer's calls and content, fed whole or piece by piece."""

    num_calls: int

    def feed(self, text: str, final: bool = False) -> Parsed: ...


def parse_call(body: str) -> ParsedCall | None:
    """The call a block's body holds: a JSON object with a non-empty string `name` and an object
    (or JSON text) `arguments` (absent: none); None when it is anything else.

    >>> parse_call('{"name": "f", "arguments": {"x": 1}}')
    ParsedCall(name='f', arguments='{"x": 1}')
    >>> parse_call('{"name": "f", "arguments": {"x": 1}') is None
    True
    """
    try:
        return as_call(json.loads(body))
    except json.JSONDecodeError:
        return None


def as_call(value: object) -> ParsedCall | None:
    """The call a decoded JSON value is (parse_call's rules), else None.

    >>> as_call({"name": "f", "arguments": "{}"})
    ParsedCall(name='f', arguments='{}')
    """
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, dict):
        return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))
    if isinstance(arguments, str):
        try:
            if isinstance(json.loads(arguments), dict):
                return ParsedCall(value["name"], arguments)
        except json.JSONDecodeError:
            pass
    return None


def _open_prefix(text: str) -> int:
    """Length of the longest end of `text` that begins OPEN (a tag that may still come)."""
    for k in range(min(len(text), len(OPEN) - 1), 0, -1):
        if text.endswith(OPEN[:k]):
            return k
    return 0


class ToolCallParser:
    """Splits one answer, fed piece by piece, into content and tool calls. Text outside the
    blocks is content, less the whitespace next to a call; a block that does not parse stays
    content as written; a last block left open (the answer stopped at CLOSE) counts if its JSON
    is whole. Content is released as soon as it cannot be the start of a block."""

    def __init__(self) -> None:
        self._buffer = ""  # text not yet released: inside a block, or a possible OPEN's start
        self._in_block = False
        self._space = ""  # content's trailing whitespace, held until we know a call follows
        self._after_call = False  # whitespace that follows a call is dropped
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> Parsed:
        """The content and calls that `text` (the next piece of the answer) completes; with
        final, everything left."""
        self._buffer += text
        out = Parsed()
        while True:
            if self._in_block:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
                self._in_block = False
                self._close(body, OPEN + body + CLOSE, out)
                continue
            start = self._buffer.find(OPEN)
            if start >= 0:
                out.content += self._content(self._buffer[:start])
                self._buffer = self._buffer[start + len(OPEN) :]
                self._in_block = True
                continue
            keep = 0 if final else _open_prefix(self._buffer)
            out.content += self._content(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            break
        if final:
            if self._in_block:
                self._close(self._buffer, OPEN + self._buffer, out)
                self._buffer, self._in_block = "", False
            out.content += self._space
            self._space = ""
        return out

    def _close(self, body: str, written: str, out: Parsed) -> None:
        """A block ended: a call, or its text as content."""
        call = parse_call(body.strip())
        if call is None:
            out.content += self._content(written)
            return
        out.calls.append(call)
        self.num_calls += 1
        self._space, self._after_call = "", True

    def _content(self, text: str) -> str:
        """What of `text` (content) to release now: held whitespace first, its own trailing
        whitespace held back, whitespace right after a call dropped."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        text = self._space + text
        released = text.rstrip()
        self._space = text[len(released) :]
        return released


def parse_tool_calls(text: str) -> Parsed:
    """A whole answer's content and calls (what the stream of the same text gives, joined).

    >>> parse_tool_calls('Sure.\\n<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>')
    Parsed(content='Sure.', calls=[ParsedCall(name='f', arguments='{}')])
    """
    return ToolCallParser().feed(text, final=True)


def bare_call(text: str, names: Collection[str]) -> ParsedCall | None:
    """The call a whole answer is when it is only a JSON call (an object of arguments) of one of
    `names`, bare or fenced in ``` or ```json; else None.

    >>> bare_call('```json\\n{"name": "f", "arguments": {}}\\n```', {"f"})
    ParsedCall(name='f', arguments='{}')
    """
    body = text.strip()
    if body.startswith(FENCE):
        info, _, inner = body[len(FENCE) :].partition("\n")
        if info.strip().lower() not in ("", "json") or not inner.endswith(FENCE):
            return None
        body = inner[: -len(FENCE)].strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("arguments"), dict):
        return None
    call = as_call(value)
    return call if call is not None and call.name in names else None


def may_be_bare_call(text: str, names: Collection[str]) -> bool:
    """Whether the start of an answer may still turn out to be a bare_call (False stays False
    whatever follows, so a stream can release text the moment it is).

    >>> may_be_bare_call('```py', {"f"}), may_be_bare_call('{"name": "f", "argu', {"f"})
    (False, True)
    """
    body = text.lstrip()
    if body.startswith("`") and not body.startswith(FENCE):
        return FENCE.startswith(body)
    if body.startswith(FENCE):
        info, newline, body = body[len(FENCE) :].partition("\n")
        info = info.strip().lower()
        if not newline:
            return "json".startswith(info)
        if info not in ("", "json"):
            return False
        body = body.lstrip()
        if not body:
            return True
        tail = FENCE
    else:
        tail = ""
    if not body or body[0] != "{":
        return not body
    try:
        value, end = DECODER.raw_decode(body)
    except json.JSONDecodeError:
        return True  # not whole yet (or never: the answer's end tells)
    rest = body[end:].strip()
    called = isinstance(value, dict) and isinstance(value.get("arguments"), dict)
    call = as_call(value) if called else None
    return call is not None and call.name in names and tail.startswith(rest)


class BareCallParser:
    """ToolCallParser, and an answer that is only a JSON call of one of `names` (bare_call) is
    that call: an answer that may be one is held until it ends or cannot be one."""

    def __init__(self, names: Collection[str]) -> None:
        self._names = frozenset(names)
        self._held: str | None = ""  # None once the answer cannot be a bare call
        self._inner = ToolCallParser()
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> Parsed:
        """As ToolCallParser.feed."""
        if self._held is None:
            return self._counted(self._inner.feed(text, final))
        held = self._held + text
        if final:
            self._held = None
            call = bare_call(held, self._names)
            if call is not None:
                self.num_calls += 1
                return Parsed(calls=[call])
            return self._counted(self._inner.feed(held, final=True))
        if may_be_bare_call(held, self._names):
            self._held = held
            return Parsed()
        self._held = None
        return self._counted(self._inner.feed(held))

    def _counted(self, parsed: Parsed) -> Parsed:
        self.num_calls += len(parsed.calls)
        return parsed
