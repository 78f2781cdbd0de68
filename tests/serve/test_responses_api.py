"""OpenAI's Responses API (POST /v1/responses) through a real server: the openai client's
`responses.create`, `parse` and `stream`, every body and event checked against the SDK's own
pydantic types; greedy answers equal the chat endpoint's for the same conversation; function
tools forced and their outputs sent back; an openai-agents Agent on its default Responses
model; and the 400s of what this server does not take."""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.request
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests.helpers.serving import assert_error, blocks_free, call, wait_until
from verispec.serve import Server
from verispec.serve.responses_reply import ResponsesReply
from verispec.serve.responses_request import ResponsesRequest
from verispec.serve.tool_calls import ToolCallParser
from verispec.types.outputs import RequestMetrics, RequestOutput

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTION = "for i in range(10):"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10},
                       "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False,
    },
    "strict": True,
}  # fmt: skip
ADD = {
    "type": "function",
    "name": "add",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": -9, "maximum": 9},
                       "b": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False,
    },
}  # fmt: skip
SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER, ADD)}
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


# The builder alone: the same response whole or fed in any pieces


MIXED = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
         '\n<tool_call>\n{"name": "add", "arguments": {"a": 3}}\n</tool_call>\nDone.')  # fmt: skip


def answer(text: str, finish_reason: str = "stop") -> RequestOutput:
    return RequestOutput("r", None, [1, 2, 3], text, [7] * 9, finish_reason, RequestMetrics())


def without_ids(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")}
            for item in response["output"]]  # fmt: skip


def fed(text: str, cuts: list[int], parse_tools: bool, reason: str = "stop") -> list[dict]:
    """The events of `text` fed to a builder in the pieces `cuts` make."""
    reply = ResponsesReply("m", ResponsesRequest(input="hi"), 3,
                           ToolCallParser if parse_tools else None)
    bounds = [0, *cuts, len(text)]
    events = reply.start()
    for start, end in itertools.pairwise(bounds):
        events += reply.feed(text[start:end], final=end == len(text))
    return events + reply.finish(answer(text, reason))


@pytest.mark.parametrize("parse_tools", [True, False])
def test_any_pieces_give_the_whole_answer_s_response(parse_tools: bool) -> None:
    reply = ResponsesReply("m", ResponsesRequest(input="hi"), 3,
                           ToolCallParser if parse_tools else None)
    whole = reply.response(answer(MIXED)).model_dump()
    Response.model_validate(whole)
    if parse_tools:  # the message (the text outside calls) first, then the calls in order
        assert without_ids(whole) == [
            {"type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me add.Done.", "annotations": [],
                          "logprobs": []}]},
            {"type": "function_call", "name": "add", "arguments": '{"a": 1, "b": 2}',
             "status": "completed"},
            {"type": "function_call", "name": "add", "arguments": '{"a": 3}',
             "status": "completed"},
        ]  # fmt: skip
    else:
        assert whole["output"][0]["content"][0]["text"] == MIXED
    for cuts in ([], list(range(1, len(MIXED))), [5, 14, 30, 70, 71, 100]):
        events = fed(MIXED, cuts, parse_tools)
        for i, event in enumerate(events):
            EVENTS.validate_python(event)
            assert event["sequence_number"] == i
        final = events[-1]["response"]
        assert events[-1]["type"] == "response.completed"
        assert without_ids(final) == without_ids(whole) and final["usage"] == whole["usage"]
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == whole["output"][0]["content"][0]["text"]


def test_an_answer_of_calls_only_has_no_message_and_a_cut_one_is_incomplete() -> None:
    calls_only = MIXED[len("Let me add.\n") : -len("\nDone.")]
    events = fed(calls_only, [20], parse_tools=True)
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["function_call"] * 2
    cut = fed("", [], parse_tools=False, reason="length")  # nothing said: an empty message
    final = cut[-1]["response"]
    assert cut[-1]["type"] == "response.incomplete" and final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert without_ids(final)[0]["content"][0]["text"] == ""
    Response.model_validate(final)


@pytest.fixture(scope="module")
def chat_client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def served(client: openai.OpenAI) -> str:
    """The name of the model the client's server serves."""
    return client.models.list().data[0].id


