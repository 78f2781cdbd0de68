"""Tools and tool_choice: the plan of a request (what is rendered, parsed, forced; the 400s), the
grammar of a forced call (text sampled under it parses into calls that follow the functions'
schemas), and through the official `openai` client against a served model whose template takes
tools: forced calls, a round trip with the tool's result, streamed calls equal to whole ones,
and greedy calls with speculation equal to plain decoding."""

from __future__ import annotations

import json
import random
import re
from types import SimpleNamespace
from typing import Any

import jsonschema
import openai
import pytest

from tests.helpers.chat import TEMPLATE, TOOLS_TEMPLATE
from verispec.serve import Server
from verispec.serve.errors import APIError
from verispec.serve.protocol import ChatCompletionRequest
from verispec.serve.tool_calls import CLOSE, parse_tool_calls
from verispec.serve.tools import call_grammar, plan_output

pytestmark = pytest.mark.usefixtures("one_thread")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False,
        },
    },
}  # fmt: skip
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": -100, "maximum": 100},
                           "b": {"type": "integer", "minimum": -100, "maximum": 100}},
            "required": ["a", "b"], "additionalProperties": False,
        },
    },
}  # fmt: skip
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters
NESTED = {  # pydantic's layout of a nested model: a $ref into the parameters' own $defs
    "type": "function",
    "function": {
        "name": "move",
        "parameters": {
            "$defs": {"Point": {"type": "object",
                                "properties": {"x": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
                                "required": ["x"], "additionalProperties": False}},
            "type": "object", "properties": {"to": {"$ref": "#/$defs/Point"}},
            "required": ["to"], "additionalProperties": False,
        },
    },
}  # fmt: skip
TOOLS = [WEATHER, ADD, PING, NESTED]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {}) for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def plan(template: str = TOOLS_TEMPLATE, constraint: Any = None, **fields: Any):
    return plan_output(request(**fields), SimpleNamespace(chat_template=template), "m",
                       constraint)  # fmt: skip


def test_no_tools_or_tool_choice_none_renders_and_parses_nothing() -> None:
    for fields in ({}, {"tools": []}, {"tools": [], "tool_choice": "auto"},
                   {"tools": TOOLS, "tool_choice": "none"}):  # fmt: skip
        p = plan(**fields)
        assert (p.template_tools, p.parse_tools, p.constraint, p.stop) == (None, None, None, ())
    assert plan(TEMPLATE, tools=TOOLS, tool_choice="none").template_tools is None


def test_auto_renders_and_parses_without_forcing() -> None:
    p = plan(tools=TOOLS)
    assert p.template_tools == TOOLS and p.parse_tools and p.constraint is None and not p.stop
    bare = '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```'  # an unforced call
    assert [c.name for c in p.parse_tools().feed(bare, final=True).calls] == ["add"]
    one = plan(tools=TOOLS, parallel_tool_calls=False)  # at most one call: stop when it closes
    assert one.stop == (CLOSE,) and one.constraint is None


def forced_names(grammar: str) -> list[str]:
    """The function names a call grammar's alternatives write."""
    return re.findall(r'\\"name\\": \\"([^\\]+)\\"', grammar)


def test_required_and_named_force_a_grammar() -> None:
    required = plan(tools=TOOLS, tool_choice="required")
    assert required.parse_tools and required.template_tools == TOOLS
    assert forced_names(required.constraint.grammar) == list(SCHEMAS)
    named = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert forced_names(named.constraint.grammar) == ["add"]


BAD = [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [ADD, ADD]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"anyOf": []}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [ADD, {"type": "function", "function": {"name": "f",
                                                       "parameters": {"type": "string"}}}]},
     "tools.1.function.parameters"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), BAD, ids=lambda v: str(v)[:40])
def test_what_cannot_be_done_is_a_400_naming_the_field(fields, param) -> None:
    with pytest.raises(APIError) as e:
        plan(**fields)
    assert (e.value.status, e.value.param) == (400, param)


def test_a_template_without_tools_gets_them_in_the_generic_format() -> None:
    p = plan(TEMPLATE, tools=TOOLS)  # tests/serve/test_generic_tools.py tests the format
    assert p.template_tools is None and p.prompt is not None and p.prompt.system is not None
    assert plan(TOOLS_TEMPLATE, tools=TOOLS).prompt is None


