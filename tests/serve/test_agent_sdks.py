"""Agent SDKs' tool paths through a real server whose model's chat template takes no tools (the
generic format, serve/generic_tools.py): LangChain's bind_tools round trip and function-calling
structured output, instructor's default TOOLS mode, a pydantic-ai Agent with a tool, litellm with
tools. The tiny model calls nothing of its own accord, so calls are forced where the SDK lets
them be and turns are bounded; the tests check structure (a call of the right function whose
arguments validate; a final answer came back), never content."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.serve.test_tools import SCHEMAS, WEATHER
from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "tiny-generic"
QUESTION = "What is the weather in Paris?"


class Person(BaseModel):
    """A person."""

    model_config = ConfigDict(extra="forbid")  # no other keys: a random model's answer ends

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)
    color: Literal["red", "green", "blue"]


class GetWeather(BaseModel):
    """The weather in a city."""

    model_config = ConfigDict(extra="forbid")  # no other keys: a random model's answer ends

    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


class Add(BaseModel):
    """The sum of two small integers."""

    model_config = ConfigDict(extra="forbid")  # no other keys: a random model's answer ends

    a: int = Field(ge=-100, le=100)
    b: int = Field(ge=-100, le=100)


@pytest.fixture(scope="module")
def url(generic_server: Server) -> str:
    return generic_server.url + "/v1"


@pytest.fixture(scope="module")
def llm(url: str) -> ChatOpenAI:
    return ChatOpenAI(base_url=url, api_key="unused", model=MODEL, temperature=0, max_tokens=400,
                      max_retries=0)  # fmt: skip


def test_langchain_bind_tools_round_trip(llm: ChatOpenAI) -> None:
    question = [HumanMessage(QUESTION)]
    call = llm.bind_tools([GetWeather, Add], tool_choice="GetWeather").invoke(question)
    assert isinstance(call, AIMessage) and len(call.tool_calls) == 1
    assert call.tool_calls[0]["name"] == "GetWeather"
    GetWeather.model_validate(call.tool_calls[0]["args"])
    assert call.response_metadata["finish_reason"] == "tool_calls"
    result = ToolMessage('{"celsius": 21}', tool_call_id=call.tool_calls[0]["id"])
    answer = llm.bind_tools([GetWeather, Add]).bind(max_tokens=60).invoke([*question, call, result])
    assert isinstance(answer, AIMessage)
    assert answer.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    assert answer.tool_calls or isinstance(answer.content, str)
    for c in answer.tool_calls:
        {"GetWeather": GetWeather, "Add": Add}[c["name"]].model_validate(c["args"])


def test_langchain_structured_output_by_function_calling(llm: ChatOpenAI) -> None:
    structured = llm.with_structured_output(Person, method="function_calling")
    assert isinstance(structured.invoke("Describe someone."), Person)
    sampled = llm.bind(seed=3, temperature=1).with_structured_output(Person,
                                                                    method="function_calling")
    assert isinstance(sampled.invoke("Describe someone."), Person)


def test_instructor_tools_mode(url: str) -> None:
    import instructor

    client = instructor.from_openai(openai.OpenAI(base_url=url, api_key="unused", max_retries=0))
    assert client.mode == instructor.Mode.TOOLS
    person = client.chat.completions.create(
        model=MODEL, response_model=Person, max_retries=1, max_tokens=400, temperature=0,
        messages=[{"role": "user", "content": "Describe someone."}],
    )  # fmt: skip
    assert isinstance(person, Person)


def test_pydantic_ai_agent_with_a_tool(url: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=url, api_key="unused"))
    calls: list[dict[str, Any]] = []

    def get_weather(city: Annotated[str, Field(max_length=10)],
                    unit: Literal["celsius", "fahrenheit"]) -> str:  # fmt: skip
        """The weather in a city."""
        calls.append({"city": city, "unit": unit})
        return "21 degrees"

    # Structured output makes every turn a call (tool_choice required): the tool or the output
    agent = Agent(model, tools=[get_weather], output_type=Add, retries=0,
                  model_settings={"temperature": 0, "max_tokens": 400})  # fmt: skip
    result = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=4))
    assert isinstance(result.output, Add)
    for c in calls:
        GetWeather.model_validate(c)
    names = [p.tool_name for m in result.all_messages() for p in getattr(m, "parts", [])
             if type(p).__name__ == "ToolCallPart"]  # fmt: skip
    assert "final_result" in names and set(names) <= {"get_weather", "final_result"}


@pytest.fixture
def litellm(monkeypatch: pytest.MonkeyPatch) -> Any:
    """litellm, reading its model cost map from its own files (there is no network here)."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_with_tools(litellm: Any, url: str, stream: bool) -> None:
    fields = {"model": f"openai/{MODEL}", "api_base": url, "api_key": "unused",
              "messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER],
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
              "max_tokens": 400, "temperature": 0, "num_retries": 0}  # fmt: skip
    out = litellm.completion(**fields, stream=stream)
    if stream:
        out = litellm.stream_chunk_builder(list(out), messages=fields["messages"])
    calls = out.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS["get_weather"])
    assert out.choices[0].finish_reason == "tool_calls"
