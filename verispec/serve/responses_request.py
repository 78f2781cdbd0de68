"""OpenAI's Responses API request (POST /v1/responses) and its translation into the chat request
that /v1/chat/completions serves, so that templates, limits, structured output, tool calls and
speculation behave exactly as there. Input items, content parts and tools are checked one by
one, so a kind this server does not take (images, files, built-in tools) is a 400 naming it;
the 400s the chat path raises are renamed to the Responses fields they come from."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator

from verispec.serve.errors import APIError, validation_error
from verispec.serve.prompts import check_text
from verispec.serve.protocol import (
    FUNCTION_NAME,
    ChatCompletionRequest,
    JsonArguments,
    _Strict,
)

M = TypeVar("M", bound=BaseModel)

ITEM_TYPES = ("message", "function_call", "function_call_output")
"""The input item types this server takes (a message may leave out its type)."""
TEXT_PARTS = ("input_text", "output_text")
"""The content part types this server takes: text only."""
IGNORED_INCLUDES = ("reasoning.encrypted_content", "web_search_call.action.sources",
                    "web_search_call.results", "file_search_call.results",
                    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
                    "message.input_image.image_url")  # fmt: skip
"""`include` values accepted and without effect: they name what this server never produces."""


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    """The JSON schema; none means any JSON value."""
    description: str | None = None
    strict: bool | None = None
    """Accepted; the schema is always enforced."""


class TextConfig(_Strict):
    format: (
        Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema,
                  Field(discriminator="type")]
        | None
    ) = None  # fmt: skip
    """The answer's format: text (no constraint), json_object or json_schema."""


class ReasoningOptions(_Strict):
    """Accepted and without effect: the model gives no separate reasoning."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool = True
    """Accepted; events carry no obfuscation padding."""


class ResponsesRequest(_Strict):
    """POST /v1/responses. Input items and tools are checked by `chat_request`, one by one."""

    model: str | None = None
    """The served model's name (GET /v1/models); optional: there is one model."""
    input: str | list[dict[str, Any]]
    """A user message's text, or a list of items: messages, function_call and
    function_call_output."""
    instructions: str | None = None
    """A system message put before the input."""
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    """Default: the rest of the context."""
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    """Function tools, `{"type": "function", "name", "description", "parameters", "strict"}`."""
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    """Default auto with tools, none without; `{"type": "function", "name": ...}` forces it."""
    parallel_tool_calls: bool | None = None
    """false: at most one call per answer."""
    text: TextConfig | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = None
    """Accepted; nothing is stored."""
    previous_response_id: str | None = None
    """Refused when given: this server stores no responses; send the whole conversation."""
    metadata: dict[str, str] | None = None
    """Echoed in the response; not used."""
    user: str | None = None
    """An end-user id; accepted and not used."""
    safety_identifier: str | None = None
    """The newer name of user; accepted and not used."""
    prompt_cache_key: str | None = None
    """Accepted; the prefix cache needs no key."""
    reasoning: ReasoningOptions | None = None
    include: list[str] | None = None
    """Accepted: values naming outputs this server never produces."""
    truncation: Literal["disabled"] | None = None
    """Only disabled: a prompt too long for the context is a 400, never cut."""
    speculative: bool = True
    """verispec's extension: false decodes this request without drafts."""

    @field_validator("include")
    @classmethod
    def _includable(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if name not in IGNORED_INCLUDES:
                raise ValueError(f"{name!r} cannot be included: this server includes nothing "
                                 "extra (logprobs are not supported here)")  # fmt: skip
        return value


class InputTextPart(_Strict):
    """A content part of an input message or a tool output: text only."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    """Of an earlier answer's output_text; ignored."""
    logprobs: list[Any] | None = None
    """Of an earlier answer's output_text; ignored."""


class InputMessage(_Strict):
    """A message item (its content is read by `_text`)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class InputFunctionCall(_Strict):
    """An earlier answer's function call."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: JsonArguments
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class InputFunctionOutput(_Strict):
    """A function call's result (its output is read by `_text`)."""

    type: Literal["function_call_output"]
    call_id: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema; none means no arguments."""
    strict: bool | None = None
    """Accepted; a required or named call always follows the schema."""


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that answers `body` as /v1/chat/completions would (a 400 naming the
    Responses field for what this server does not take)."""
    if body.previous_response_id is not None:
        raise APIError(400, "previous_response_id is not supported: this server stores no "
                       "responses; send the whole conversation in input",
                       "previous_response_id")  # fmt: skip
    check_text(body)
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += input_messages(body.input)
    fields = {
        "model": body.model, "messages": messages, "temperature": body.temperature,
        "top_p": body.top_p, "max_completion_tokens": body.max_output_tokens,
        "stream": body.stream, "user": body.user, "speculative": body.speculative,
        "parallel_tool_calls": body.parallel_tool_calls,
        "tools": [{"type": "function", "function": f.model_dump(exclude={"type"}, by_alias=True)}
                  for f in function_tools(body.tools)] or None,
        "tool_choice": _tool_choice(body.tool_choice), "response_format": _response_format(body),
    }  # fmt: skip
    return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: a function call joins the assistant message before it (or
    starts one), a function call's output is a tool message.

    >>> input_messages([{"role": "user", "content": "Hi"},
    ...                 {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ...                 {"type": "function_call_output", "call_id": "c", "output": "1"}])[1:]
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'role': 'assistant', 'content': None, 'tool_calls': [{'id': 'c', 'type': 'function',
      'function': {'name': 'f', 'arguments': '{}'}}]},
     {'role': 'tool', 'tool_call_id': 'c', 'content': '1'}]
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not value:
        raise APIError(400, "input is empty; give text or a list of items", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        at = ("input", i)
        kind = item.get("type", "message")
        if kind not in ITEM_TYPES:
            raise APIError(400, f"input.{i}: items of type {kind!r} are not supported; this "
                           f"server takes {', '.join(ITEM_TYPES)} items", f"input.{i}.type")
        text_field = {"message": "content", "function_call_output": "output"}.get(kind)
        rest = {k: v for k, v in item.items() if k != text_field}  # read by _text
        if kind == "message":
            message = _validated(InputMessage, rest, at)
            content = _text(item.get("content"), (*at, "content"))
            messages.append({"role": message.role, "content": content})
        elif kind == "function_call":
            call = _validated(InputFunctionCall, item, at)
            last = messages[-1] if messages else {}
            if last.get("role") != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append({"id": call.call_id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}})  # fmt: skip
        else:
            result = _validated(InputFunctionOutput, rest, at)
            output = _text(item.get("output"), (*at, "output"))
            messages.append({"role": "tool", "tool_call_id": result.call_id, "content": output})
    return messages