def create(client: openai.OpenAI, **fields: Any) -> Response:
    """A response, its raw body first validated strictly by the SDK's Response type."""
    fields.setdefault("model", served(client))
    raw = client.responses.with_raw_response.create(**fields)
    body = json.loads(raw.http_response.text)
    checked = Response.model_validate(body)
    assert checked.object == "response" and checked.id.startswith("resp_")
    assert checked.usage.total_tokens == checked.usage.input_tokens + checked.usage.output_tokens
    return raw.parse()


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return client.chat.completions.create(model=served(client), messages=messages, **fields)


def test_string_input_equals_the_chat_answer(chat_client: openai.OpenAI) -> None:
    out = create(chat_client, model="tiny-chat", input=QUESTION, max_output_tokens=24,
                 temperature=0)  # fmt: skip
    expected = chat(chat_client, [{"role": "user", "content": QUESTION}], max_tokens=24,
                    temperature=0)  # fmt: skip
    assert [item.type for item in out.output] == ["message"]
    message = out.output[0]
    assert message.role == "assistant" and message.id.startswith("msg_")
    assert out.output_text == expected.choices[0].message.content
    assert out.usage.input_tokens == expected.usage.prompt_tokens
    assert out.usage.output_tokens == expected.usage.completion_tokens
    length = expected.choices[0].finish_reason == "length"
    assert out.status == ("incomplete" if length else "completed")
    assert message.status == out.status
    assert out.model_extra["speculation"]["num_draft_tokens"] > 0
    assert (out.temperature, out.top_p, out.tools, out.tool_choice) == (0, 1, [], "auto")


def test_messages_with_instructions_equal_the_chat_answer(chat_client: openai.OpenAI) -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "x = 1"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "y = 2", "annotations": []}]},
        {"role": "developer", "content": "Answer in code."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "z = "}, {"type": "input_text", "text": "3"}]},
    ]  # fmt: skip
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "x = 1"}, {"role": "assistant", "content": "y = 2"},
                {"role": "developer", "content": "Answer in code."},
                {"role": "user", "content": "z = 3"}]  # fmt: skip
    for speculative in (True, False):
        out = create(chat_client, input=items, instructions="Be brief.", max_output_tokens=16,
                     temperature=0, extra_body={"speculative": speculative})  # fmt: skip
        expected = chat(chat_client, messages, max_tokens=16, temperature=0)
        assert out.output_text == expected.choices[0].message.content
        assert out.usage.input_tokens == expected.usage.prompt_tokens
        assert out.instructions == "Be brief."


def test_max_output_tokens_cuts_the_answer_incomplete(chat_client: openai.OpenAI) -> None:
    out = create(chat_client, input=QUESTION, max_output_tokens=3, temperature=0,
                 metadata={"run": "a"}, store=False, user="u", reasoning={"effort": "low"})
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 3 and out.max_output_tokens == 3
    assert out.metadata == {"run": "a"} and out.output[0].status == "incomplete"


class Answer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    ok: bool
    digit: int = pydantic.Field(ge=0, le=9)


def test_a_json_schema_format_answers_that_json(chat_client: openai.OpenAI) -> None:
    parsed = chat_client.responses.parse(model="tiny-chat", input=QUESTION, text_format=Answer,
                                         temperature=0)  # fmt: skip
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Answer)
    schema = Answer.model_json_schema()
    for seed_temperature in (0.0, 1.0):
        out = create(chat_client, input=QUESTION, temperature=seed_temperature,
                     text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                      "strict": True}})  # fmt: skip
        jsonschema.validate(json.loads(out.output_text), schema)
        assert out.text.format.type == "json_schema"
    whole = create(chat_client, input=QUESTION, text={"format": {"type": "json_object"}},
                   max_output_tokens=40)  # fmt: skip
    assert whole.output_text.startswith("{")


