"""The generic tool format's parser: calls, several calls and replies of whole answers, a reply's
JSON string decoded (escapes, surrogate pairs, bad escapes), JSON replies as written, text out of
the format (cut short or never in it) kept as content, and a stream cut anywhere gives what the
whole answer gives, a plain reply's text released as it is written."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.serve.generic_tool_calls import GenericCallParser, decode_string
from verispec.serve.tool_calls import ParsedCall


def parse(text: str, json_response: bool = False):
    return GenericCallParser(json_response).feed(text, final=True)


CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2.5]}}}'
CALLS = ('{"tool_calls": [{"name": "add", "arguments": {"a": 1}}, '
         '{"name": "ping", "arguments": {}}]}')  # fmt: skip


def test_a_call_and_several_calls() -> None:
    parsed = parse(CALL)
    assert parsed.content == ""
    assert parsed.calls == [ParsedCall("get_weather", '{"city": "Paris", "n": [1, 2.5]}')]
    parsed = parse(CALLS)
    assert parsed.calls == [ParsedCall("add", '{"a": 1}'), ParsedCall("ping", "{}")]
    assert parsed.content == ""


def test_a_reply_is_its_text() -> None:
    text = 'line\\nquote \\" tab\\t \\u00e9 \\ud83d\\ude00 slash \\/'
    assert parse(f'{{"response": "{text}"}}').content == json.loads(f'"{text}"')
    assert parse('{"response": ""}').content == ""


def test_a_json_reply_is_given_as_written() -> None:
    assert parse('{"response": {"ok": true, "n": [1]}}', True).content == '{"ok": true, "n": [1]}'
    assert parse('{"response": "a"}', True).content == '"a"'  # a schema of a string: JSON text


@pytest.mark.parametrize("text", [
    "plain text, not the format",
    '{"tool_call": {"name": "f", "argu',  # cut short inside a call
    '{"tool_call": {"name": "f", "arguments": [1]}}',  # arguments not an object
    '{"tool_calls": []}',
    '{"other": 1}',
    "",
])  # fmt: skip
def test_text_out_of_the_format_is_content_as_written(text: str) -> None:
    parsed = parse(text)
    assert (parsed.content, parsed.calls) == (text, [])


def test_a_reply_cut_short_gives_the_text_written() -> None:
    assert parse('{"response": "cut sh').content == "cut sh"
    assert parse('{"response": "cut \\u00').content == "cut \\u00"  # a broken escape as written
    assert parse('{"response": {"ok": tr', True).content == '{"response": {"ok": tr'


def test_calls_given_before_the_answer_was_cut_stay() -> None:
    parsed = parse('{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "argu')
    assert parsed.calls == [ParsedCall("a", "{}")]
    assert parsed.content == '{"name": "b", "argu'


@pytest.mark.parametrize(("body", "text"), [
    ('\\q"', "\\q"),  # not an escape: as written
    ('\\ud83d x"', "\ufffd x"),  # a lone high surrogate
    ('\\ude00"', "\ufffd"),  # a lone low one
    ('\\u12zz"', "\\u12zz"),
])  # fmt: skip
def test_bad_escapes(body: str, text: str) -> None:
    assert decode_string(body) == (text, len(body), True)


def test_a_stream_releases_a_replys_text_as_it_is_written() -> None:
    parser = GenericCallParser()
    assert parser.feed('{"resp').content == ""
    assert parser.feed('onse": "Hel').content == "Hel"
    assert parser.feed("lo \\u00").content == "lo "  # the escape waits for its digits
    assert parser.feed('e9!"').content == "é!"
    out = parser.feed("}", final=True)
    assert (out.content, out.calls, parser.num_calls) == ("", [], 0)


def test_a_stream_releases_each_call_when_it_closes() -> None:
    parser = GenericCallParser()
    assert parser.feed(CALLS[:60]).calls == [ParsedCall("add", '{"a": 1}')]
    out = parser.feed(CALLS[60:], final=True)
    assert out.calls == [ParsedCall("ping", "{}")] and parser.num_calls == 2


ANSWERS = [
    CALL, CALLS, '{"response": "a\\u00e9\\ud83d\\ude00\\n\\"b"}', '{"response": "cut \\ud83d',
    '{"tool_calls": [{"name": "a", "arguments": {"x": "}"}}, {"name": "b"',
    "plain", '{"tool_call": {"name": "f", "arguments": 1}}', '{"response": ',
]  # fmt: skip


@pytest.mark.parametrize("text", ANSWERS)
@pytest.mark.parametrize("json_response", [False, True])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_gives_the_whole_answers_calls_and_content(
    text: str, json_response: bool, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    parser = GenericCallParser(json_response)
    content, calls = "", []
    for i, piece in enumerate(pieces):
        out = parser.feed(piece, final=i == len(pieces) - 1)
        content += out.content
        calls += out.calls
    whole = parse(text, json_response)
    assert (content, calls) == (whole.content, whole.calls)