def _text(value: Any, at: tuple[str | int, ...]) -> str:
    """A message's content or a tool's output: a string, or text parts joined."""
    param = ".".join(map(str, at))
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(400, f"{param} must be a string or a list of input_text parts", param)
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in TEXT_PARTS:
            raise APIError(400, f"{param}.{j}: content parts of type {kind!r} are not supported; "
                           f"this server takes {' and '.join(TEXT_PARTS)} parts (text only)",
                           f"{param}.{j}.type")  # fmt: skip
        texts.append(_validated(InputTextPart, part, (*at, j)).text)
    return "".join(texts)


def function_tools(tools: list[dict[str, Any]] | None) -> list[FunctionTool]:
    """The request's tools, each a function tool (a 400 naming any other kind)."""
    out = []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind != "function":
            raise APIError(400, f"tools.{i}: tools of type {kind!r} are not supported; this "
                           "server takes function tools only", f"tools.{i}.type")  # fmt: skip
        out.append(_validated(FunctionTool, tool, ("tools", i)))
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    """tool_choice in the chat request's form."""
    if choice is None or isinstance(choice, str):
        return choice
    named = choice.get("type") == "function" and set(choice) == {"type", "name"}
    if not named or not isinstance(choice["name"], str):
        raise APIError(400, f"tool_choice {json.dumps(choice)[:200]} is not supported; give "
                       '"none", "auto", "required" or {"type": "function", "name": ...}',
                       "tool_choice")  # fmt: skip
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    """text.format as the chat request's response_format."""
    form = body.text.format if body.text is not None else None
    if form is None or form.type != "json_schema":
        return None if form is None else {"type": form.type}
    schema = form.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)
    return {"type": "json_schema", "json_schema": schema}


def _validated(model: type[M], value: Any, at: tuple[str | int, ...]) -> M:
    """`value` as `model`, else the 400 of its first error, its location prefixed by `at`."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        errors = [{**err, "loc": (*at, *err["loc"])} for err in e.errors()]
        raise validation_error(errors) from None


def responses_param(param: str | None) -> str | None:
    """The Responses field a chat request's field comes from.

    >>> [responses_param(p) for p in ("messages.2.content", "tools.1.function.parameters",
    ...                               "response_format", "temperature")]
    ['input', 'tools.1.parameters', 'text.format', 'temperature']
    """
    if param is None:
        return None
    if param.split(".")[0] == "messages":
        return "input"
    if param == "response_format":
        return "text.format"
    return param.replace(".function.", ".")


@contextmanager
def responses_errors() -> Iterator[None]:
    """The chat path's 400s, renamed to the Responses fields they come from."""
    try:
        yield
    except APIError as e:
        e.param = responses_param(e.param)
        e.message = e.message.replace("response_format", "text.format")
        raise