def raw_events(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response, read off the wire, each validated strictly by the
    SDK's event types, numbered in order and named by its `event:` line."""
    request = urllib.request.Request(server.url + "/v1/responses",
                                     json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_stream_s_events_build_the_whole_response(
    server: Server, chat_client: openai.OpenAI
) -> None:
    body = {"input": QUESTION, "max_output_tokens": 20, "temperature": 0}
    events = raw_events(server, body)
    kinds = [e["type"] for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    whole = create(chat_client, **body)
    assert deltas == whole.output_text == events[-1]["response"]["output"][0]["content"][0]["text"]
    assert events[-1]["response"]["usage"] == whole.usage.model_dump()


def test_the_sdk_streams_a_completed_response(chat_client: openai.OpenAI) -> None:
    fields = {"model": "tiny-chat", "input": QUESTION, "temperature": 0, "text_format": Answer}
    with chat_client.responses.stream(**fields) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    whole = chat_client.responses.parse(**fields)
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.output_parsed == whole.output_parsed and final.status == "completed"


# Function tools, on the model whose chat template takes tools


@pytest.fixture(scope="module")
def tools_client(tools_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0)


def check_calls(out: Response, names: set[str]) -> list[Any]:
    """The response's function_call items, each a valid call of one of `names`."""
    calls = [item for item in out.output if item.type == "function_call"]
    assert calls and out.status == "completed"
    for item in calls:
        assert item.call_id.startswith("call_") and item.id.startswith("fc_")
        assert item.name in names and item.status == "completed"
        jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])
    return calls


def as_chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "add"}])
def test_forced_tool_calls_are_function_call_items(tools_client: openai.OpenAI, choice) -> None:
    fields = {"model": "tiny-tools", "input": "What is 2 + 3?", "tools": [WEATHER, ADD],
              "tool_choice": choice, "temperature": 0}  # fmt: skip
    out = create(tools_client, **fields)
    calls = check_calls(out, {"add"} if isinstance(choice, dict) else set(SCHEMAS))
    assert [item.type for item in out.output] == ["function_call"] * len(calls)
    chat_choice = choice if isinstance(choice, str) else {"type": "function",
                                                           "function": {"name": "add"}}
    expected = chat(tools_client, [{"role": "user", "content": "What is 2 + 3?"}],
                    tools=[as_chat_tool(WEATHER), as_chat_tool(ADD)], tool_choice=chat_choice,
                    temperature=0).choices[0].message.tool_calls  # fmt: skip
    assert [(c.name, c.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in expected
    ]
    with tools_client.responses.stream(**fields) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [(c.name, c.arguments) for c in check_calls(final, set(SCHEMAS))] == [
        (c.name, c.arguments) for c in calls
    ]


def test_a_streamed_call_s_events(tools_server: Server) -> None:
    body = {"input": "What is 2 + 3?", "tools": [ADD], "tool_choice": "required",
            "parallel_tool_calls": False, "temperature": 0}  # fmt: skip
    events = raw_events(tools_server, body)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]  # fmt: skip
    added, delta, done, item_done, completed = events[2:]
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    assert delta["delta"] == done["arguments"] == item_done["item"]["arguments"]
    assert completed["response"]["output"] == [item_done["item"]]


def test_a_second_turn_with_the_call_and_its_output(
    tools_client: openai.OpenAI, tools_server: Server
) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = create(tools_client, input=[question], tools=[WEATHER],
                   tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                   parallel_tool_calls=False)  # fmt: skip
    (call_item,) = check_calls(first, {"get_weather"})
    result = {"type": "function_call_output", "call_id": call_item.call_id,
              "output": '{"celsius": 21}'}  # fmt: skip
    items = [question, call_item.model_dump(exclude_none=True), result]
    second = create(tools_client, input=items, tools=[WEATHER], max_output_tokens=12,
                    temperature=0)  # fmt: skip
    messages = [question,
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call_item.call_id, "type": "function",
                                 "function": {"name": call_item.name,
                                              "arguments": call_item.arguments}}]},
                {"role": "tool", "tool_call_id": call_item.call_id, "content": '{"celsius": 21}'}]
    expected = chat(tools_client, messages, tools=[as_chat_tool(WEATHER)], max_tokens=12,
                    temperature=0)  # fmt: skip
    assert second.usage.input_tokens == expected.usage.prompt_tokens
    text = expected.choices[0].message.content or ""
    assert second.output_text == text


def calculator(url: str, calls: list[tuple[int, int]], model_name: str = "tiny-tools",
               **agent: Any) -> Any:  # fmt: skip
    """An openai-agents Agent with one function tool (its calls recorded in `calls`) on the
    SDK's default model, OpenAIResponsesModel, served at `url`: the tool forced on the first
    turn (the SDK lets the next turn answer freely), greedy, one call at a time."""
    import agents

    @agents.function_tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        calls.append((a, b))
        return f"the sum is {a + b}"

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    settings = agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=200,
                                    parallel_tool_calls=False)  # fmt: skip
    model = agents.OpenAIResponsesModel(model=model_name, openai_client=client)
    return agents.Agent(name="calculator", instructions="Add numbers.", tools=[add],
                        model=model, model_settings=settings, **agent)  # fmt: skip


