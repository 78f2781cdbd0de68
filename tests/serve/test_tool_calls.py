"""The Hermes tool-call parser: calls and content of whole answers (several calls, text around
them, malformed blocks kept as content, a last block left open), and a stream cut anywhere
gives what the whole answer gives; an answer that is only a JSON call of a given tool, bare or
fenced, read as that call (only then), streamed alike."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.serve.tool_calls import (
    BareCallParser,
    ParsedCall,
    ToolCallParser,
    bare_call,
    may_be_bare_call,
    parse_call,
    parse_tool_calls,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits


def block(name: str, arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


WEATHER = block("get_weather", {"city": "Paris", "days": 3})
ADD = block("add", {"a": 1, "b": [2.5, {"c": None}]})


def test_one_call_and_nothing_else_has_no_content() -> None:
    parsed = parse_tool_calls(WEATHER)
    assert parsed.content == ""
    assert parsed.calls == [ParsedCall("get_weather", '{"city": "Paris", "days": 3}')]


def test_several_calls_in_order_with_the_text_around_them() -> None:
    parsed = parse_tool_calls(f"Let me check.\n{WEATHER}\n{ADD}\nDone.  ")
    assert [c.name for c in parsed.calls] == ["get_weather", "add"]
    assert json.loads(parsed.calls[1].arguments) == {"a": 1, "b": [2.5, {"c": None}]}
    assert parsed.content == "Let me check.Done.  "  # whitespace next to a call dropped


def test_text_without_calls_is_returned_unchanged() -> None:
    text = "  def f():\n    return '<tool'  \n\n"
    assert parse_tool_calls(text).content == text and not parse_tool_calls(text).calls


@pytest.mark.parametrize("body", [
    '{"name": "f", "arguments": {"x": 1}',  # cut short
    '{"arguments": {"x": 1}}',  # no name
    '{"name": "", "arguments": {}}',
    '{"name": "f", "arguments": [1]}',  # arguments not an object
    '{"name": "f", "arguments": "not json"}',
    '["f"]',
    "call f(1)",
])  # fmt: skip
def test_a_malformed_block_stays_content_as_written(body: str) -> None:
    text = f"A <tool_call>{body}</tool_call>{WEATHER} B"
    parsed = parse_tool_calls(text)
    assert parsed.content == f"A <tool_call>{body}</tool_call>B"
    assert [c.name for c in parsed.calls] == ["get_weather"]


def test_arguments_as_json_text_or_absent() -> None:
    assert parse_call('{"name": "f", "arguments": "{\\"x\\": 1}"}') == ParsedCall("f", '{"x": 1}')
    assert parse_call('{"name": "f"}') == ParsedCall("f", "{}")
    assert parse_call('{"name": "f", "arguments": {"s": "é"}}') == ParsedCall("f", '{"s": "é"}')


def test_a_last_block_left_open_counts_when_its_json_is_whole() -> None:
    opened = WEATHER.removesuffix("</tool_call>")  # stopped at the stop string </tool_call>
    assert [c.name for c in parse_tool_calls("x " + opened).calls] == ["get_weather"]
    cut = opened[:-10]  # max_tokens ran out inside the call
    parsed = parse_tool_calls("x " + cut)
    assert parsed.calls == [] and parsed.content == "x " + cut


def test_a_partial_tag_at_the_end_is_content() -> None:
    assert parse_tool_calls("see <tool_ca").content == "see <tool_ca"


def test_stream_holds_back_what_may_start_a_block_and_releases_the_call_whole() -> None:
    parser = ToolCallParser()
    assert parser.feed("Hi <tool_").content == "Hi"  # the space waits: a call may follow
    assert parser.feed("call>\n{\"name\": \"f\", ").content == ""
    out = parser.feed('"arguments": {}}\n</tool_call>\n')
    assert out.calls == [ParsedCall("f", "{}")] and out.content == ""
    assert parser.feed("", final=True).content == "" and parser.num_calls == 1


ANSWERS = [
    f"Let me check.\n{WEATHER}\n{ADD}\nDone.  ",
    f"A <tool_call>{{bad</tool_call> {WEATHER}",
    "plain text with <tool and </tool_call> and <tool_call",
    WEATHER.removesuffix("</tool_call>"),
    f"  {ADD}{ADD}   tail <",
]


@pytest.mark.parametrize("text", ANSWERS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_gives_the_whole_answers_calls_and_content(
    text: str, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    parser = ToolCallParser()
    content, calls = "", []
    for i, piece in enumerate(pieces):
        out = parser.feed(piece, final=i == len(pieces) - 1)
        content += out.content
        calls += out.calls
    whole = parse_tool_calls(text)
    assert (content, calls) == (whole.content, whole.calls)


BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
NAMES = {"get_weather", "add"}


@pytest.mark.parametrize("text", [BARE, f"  {BARE}\n", f"```json\n{BARE}\n```",
                                  f"```\n{BARE}\n```\n", f"```JSON\n  {BARE}```"])  # fmt: skip
def test_an_answer_that_is_only_a_json_call_of_a_given_tool_is_that_call(text: str) -> None:
    call = ParsedCall("get_weather", '{"city": "Paris"}')
    assert bare_call(text, NAMES) == call
    parser = BareCallParser(NAMES)
    assert parser.feed(text, final=True).calls == [call] and parser.num_calls == 1


@pytest.mark.parametrize("text", [
    '{"name": "other", "arguments": {}}',  # not a given tool
    '{"name": "add", "arguments": "{}"}',  # arguments not an object
    '{"name": "add"}',
    f"{BARE} and then text",
    f"Sure: {BARE}",
    f"```python\n{BARE}\n```",
    f"```json\n{BARE}\n``` more",
    f"[{BARE}]",
    '{"name": "add", "arguments": {}',  # cut short
])  # fmt: skip
def test_anything_else_is_content(text: str) -> None:
    assert bare_call(text, NAMES) is None
    parsed = BareCallParser(NAMES).feed(text, final=True)
    assert (parsed.content, parsed.calls) == (parse_tool_calls(text).content, [])


def test_a_stream_holds_only_what_may_be_a_call() -> None:
    assert not may_be_bare_call("Sure", NAMES)
    assert may_be_bare_call("``", NAMES) and may_be_bare_call("```js", NAMES)
    assert not may_be_bare_call("```py", NAMES) and not may_be_bare_call("```js\n", NAMES)
    assert may_be_bare_call(f"```json\n{BARE}\n``", NAMES)
    assert not may_be_bare_call('{"name": "other", "arguments": {}}', NAMES)
    parser = BareCallParser(NAMES)
    assert parser.feed("```py").content == "```py"  # released as soon as it cannot be a call
    parser = BareCallParser(NAMES)
    assert parser.feed(BARE[:20]).content == "" and parser.feed(BARE[20:]).calls == []
    assert parser.feed("", final=True).calls == [ParsedCall("get_weather", '{"city": "Paris"}')]


BARE_ANSWERS = [f"```json\n{BARE}\n```", f" {BARE} ", f"```python\nx = 1\n```{WEATHER}",
                f"{BARE} tail", '{"name": "add", "arguments": {"a": "}"}}', "`x` <tool_call>"]


@pytest.mark.parametrize("text", BARE_ANSWERS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_gives_the_whole_answers_bare_call_or_content(
    text: str, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    parser = BareCallParser(NAMES)
    content, calls = "", []
    for i, piece in enumerate(pieces):
        out = parser.feed(piece, final=i == len(pieces) - 1)
        content += out.content
        calls += out.calls
    whole = BareCallParser(NAMES).feed(text, final=True)
    assert (content, calls) == (whole.content, whole.calls)