def test_forced_calls_and_a_response_format_are_refused_together() -> None:
    from verispec.types.sampling_params import StructuredOutputsParams as S

    with pytest.raises(APIError) as e:
        plan(constraint=S(json_object=True), tools=TOOLS, tool_choice="required")
    assert e.value.param == "tool_choice"
    with pytest.raises(APIError) as e:
        plan(constraint=S(regex="a+"), tools=TOOLS)
    assert e.value.param == "tools"
    both = plan(constraint=S(json={"type": "object"}), tools=TOOLS)  # calls, or that JSON
    assert "answer: %json" in both.constraint.grammar


def sample_under(grammar: str, tokenizer: Any, seed: int, limit: int = 600) -> str:
    """Text of tokens drawn uniformly among those llguidance's mask allows, to the end."""
    import llguidance.hf
    import numpy as np
    from llguidance import LLMatcher

    matcher = LLMatcher(llguidance.hf.from_tokenizer(tokenizer), grammar)
    assert not matcher.is_error(), matcher.get_error()
    rng, ids = random.Random(seed), []
    while not matcher.is_stopped():
        assert len(ids) < limit, tokenizer.decode(ids)
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)
        allowed = [t for t in range(len(tokenizer)) if bits[t // 32] >> (t % 32) & 1]
        ids.append(rng.choice(allowed))
        assert matcher.consume_token(ids[-1]), matcher.get_error()
    eos = tokenizer.eos_token_id
    return tokenizer.decode([t for t in ids if t != eos])


def functions(tools: list[dict[str, Any]]) -> list[Any]:
    return [t.function for t in request(tools=tools).tools]


@pytest.mark.parametrize("one_call", [True, False])
def test_text_sampled_under_the_call_grammar_parses_into_valid_calls(tokenizer, one_call) -> None:
    grammar = call_grammar(functions(TOOLS), one_call)
    counts = set()
    for seed in range(12):
        parsed = parse_tool_calls(sample_under(grammar, tokenizer, seed))
        assert parsed.content == "" and parsed.calls
        counts.add(len(parsed.calls))
        for call in parsed.calls:
            schema = SCHEMAS[call.name] or {"type": "object", "additionalProperties": False}
            jsonschema.validate(json.loads(call.arguments), schema)
    assert (counts == {1}) if one_call else (max(counts) > 1)


def test_the_call_grammar_with_an_answer_allows_calls_or_that_json(tokenizer) -> None:
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    grammar = call_grammar(functions([ADD]), True, answer)
    kinds = set()
    for seed in range(16):
        text = sample_under(grammar, tokenizer, seed)
        parsed = parse_tool_calls(text)
        if parsed.calls:
            kinds.add("call")
            assert parsed.calls[0].name == "add" and parsed.content == ""
        else:
            kinds.add("answer")
            jsonschema.validate(json.loads(text), answer)
    assert kinds == {"call", "answer"}


# Through the openai client against a served model (the engine applies the grammar)


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    fields = {"messages": MESSAGES, "max_tokens": 300, **fields}
    return client.chat.completions.create(model="tiny-tools", **fields)


def check_calls(message: Any, names: set[str]) -> None:
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        schema = SCHEMAS[call.function.name] or {"type": "object", "additionalProperties": False}
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_a_required_call_follows_the_functions_schemas(client: openai.OpenAI, seed) -> None:
    out = chat(client, tools=TOOLS, tool_choice="required", seed=seed,
               temperature=0 if seed is None else 1)  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message, set(SCHEMAS))


def test_a_named_call_and_one_call_only(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        out = chat(client, tools=TOOLS, tool_choice=named, seed=seed, temperature=1)
        check_calls(out.choices[0].message, {"add"})
        assert len(out.choices[0].message.tool_calls) == 1
        one = chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                   seed=seed, temperature=1)  # fmt: skip
        assert len(one.choices[0].message.tool_calls) == 1


def template_tokens(server: Server, messages: list[dict[str, Any]], tools: Any) -> int:
    """Tokens of the conversation as the model's template renders it, tool calls' arguments
    decoded (as templates read them)."""

    def decoded(c: dict[str, Any]) -> dict[str, Any]:
        return {**c, "function": {**c["function"],
                                  "arguments": json.loads(c["function"]["arguments"])}}

    rendered = [{**m, "content": m["content"] or "",
                 "tool_calls": [decoded(c) for c in m["tool_calls"]]}
                if m.get("tool_calls") else m for m in messages]  # fmt: skip
    hf = server.engine.engine.tokenizer.hf
    text = hf.apply_chat_template(rendered, tools=tools, tokenize=False,
                                  add_generation_prompt=True)  # fmt: skip
    return len(hf.encode(text, add_special_tokens=False))


def conversation_with(call: dict[str, Any]) -> list[dict[str, Any]]:
    """MESSAGES, the assistant's call (no content), the tool's result."""
    return [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": '{"celsius": 21}'}]  # fmt: skip


def test_calls_and_tool_results_are_rendered_by_the_template(
    client: openai.OpenAI, tools_server: Server
) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = conversation_with(call)
    for choice, tools in (("auto", TOOLS), ("none", None)):  # none: tools not rendered
        out = chat(client, messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=2)
        assert out.usage.prompt_tokens == template_tokens(tools_server, messages, tools)
    bad = {**call, "function": {"name": "f", "arguments": "{not json"}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages=conversation_with(bad))
    assert e.value.body["param"] == "messages.1.tool_calls.0.function.arguments"


def test_a_tool_call_round_trip(client: openai.OpenAI, tools_server: Server) -> None:
    first = chat(client, tools=TOOLS, tool_choice={"type": "function",
                                                   "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages = conversation_with(call.model_dump())
    answer = chat(client, messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens == template_tokens(tools_server, messages, TOOLS)


def streamed(client: openai.OpenAI, **fields: Any) -> Any:
    """The final completion the openai client accumulates from a stream."""
    fields = {"messages": MESSAGES, "max_tokens": 300, **fields}
    with client.chat.completions.stream(model="tiny-tools", **fields) as s:
        for _ in s:
            pass
        return s.get_final_completion()


@pytest.mark.parametrize("parallel", [True, False])
def test_streamed_calls_equal_the_whole_answers(client: openai.OpenAI, parallel: bool) -> None:
    fields = {"tools": TOOLS, "tool_choice": "required", "temperature": 0,
              "parallel_tool_calls": parallel}  # fmt: skip
    whole, stream = chat(client, **fields), streamed(client, **fields)
    calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    got = [(c.function.name, c.function.arguments) for c in stream.choices[0].message.tool_calls]
    assert got == calls
    assert stream.choices[0].finish_reason == "tool_calls"
    assert not stream.choices[0].message.content


def test_greedy_calls_with_speculation_equal_plain_decoding(client: openai.OpenAI) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        fields = {"tools": TOOLS, "tool_choice": choice, "temperature": 0}
        spec = chat(client, **fields)
        plain = chat(client, **fields, extra_body={"speculative": False})
        assert spec.model_extra["speculation"]["num_draft_tokens"] > 0
        dump = [c.function.model_dump() for c in spec.choices[0].message.tool_calls]
        assert dump == [c.function.model_dump() for c in plain.choices[0].message.tool_calls]


def test_auto_answers_are_parsed_and_never_fail(client: openai.OpenAI) -> None:
    for seed in range(3):
        out = chat(client, tools=TOOLS, seed=seed, temperature=1, max_tokens=40)
        message = out.choices[0].message
        assert message.content is not None or message.tool_calls


def test_auto_with_a_json_response_format_answers_calls_or_that_json(client: openai.OpenAI) -> None:
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": answer}}
    for seed in range(4):
        out = chat(client, tools=[ADD], response_format=response_format, seed=seed,
                   temperature=1)  # fmt: skip
        message = out.choices[0].message
        if message.tool_calls:
            check_calls(message, {"add"})
        else:
            jsonschema.validate(json.loads(message.content), answer)


def test_each_of_n_choices_has_its_own_calls(client: openai.OpenAI) -> None:
    fields = {"tools": TOOLS, "tool_choice": "required", "n": 3, "seed": 5, "temperature": 1}
    whole = chat(client, **fields)
    for choice in whole.choices:
        check_calls(choice.message, set(SCHEMAS))
    stream = streamed(client, **fields)  # seeded: choice i uses seed + i, streamed or not

    def calls(out: Any) -> list[list[tuple[str, str]]]:
        return [[(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
                for ch in out.choices]  # fmt: skip

    assert calls(stream) == calls(whole)