def test_an_openai_agents_agent_calls_its_tool_and_answers(tools_server: Server) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[tuple[int, int]] = []
    result = agents.Runner.run_sync(calculator(tools_server.url, calls), "What is 2 + 3?",
                                    max_turns=2)  # fmt: skip
    assert len(calls) == 1  # the forced call ran, its output went back, the answer came
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert outputs == [f"the sum is {sum(calls[0])}"]
    assert isinstance(result.final_output, str) and len(result.raw_responses) == 2

    async def streamed() -> Any:
        run = agents.Runner.run_streamed(calculator(tools_server.url, calls), "What is 2 + 3?",
                                         max_turns=2)  # fmt: skip
        async for _ in run.stream_events():
            pass
        return run

    run = asyncio.run(streamed())  # the SDK reads the events of both turns
    assert calls[1] == calls[0] and run.final_output == result.final_output


def test_an_openai_agents_agent_calls_its_tool_on_a_model_without_tools_in_its_template(
    generic_server: Server,
) -> None:
    """The default path of the SDK on a model like the default one: the generic tool format
    through the Responses API (the run stops at the tool's output: a tiny random model's free
    answer could run on past any bound)."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[tuple[int, int]] = []
    agent = calculator(generic_server.url, calls, "tiny-generic",
                       tool_use_behavior="stop_on_first_tool")  # fmt: skip
    result = agents.Runner.run_sync(agent, "What is 2 + 3?", max_turns=2)
    assert len(calls) == 1 and result.final_output == f"the sum is {sum(calls[0])}"


def test_a_failing_step_is_a_500_or_a_failed_event(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.engine.engine
    real_step = engine.step

    def failing_step() -> Any:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(engine, "step", failing_step)
    status, body = call(server.url, "/v1/responses", {"input": QUESTION, "max_output_tokens": 4})
    assert_error(status, body, 500)
    assert "injected fault" in body["error"]["message"]
    events = raw_events(server, {"input": QUESTION, "max_output_tokens": 4})
    assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                           "response.failed"]  # fmt: skip
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and "injected fault" in failed["error"]["message"]
    monkeypatch.setattr(engine, "step", real_step)
    wait_until(lambda: blocks_free(server))


# What this server does not take


BAD = [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0.type"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"input": [{"role": "user"}]}, "input.0.content"),
    ({"input": [{"role": "user", "content": "x", "phase": "final"}]}, "input.0.phase"),
    ({"input": [{"role": "user", "content": "x", "output": "y"}]}, "input.0.output"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]},
     "input.0.arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c",
                 "output": [{"type": "input_file", "file_id": "f"}]}]}, "input.0.output.0.type"),
    ({"input": []}, "input"),
    ({"input": [5]}, "input"),
    ({"input": 5}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "tools": [{"type": "function", "name": "a b"}]}, "tools.0.name"),
    ({"input": "hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "a",
                                         "schema": {"type": "nope"}}}}, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "grammar"}}}, "text.format"),
    ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": "hi", "model": "gpt-4o"}, "model"),
    ({"input": "hi", "top_logprobs": 2}, "top_logprobs"),
    ({"input": "hi\ud800"}, "input"),
    ({"input": "x" * 3000}, "input"),
    ({}, None),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD, ids=lambda v: str(v)[:50])
def test_what_is_not_taken_is_a_400_naming_it(server: Server, body, param) -> None:
    status, answer = call(server.url, "/v1/responses", body)
    assert_error(status, answer, 400, param)


def test_an_empty_body_is_answered_with_an_example(server: Server) -> None:
    status, answer = call(server.url, "/v1/responses", method="POST", raw=b"")
    assert_error(status, answer, 400)
    assert answer["error"]["message"].endswith('e.g. {"input": "Hi"}')


def test_the_tool_errors_of_the_chat_path_name_responses_fields(tools_server: Server) -> None:
    bad = {"input": "hi", "tools": [ADD, ADD]}
    assert_error(*call(tools_server.url, "/v1/responses", bad), 400, "tools")
    bad = {"input": "hi", "tools": [{**ADD, "parameters": {"type": "string"}}]}
    assert_error(*call(tools_server.url, "/v1/responses", bad), 400, "tools.0.parameters")
    bad = {"input": "hi", "tools": [ADD], "tool_choice": {"type": "function", "name": "nope"}}
    assert_error(*call(tools_server.url, "/v1/responses", bad), 400, "tool_choice")
    status, answer = call(tools_server.url, "/v1/responses", {
        "input": "hi", "tools": [ADD], "tool_choice": "required",
        "text": {"format": {"type": "json_object"}}})  # fmt: skip
    assert_error(status, answer, 400, "tool_choice")
