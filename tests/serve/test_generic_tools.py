"""Tools on a model whose chat template takes none, in the generic format: the plan (what each
tool_choice allows), the grammar (text sampled under it parses into valid calls or a reply), the
conversation's rewriting (calls and results as JSON text, turns a strict template accepts), and
through the openai client against a served model with such a template: forced and free calls,
streamed equal to whole, a round trip, greedy equal to the in-process LLM under the same grammar."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import openai
import pytest

from tests.helpers.chat import TEMPLATE, with_chat_template
from tests.serve.test_tools import ADD, MESSAGES, SCHEMAS, TOOLS, WEATHER, sample_under
from verispec import LLM
from verispec.serve import Server
from verispec.serve.errors import APIError
from verispec.serve.generic_tool_calls import GenericCallParser
from verispec.serve.generic_tools import TEXT, GenericPrompt, generic_grammar
from verispec.serve.protocol import ChatCompletionRequest
from verispec.serve.tools import plan_output
from verispec.types.chat import render_chat
from verispec.types.sampling_params import SamplingParams
from verispec.types.sampling_params import StructuredOutputsParams as S

pytestmark = pytest.mark.usefixtures("one_thread")

NAMED = {"type": "function", "function": {"name": "add"}}
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # fmt: skip
# A template that refuses any role but alternating user and assistant turns (Llama 2's kind)
STRICT = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
)


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def plan(constraint: Any = None, template: str = TEMPLATE, **fields: Any):
    return plan_output(request(**fields), SimpleNamespace(chat_template=template), "m",
                       constraint)  # fmt: skip


def test_each_tool_choice_constrains_the_answer_to_its_forms() -> None:
    auto = plan(tools=TOOLS)
    assert auto.template_tools is None and auto.parse_tools is not None
    start = auto.constraint.grammar.splitlines()[1]
    assert start == "start: one_call | calls | response"
    assert '"{\\"tool_call\\": "' in auto.constraint.grammar and "get_weather" in auto.prompt.system
    one = plan(tools=TOOLS, parallel_tool_calls=False).constraint.grammar
    assert one.splitlines()[1] == "start: one_call | response"
    required = plan(tools=TOOLS, tool_choice="required").constraint.grammar
    assert required.splitlines()[1] == "start: one_call | calls"
    named = plan(tools=TOOLS, tool_choice=NAMED)
    assert named.constraint.grammar.splitlines()[1] == "start: one_call"
    assert "get_weather" not in named.constraint.grammar + named.prompt.system
    json_reply = plan(S(json=ANSWER), tools=TOOLS).constraint.grammar
    assert '"required": ["ok"]' in json_reply.split("answer: %json", 1)[1]


def test_tool_choice_none_renders_no_tools_but_rewrites_the_history() -> None:
    none = plan(tools=TOOLS, tool_choice="none")
    assert none.constraint is None and none.parse_tools is None
    assert none.prompt is not None and none.prompt.system is None


@pytest.mark.parametrize(("constraint", "fields", "param"), [
    (S(regex="a+"), {"tools": TOOLS}, "tools"),
    (S(json_object=True), {"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    (None, {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
])  # fmt: skip
def test_what_cannot_be_done_is_still_a_400(constraint, fields, param) -> None:
    with pytest.raises(APIError) as e:
        plan(constraint, **fields)
    assert (e.value.status, e.value.param) == (400, param)


def check_call(name: str, arguments: str, names: set[str]) -> None:
    assert name in names
    schema = SCHEMAS[name] or {"type": "object", "additionalProperties": False}
    jsonschema.validate(json.loads(arguments), schema)


SHORT = {**TEXT, "maxLength": 12}  # a reply drawn at random ends


@pytest.mark.parametrize(("one_call", "response"), [(True, SHORT), (False, SHORT), (False, None),
                                                    (True, ANSWER)])  # fmt: skip
def test_text_sampled_under_the_grammar_parses_into_calls_or_a_reply(
    tokenizer, one_call: bool, response: Any
) -> None:
    functions = [t.function for t in request(tools=TOOLS).tools]
    grammar = generic_grammar(functions, one_call, response)
    kinds, counts = set(), set()
    for seed in range(16):
        text = sample_under(grammar, tokenizer, seed)
        parsed = GenericCallParser(response is ANSWER).feed(text, final=True)
        if parsed.calls:
            kinds.add("call")
            counts.add(len(parsed.calls))
            assert parsed.content == ""
            for call in parsed.calls:
                check_call(call.name, call.arguments, set(SCHEMAS))
        else:
            kinds.add("reply")
            assert json.loads(text)["response"] is not None
            if response is ANSWER:
                jsonschema.validate(json.loads(parsed.content), ANSWER)
    assert kinds == ({"call"} if response is None else {"call", "reply"})
    assert (counts == {1}) if one_call else (max(counts) > 1)


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and a sum?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "c2", "type": "function",
                     "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "3"},
    {"role": "user", "content": "Thanks."},
]  # fmt: skip
CALLS_TEXT = ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
              '{"name": "add", "arguments": {"a": 1, "b": 2}}]}')  # fmt: skip
RESULTS = ['{"tool_response": {"name": "get_weather", "content": "21 C"}}',
           '{"tool_response": {"name": "add", "content": "3"}}']  # fmt: skip


def test_calls_and_results_become_json_text_in_user_turns_merged() -> None:
    out = GenericPrompt("TOOLS").apply(HISTORY)
    assert out == [
        {"role": "system", "content": "TOOLS\n\nBe brief."},
        {"role": "user", "content": "Weather and a sum?"},
        {"role": "assistant", "content": CALLS_TEXT},
        {"role": "user", "content": "\n\n".join([*RESULTS, "Thanks."])},
    ]


def test_results_in_tool_turns_where_the_template_names_that_role() -> None:
    out = GenericPrompt(None, tool_role=True).apply(HISTORY[1:])
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "tool", "user"]
    assert [m["content"] for m in out[2:4]] == RESULTS


def test_the_tools_text_goes_first_in_a_new_system_turn_or_the_first_turn() -> None:
    assert GenericPrompt("T").apply(MESSAGES) == [{"role": "system", "content": "T"}, *MESSAGES]
    first = GenericPrompt("T", system_role=False).apply(MESSAGES)
    assert first == [{"role": "user", "content": f"T\n\n{MESSAGES[0]['content']}"}]


def test_a_strict_template_renders_the_rewritten_history(tokenizer) -> None:
    p = plan(template=STRICT, tools=TOOLS)
    assert not p.prompt.system_role and not p.prompt.tool_role
    strict = with_chat_template(tokenizer)
    strict.chat_template = STRICT
    with pytest.raises(ValueError, match="alternate"):
        render_chat(strict, HISTORY[1:], "m", {})
    text = render_chat(strict, p.conversation(HISTORY[1:]), "m", {})
    assert text.count("[user]") == 2 and RESULTS[1] in text and text.startswith("[user] You can")


# Through the openai client against a served model whose template takes no tools


@pytest.fixture(scope="module")
def client(generic_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=generic_server.url + "/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    fields = {"messages": MESSAGES, "max_tokens": 400, **fields}
    return client.chat.completions.create(model="tiny-generic", **fields)


def calls_of(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_forced_calls_follow_the_schemas(client: openai.OpenAI, choice: Any) -> None:
    names = set(SCHEMAS) if choice == "required" else {"add"}
    for seed in (None, 1, 2):
        out = chat(client, tools=TOOLS, tool_choice=choice, seed=seed,
                   temperature=0 if seed is None else 1)  # fmt: skip
        choice_ = out.choices[0]
        assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
        assert choice_.message.tool_calls and all(c.id.startswith("call_")
                                                  for c in choice_.message.tool_calls)
        for name, arguments in calls_of(choice_.message):
            check_call(name, arguments, names)


def test_auto_answers_a_call_or_a_reply(client: openai.OpenAI) -> None:
    for seed in range(4):
        out = chat(client, tools=[WEATHER, ADD], seed=seed, temperature=1, max_tokens=60)
        message, reason = out.choices[0].message, out.choices[0].finish_reason
        if message.tool_calls:
            assert reason == "tool_calls"
            for name, arguments in calls_of(message):
                check_call(name, arguments, {"get_weather", "add"})
        else:
            assert isinstance(message.content, str) and reason in ("stop", "length")
            assert not message.content.startswith('{"response"') or reason == "length"


def test_auto_with_a_json_response_format_replies_in_that_json(client: openai.OpenAI) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    for seed in range(4):
        out = chat(client, tools=[ADD], response_format=response_format, seed=seed,
                   temperature=1)  # fmt: skip
        message = out.choices[0].message
        if message.tool_calls:
            check_call(*calls_of(message)[0], {"add"})
        else:
            jsonschema.validate(json.loads(message.content), ANSWER)


def test_tool_choice_none_is_free_text(client: openai.OpenAI) -> None:
    out = chat(client, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert out.choices[0].message.tool_calls is None


def streamed(client: openai.OpenAI, **fields: Any) -> dict[int, dict[str, Any]]:
    """Each choice of a stream assembled from its deltas as OpenAI's are (content joined, calls
    by index: id, type and name once, arguments joined), with how many deltas had content."""
    fields = {"messages": MESSAGES, "max_tokens": 400, **fields}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(model="tiny-generic", stream=True, **fields):
        for c in chunk.choices:
            got = choices.setdefault(c.index, {"content": "", "calls": {}, "pieces": 0})
            got["content"] += c.delta.content or ""
            got["pieces"] += bool(c.delta.content)
            for call in c.delta.tool_calls or []:
                if call.id is not None:
                    assert call.type == "function" and call.index not in got["calls"]
                    got["calls"][call.index] = [call.function.name, ""]
                got["calls"][call.index][1] += call.function.arguments or ""
            if c.finish_reason is not None:
                got["finish_reason"] = c.finish_reason
    return choices


@pytest.mark.parametrize("fields", [
    {"tool_choice": "required", "temperature": 0},
    {"tool_choice": "required", "n": 2, "seed": 3, "temperature": 1},
    {"tool_choice": NAMED, "temperature": 0},
    {"seed": 0, "temperature": 1, "max_tokens": 40},
    {"seed": 1, "temperature": 1, "max_tokens": 40},
])  # fmt: skip
def test_a_stream_equals_the_whole_answer(client: openai.OpenAI, fields: dict) -> None:
    whole = chat(client, tools=[WEATHER, ADD], **fields)
    stream = streamed(client, tools=[WEATHER, ADD], **fields)
    for a in whole.choices:
        b = stream[a.index]
        assert [tuple(b["calls"][i]) for i in sorted(b["calls"])] == calls_of(a.message)
        assert (b["content"] or None) == a.message.content
        assert b["finish_reason"] == a.finish_reason
        if len(a.message.content or "") > 8:
            assert b["pieces"] > 1  # a plain reply streams as it is written


def test_a_round_trip_renders_the_call_and_its_result(
    client: openai.OpenAI, generic_server: Server
) -> None:
    first = chat(client, tools=TOOLS, tool_choice={"type": "function",
                                                   "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages = [*MESSAGES, {"role": "assistant", "content": None,
                            "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "21 C"}]  # fmt: skip
    answer = chat(client, messages=messages, tools=TOOLS, max_tokens=2, tool_choice="none")
    written = json.dumps({"tool_call": {"name": "get_weather",
                                        "arguments": json.loads(call.function.arguments)}},
                         ensure_ascii=False)  # fmt: skip
    expected = [*MESSAGES, {"role": "assistant", "content": written},
                {"role": "user", "content": json.dumps(
                    {"tool_response": {"name": "get_weather", "content": "21 C"}})}]  # fmt: skip
    hf = generic_server.engine.engine.tokenizer.hf
    text = hf.apply_chat_template(expected, tokenize=False, add_generation_prompt=True)
    assert answer.usage.prompt_tokens == len(hf.encode(text, add_special_tokens=False))
    again = chat(client, messages=messages, tools=TOOLS, max_tokens=40)  # tools rendered again
    assert again.choices[0].message.content is not None or again.choices[0].message.tool_calls


def test_greedy_calls_equal_the_in_process_llms_under_the_same_grammar(
    client: openai.OpenAI, generic_pair: tuple[Path, Path]
) -> None:
    reference = LLM(model=str(generic_pair[0]), speculative=None, batch_invariant=True)
    for fields in ({"tool_choice": "required"}, {"tool_choice": NAMED}, {}):
        served = chat(client, tools=TOOLS, temperature=0, **fields)
        plain = chat(client, tools=TOOLS, temperature=0, extra_body={"speculative": False},
                     **fields)  # fmt: skip
        p = plan(tools=TOOLS, **fields)
        params = SamplingParams(temperature=0, max_tokens=400, structured_outputs=p.constraint)
        text = reference.chat(p.conversation(MESSAGES), params)[0].text
        expected = GenericCallParser().feed(text, final=True)
        got = [(c.name, c.arguments) for c in expected.calls]
        assert calls_of(served.choices[0].message) == got == calls_of(plain.choices[0].message)
        assert (served.choices[0].message.content or "") == expected.content
    assert served.model_extra["speculation"]["num_draft_tokens"] > 0
