"""Answers in the generic tool format (serve/generic_tools.py) parsed back into calls and content,
whole or as they stream, by one parser, so a stream gives what the whole answer gives. A plain
reply's text is released as it is written (its JSON string decoded piece by piece), each call
whole when its object closes, a reply in JSON (a response_format) at the end. Text that is not in
the format (an answer cut short, say) is content as written."""

from __future__ import annotations

import json
import re

from verispec.serve.generic_tools import CALL_KEY, CALLS_KEY, RESPONSE_KEY
from verispec.serve.tool_calls import Parsed, as_call

HEADS = {"{" + json.dumps(CALL_KEY) + ": ": "call", "{" + json.dumps(CALLS_KEY) + ": [": "calls",
         "{" + json.dumps(RESPONSE_KEY) + ": ": "response"}  # fmt: skip
"""How an answer in the format begins (generic_grammar's layout), and what follows."""
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
HEX4 = re.compile(r"[0-9a-fA-F]{4}")
LOW = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
DECODER = json.JSONDecoder()


def decode_string(body: str, final: bool = False) -> tuple[str, int, bool]:
    """(text, characters read, closed) of the start of a JSON string's body (after its opening
    quote): every whole character or escape up to the closing quote, which is read too. An escape
    still incomplete waits, unless final (then it is text as written); a bad escape is text as
    written, a lone surrogate U+FFFD. Each escape decodes on its own, so pieces decode alike.

    >>> decode_string('a\\\\n\\\\u00e9" tail')
    ('a\\né', 10, True)
    >>> decode_string('ab\\\\u00')
    ('ab', 2, False)
    """
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c != "\\":
            out.append(c)
            i += 1
            continue
        size, text = _escape(body, i)
        if size == 0:  # incomplete
            if not final:
                break
            size, text = len(body) - i, body[i:]
        out.append(text)
        i += size
    return "".join(out), i, False


def _escape(body: str, i: int) -> tuple[int, str]:
    """(length, text) of the escape at body[i] ('\\'); (0, "") while it is incomplete."""
    if i + 1 >= len(body):
        return 0, ""
    kind = body[i + 1]
    if kind != "u":
        return 2, ESCAPES.get(kind, body[i : i + 2])
    if i + 6 > len(body):
        return (0, "") if HEX4.fullmatch(body[i + 2 :].ljust(4, "0")) else (2, body[i : i + 2])
    if not HEX4.fullmatch(body[i + 2 : i + 6]):
        return 2, body[i : i + 2]
    code = int(body[i + 2 : i + 6], 16)
    if not 0xD800 <= code < 0xDC00:
        return 6, "\ufffd" if 0xDC00 <= code < 0xE000 else chr(code)
    follow = body[i + 6 : i + 12]  # the low half should follow
    if len(follow) < 6 and LOW.fullmatch(follow + "\\uDC00"[len(follow) :]):
        return 0, ""
    if LOW.fullmatch(follow):
        return 12, chr(0x10000 + (code - 0xD800) * 0x400 + int(follow[2:], 16) - 0xDC00)
    return 6, "\ufffd"


class GenericCallParser:
    """Splits one generic answer, fed piece by piece, into content and calls; `json_response`:
    a reply is JSON (a response_format) given as written, else a string given as its text."""

    def __init__(self, json_response: bool = False) -> None:
        self._text = ""  # the answer so far
        self._pos = 0  # how much of it is read
        self._state = "head"  # head, string, value, call, calls, tail or raw
        self._json_response = json_response
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> Parsed:
        """The content and calls that `text` (the next piece) completes; with final, the rest."""
        self._text += text
        out = Parsed()
        while self._step(out, final):
            pass
        if final and self._state == "tail":
            rest = self._text[self._pos :]
            out.content += "" if rest.strip() == "}" else rest
        if final and self._state == "value":
            out.content += self._value()
        return out

    def _step(self, out: Parsed, final: bool) -> bool:
        """Read what can be read in the current state; whether the state changed."""
        state, rest = self._state, self._text[self._pos :]
        if state == "head":
            return self._head(final)
        if state == "raw":
            out.content += rest
            self._pos = len(self._text)
        elif state == "string":
            text, read, closed = decode_string(rest, final)
            out.content += text
            self._pos += read
            if closed:
                self._state = "tail"
                return True
        elif state in ("call", "calls"):
            return self._calls(out, final)
        return False

    def _head(self, final: bool) -> bool:
        """Which form the answer takes, once its start tells (text in no form: raw)."""
        start = self._text.lstrip()
        offset = len(self._text) - len(start)
        for head, kind in HEADS.items():
            if start.startswith(head):
                self._pos = offset + len(head)
                if kind != "response":
                    self._state = kind
                elif self._json_response:
                    self._state = "value"
                elif self._pos < len(self._text):
                    string = self._text[self._pos] == '"'
                    self._state = "string" if string else "value"
                    self._pos += string
                else:
                    return self._raw() if final else False
                return True
        if final or not any(head.startswith(start) for head in HEADS):
            return self._raw()
        return False

    def _calls(self, out: Parsed, final: bool) -> bool:
        """The next call's object, once whole; in a list, a separator or the list's end."""
        rest = self._text[self._pos :]
        start = rest.lstrip()
        at = self._pos + len(rest) - len(start)
        if self._state == "calls" and self.num_calls and start.startswith((",", "]")):
            if start[0] == "]":
                self._pos, self._state = at + 1, "tail"
            else:
                self._pos = at + 1
            return True
        try:
            value, end = DECODER.raw_decode(self._text, at)
        except json.JSONDecodeError:
            return self._raw(at) if final or (start and start[0] != "{") else False
        call = as_call(value)
        if call is None:
            return self._raw(at)
        out.calls.append(call)
        self.num_calls += 1
        self._pos, self._state = end, "tail" if self._state == "call" else "calls"
        return True

    def _raw(self, at: int = 0) -> bool:
        """Give up on the format: the text from `at` (from the start while no call was given)
        on is content as written."""
        self._pos, self._state = at if self.num_calls else 0, "raw"
        return True

    def _value(self) -> str:
        """A JSON reply as written, its wrapper dropped (the whole answer if it is not one)."""
        try:
            _, end = DECODER.raw_decode(self._text, self._pos)
        except json.JSONDecodeError:
            return self._text
        return self._text[self._pos : end] if self._text[end:].strip() == "}" else self._text
