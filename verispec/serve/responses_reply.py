"""The Responses API's answer (POST /v1/responses): the response object, whole or built up by the
stream of events OpenAI's SDKs read (response.created, ..., response.completed). One builder
makes both, fed the answer's text whole or step by step, its tool calls parsed out by
serve/tool_calls.py's parser, so a stream ends with the response the whole answer gives. Output
items come in one order: the assistant's message (its text outside tool calls) first, then one
function_call item per call; a call is sent whole once the answer has ended, as the calls
only count then."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from pydantic import BaseModel

from verispec.api.stream import DeltaMaker
from verispec.serve.async_engine import AsyncEngine, EngineError, RequestGroup
from verispec.serve.responses_request import ResponsesRequest, function_tools
from verispec.serve.tool_calls import CallParser, ParsedCall
from verispec.types.outputs import RequestOutput

ItemStatus = Literal["in_progress", "completed", "incomplete"]
Status = Literal["in_progress", "completed", "incomplete", "failed"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    """JSON text."""
    status: ItemStatus = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    """Not counted: 0."""
    cache_write_tokens: int = 0
    """Not counted: 0."""


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0
    """No separate reasoning: 0."""


class ResponsesUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseFailure(BaseModel):
    code: Literal["server_error"] = "server_error"
    message: str


class ResponseObject(BaseModel):
    """A response, with the request's settings echoed as OpenAI's SDKs expect them, and
    verispec's `speculation` beside the usage."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    completed_at: int | None = None
    error: ResponseFailure | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputMessage | OutputFunctionCall]
    usage: ResponsesUsage | None = None
    speculation: dict[str, Any] | None = None
    instructions: str | None
    metadata: dict[str, str]
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool
    text: dict[str, Any]
    reasoning: dict[str, Any] | None
    truncation: Literal["disabled"] = "disabled"
    user: str | None
    previous_response_id: None = None
    background: bool = False


