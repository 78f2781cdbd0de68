"""The server through LangChain's `ChatOpenAI`: `with_structured_output` of a pydantic model by
JSON schema and by function calling, `bind_tools` with a required and a named tool_choice,
streamed calls merged as LangChain merges them, and a round trip with the tool's result."""

from __future__ import annotations

from typing import Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")


class Person(BaseModel):
    """A person."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)
    color: Literal["red", "green", "blue"]


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


class Add(BaseModel):
    """The sum of two small integers."""

    a: int = Field(ge=-100, le=100)
    b: int = Field(ge=-100, le=100)


QUESTION = [HumanMessage("What is the weather in Paris?")]


@pytest.fixture(scope="module")
def llm(tools_server: Server) -> ChatOpenAI:
    return ChatOpenAI(base_url=tools_server.url + "/v1", api_key="unused", model="tiny-tools",
                      temperature=0, max_tokens=300, max_retries=0)  # fmt: skip


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_gives_the_pydantic_model(llm: ChatOpenAI, method: str) -> None:
    out = llm.with_structured_output(Person, method=method).invoke("Describe someone.")
    assert isinstance(out, Person)
    for seed in range(3):  # sampled answers validate too
        sampled = llm.bind(seed=seed, temperature=1).with_structured_output(Person, method=method)
        assert isinstance(sampled.invoke("Describe someone."), Person)


@pytest.mark.parametrize("choice", ["required", "GetWeather"])
def test_bind_tools_with_tool_choice_gives_calls(llm: ChatOpenAI, choice: str) -> None:
    message = llm.bind_tools([GetWeather, Add], tool_choice=choice).invoke(QUESTION)
    assert isinstance(message, AIMessage) and message.tool_calls
    call = message.tool_calls[0]
    assert call["name"] in ({"GetWeather", "Add"} if choice == "required" else {"GetWeather"})
    {"GetWeather": GetWeather, "Add": Add}[call["name"]].model_validate(call["args"])
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_streamed_calls_merge_into_the_whole_answers_calls(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([GetWeather, Add], tool_choice="required")
    whole = bound.invoke(QUESTION)
    merged: AIMessageChunk | None = None
    for chunk in bound.stream(QUESTION):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    strip = [{"name": c["name"], "args": c["args"]} for c in whole.tool_calls]
    assert [{"name": c["name"], "args": c["args"]} for c in merged.tool_calls] == strip


def test_a_tool_call_round_trip(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([GetWeather, Add])
    call = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke(QUESTION)
    result = ToolMessage('{"celsius": 21}', tool_call_id=call.tool_calls[0]["id"])
    answer = bound.bind(max_tokens=8).invoke([*QUESTION, call, result])
    assert isinstance(answer, AIMessage)
    assert answer.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