def _echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a response repeats them (OpenAI's defaults where unset)."""
    form = body.text.format if body.text is not None else None
    return {
        "instructions": body.instructions, "metadata": body.metadata or {},
        "max_output_tokens": body.max_output_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "tools": [t.model_dump(by_alias=True) for t in function_tools(body.tools)],
        "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "text": {"format": {"type": "text"} if form is None else form.model_dump(by_alias=True)},
        "reasoning": None if body.reasoning is None else body.reasoning.model_dump(),
        "user": body.user,
    }  # fmt: skip


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesReply:
    """Builds one request's response and its stream events from the answer's text."""

    def __init__(
        self, model_name: str, body: ResponsesRequest, num_prompt_tokens: int,
        parse_tools: Callable[[], CallParser] | None,
    ) -> None:  # fmt: skip
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self._model_name = model_name
        self._echo = _echo(body)
        self._num_prompt_tokens = num_prompt_tokens
        self._parser = parse_tools() if parse_tools is not None else None
        self._message: OutputMessage | None = None
        self._calls: list[ParsedCall] = []
        self._output: list[OutputMessage | OutputFunctionCall] = []
        self._sequence = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """One event, numbered in the stream's order."""
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _object(
        self, status: Status, output: RequestOutput | None = None, **extra: Any
    ) -> ResponseObject:
        """The response as it stands: in progress, or final with the output's usage."""
        if output is not None:
            n = len(output.token_ids)
            extra["usage"] = ResponsesUsage(input_tokens=self._num_prompt_tokens, output_tokens=n,
                                            total_tokens=self._num_prompt_tokens + n)
            extra["speculation"] = output.metrics.spec.to_dict()
            extra["completed_at"] = int(time.time())
        return ResponseObject(id=self.id, created_at=self.created_at, status=status,
                              model=self._model_name, output=list(self._output),
                              **self._echo, **extra)  # fmt: skip

    def start(self) -> list[dict[str, Any]]:
        """The events that open a stream."""
        snapshot = self._object("in_progress").model_dump()
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]  # fmt: skip

    def feed(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """The events of the answer's next piece of text: its content as text deltas (the
        message opened at the first), its tool calls kept for the end."""
        if self._parser is not None:
            parsed = self._parser.feed(text, final)
            self._calls += parsed.calls
            text = parsed.content
        if not text:
            return []
        message, events = self._open_message()
        message.content[0].text += text
        events.append(self._event("response.output_text.delta", item_id=message.id,
                                  output_index=0, content_index=0, delta=text, logprobs=[]))
        return events

    def _open_message(self) -> tuple[OutputMessage, list[dict[str, Any]]]:
        """The message item, and its opening events if it opens now (the first item)."""
        if self._message is not None:
            return self._message, []
        message = self._message = OutputMessage(id=_new_id("msg"))
        self._output.append(message)
        part = OutputText()
        events = [self._event("response.output_item.added", output_index=0,
                              item=message.model_dump()),
                  self._event("response.content_part.added", item_id=message.id,
                              output_index=0, content_index=0, part=part.model_dump())]
        message.content.append(part)
        return message, events  # fmt: skip

    def finish(self, output: RequestOutput) -> list[dict[str, Any]]:
        """The closing events: the message's (there is one whenever no call was made), each
        call's, then the whole response, completed or (cut at max tokens) incomplete."""
        return self._close(output)[0]

    def _close(self, output: RequestOutput) -> tuple[list[dict[str, Any]], ResponseObject]:
        """The closing events and the whole response."""
        incomplete = output.finish_reason == "length"
        events = [] if self._calls else self._open_message()[1]
        if self._message is not None:
            message, part = self._message, self._message.content[0]
            message.status = "incomplete" if incomplete else "completed"
            events += [
                self._event("response.output_text.done", item_id=message.id, output_index=0,
                            content_index=0, text=part.text, logprobs=[]),
                self._event("response.content_part.done", item_id=message.id, output_index=0,
                            content_index=0, part=part.model_dump()),
                self._event("response.output_item.done", output_index=0,
                            item=message.model_dump()),
            ]  # fmt: skip
        for call in self._calls:
            events += self._call_events(call)
        if incomplete:
            final = self._object("incomplete", output, incomplete_details=IncompleteDetails())
        else:
            final = self._object("completed", output)
        kind = "response.incomplete" if incomplete else "response.completed"
        return [*events, self._event(kind, response=final.model_dump())], final

    def _call_events(self, call: ParsedCall) -> list[dict[str, Any]]:
        """A function_call item's events: added, its arguments in one delta, done."""
        item = OutputFunctionCall(id=_new_id("fc"), call_id=f"call_{uuid.uuid4().hex[:24]}",
                                  name=call.name, arguments="", status="in_progress")  # fmt: skip
        index = len(self._output)
        added = self._event("response.output_item.added", output_index=index,
                            item=item.model_dump())  # fmt: skip
        item.arguments, item.status = call.arguments, "completed"
        self._output.append(item)
        return [added,
                self._event("response.function_call_arguments.delta", item_id=item.id,
                            output_index=index, delta=call.arguments),
                self._event("response.function_call_arguments.done", item_id=item.id,
                            output_index=index, name=call.name, arguments=call.arguments),
                self._event("response.output_item.done", output_index=index,
                            item=item.model_dump())]  # fmt: skip

    def response(self, output: RequestOutput) -> ResponseObject:
        """The whole response of a finished answer."""
        self.feed(output.text, final=True)
        return self._close(output)[1]

    def failed(self, message: str) -> dict[str, Any]:
        """The event that ends a stream whose engine step failed."""
        final = self._object("failed", error=ResponseFailure(message=message))
        return self._event("response.failed", response=final.model_dump())


def sse(event: dict[str, Any]) -> str:
    """One Server-Sent Event, named by its type as OpenAI's are."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def response_events(
    engine: AsyncEngine, group: RequestGroup, reply: ResponsesReply, deltas: DeltaMaker
) -> AsyncIterator[str]:
    """The stream of one answer's events; a client that disconnects cancels it and its request
    is aborted."""
    try:
        for event in reply.start():
            yield sse(event)
        async for _, news in group:
            delta = deltas.delta(news)
            for event in reply.feed(delta.text, final=delta.output is not None):
                yield sse(event)
            if delta.output is not None:
                for event in reply.finish(delta.output):
                    yield sse(event)
    except EngineError as e:
        yield sse(reply.failed(str(e)))
    finally:
        if not group.done:
            engine.abort(group)
