"""OpenAI's response bodies for completions and chat completions, whole or as Server-Sent
Events chunks, with verispec's speculation statistics beside the usage; a chat answer's tool
calls parsed out of its text when the request has tools (by the parser of its format,
serve/tool_calls.py or serve/generic_tool_calls.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from verispec.serve.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Delta,
    DeltaFunction,
    DeltaToolCall,
    StepSpeculation,
    TokenLogprob,
    ToolCall,
    ToolCallFunction,
    TopLogprob,
    Usage,
)
from verispec.serve.tool_calls import CallParser, Parsed, ParsedCall
from verispec.types.outputs import RequestOutput, StreamDelta, TokenLogprobs
from verispec.types.sampling_params import SamplingParams
from verispec.types.stats import SpecStats

SSE_DONE = "data: [DONE]\n\n"
"""The event that ends a stream."""


def sse_event(payload: BaseModel) -> str:
    """One Server-Sent Event carrying `payload` as JSON."""
    return f"data: {payload.model_dump_json()}\n\n"


class Reply:
    """Builds one request's response bodies (whole or chunked) in the API's formats."""

    def __init__(
        self,
        model_name: str,
        tokenizer: Any,
        chat: bool,
        prompts: list[list[int]],
        params: list[SamplingParams],
        n: int,
        return_token_ids: bool,
        parse_tools: Callable[[], CallParser] | None = None,
    ) -> None:
        self.model_name, self.tokenizer = model_name, tokenizer
        self.chat, self.params, self.n = chat, params, n
        self.prompts = prompts
        self.return_token_ids = return_token_ids
        self.parse_tools = parse_tools
        self._parsers = [parse_tools() for _ in params] if parse_tools else []
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._offsets = [0] * len(params)  # completions' text_offset so far, per choice
        self._ids_sent = [False] * len(params)  # a stream's prompt ids went out, per choice

    def _ids(self, index: int, token_ids: list[int]) -> dict[str, list[int] | None]:
        """prompt_token_ids (once per choice) and token_ids, when the request asked for them."""
        if not self.return_token_ids:
            return {}
        prompt = None if self._ids_sent[index] else self.prompts[index]
        self._ids_sent[index] = True
        return {"prompt_token_ids": prompt, "token_ids": token_ids}

    def response(self, outputs: list[RequestOutput]) -> BaseModel:
        usage, spec = self._usage(outputs), _speculation(outputs)
        model = self.model_name
        if self.chat:
            choices = [
                ChatChoice(index=i, message=self._message(o.text), logprobs=self._chat_logprobs(
                           o.logprobs), finish_reason=self._finish(o.finish_reason, o.text),
                           **self._ids(i, o.token_ids))
                for i, o in enumerate(outputs)
            ]  # fmt: skip
            return ChatCompletionResponse(
                id=self.id, created=self.created, model=model, choices=choices, usage=usage,
                speculation=spec,
            )  # fmt: skip
        choices_c = [
            CompletionChoice(index=i, text=o.text, finish_reason=o.finish_reason,
                             logprobs=self._completion_logprobs(i, o.logprobs),
                             **self._ids(i, o.token_ids))
            for i, o in enumerate(outputs)
        ]  # fmt: skip
        return CompletionResponse(id=self.id, created=self.created, model=model,
                                  choices=choices_c, usage=usage, speculation=spec)  # fmt: skip

    def chunk(self, index: int, delta: StreamDelta) -> BaseModel:
        spec = StepSpeculation(
            num_tokens=len(delta.token_ids), num_accepted_tokens=delta.num_accepted,
            num_draft_tokens=delta.num_draft_tokens, accepted_text=delta.accepted_text,
        )  # fmt: skip
        ids = self._ids(index, delta.token_ids)
        if self.chat:
            message, reason = Delta(content=delta.text), delta.finish_reason
            if self.parse_tools:
                parser = self._parsers[index]
                parsed = parser.feed(delta.text, final=reason is not None)
                first = parser.num_calls - len(parsed.calls)
                calls = [DeltaToolCall(index=first + j, id=_call_id(), type="function",
                                       function=DeltaFunction(name=c.name, arguments=c.arguments))
                         for j, c in enumerate(parsed.calls)]  # fmt: skip
                message = Delta(content=parsed.content or (None if calls else ""),
                                tool_calls=calls or None)  # fmt: skip
                reason = "tool_calls" if reason == "stop" and parser.num_calls else reason
            return self.chat_chunk(index, message, reason, self._chat_logprobs(delta.logprobs),
                                   spec, ids)  # fmt: skip
        choice = CompletionChoice(
            index=index, text=delta.text, finish_reason=delta.finish_reason, speculation=spec,
            logprobs=self._completion_logprobs(index, delta.logprobs), **ids,
        )  # fmt: skip
        return CompletionResponse(id=self.id, created=self.created,
                                  model=self.model_name, choices=[choice])  # fmt: skip

    def chat_chunk(
        self,
        index: int,
        delta: Delta,
        finish_reason: Any = None,
        logprobs: ChatLogprobs | None = None,
        spec: StepSpeculation | None = None,
        ids: dict[str, list[int] | None] | None = None,
    ) -> ChatCompletionChunk:
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason,
                                 logprobs=logprobs, speculation=spec, **(ids or {}))  # fmt: skip
        return ChatCompletionChunk(id=self.id, created=self.created,
                                   model=self.model_name, choices=[choice])  # fmt: skip

    def _message(self, text: str) -> AssistantMessage:
        """A whole answer as the assistant's message: its tool calls parsed out, if asked."""
        parsed = self._parsed(text)
        if parsed is None:
            return AssistantMessage(content=text)
        if not parsed.calls:
            return AssistantMessage(content=parsed.content)
        return AssistantMessage(content=parsed.content or None,
                                tool_calls=[_tool_call(c) for c in parsed.calls])  # fmt: skip

    def _finish(self, reason: Any, text: str) -> Any:
        """tool_calls for an answer that stopped after calling tools, else the engine's reason."""
        parsed = self._parsed(text) if reason == "stop" else None
        if parsed is not None and parsed.calls:
            return "tool_calls"
        return reason

    def _parsed(self, text: str) -> Parsed | None:
        """A whole answer's content and calls, read by the request's parser (None: none)."""
        return None if self.parse_tools is None else self.parse_tools().feed(text, final=True)

    def usage_chunk(self, outputs: list[RequestOutput]) -> BaseModel:
        usage, spec = self._usage(outputs), _speculation(outputs)
        model = self.model_name
        if self.chat:
            return ChatCompletionChunk(id=self.id, created=self.created, model=model,
                                       choices=[], usage=usage, speculation=spec)  # fmt: skip
        return CompletionResponse(id=self.id, created=self.created, model=model, choices=[],
                                  usage=usage, speculation=spec)  # fmt: skip

    def _usage(self, outputs: list[RequestOutput]) -> Usage:
        """Prompt tokens counted once per prompt (not per choice), as OpenAI counts them."""
        prompt = sum(len(ids) for ids in self.prompts[:: self.n])
        completion = sum(len(o.token_ids) for o in outputs)
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)  # fmt: skip

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _chat_logprobs(self, logprobs: list[TokenLogprobs] | None) -> ChatLogprobs | None:
        if logprobs is None:
            return None

        def top(token_id: int, logprob: float) -> TopLogprob:
            text = self._token_text(token_id)
            return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

        content = [
            TokenLogprob(**top(t.token_id, t.logprob).model_dump(),
                         top_logprobs=[top(i, lp) for i, lp in t.top])
            for t in logprobs
        ]  # fmt: skip
        return ChatLogprobs(content=content)

    def _top_dict(self, top: list[tuple[int, float]]) -> dict[str, float]:
        """{token text: logprob} of the alternatives; two ids with the same text (byte
        pieces of one character) keep the likelier one's."""
        out: dict[str, float] = {}
        for token_id, logprob in top:
            out.setdefault(self._token_text(token_id), logprob)
        return out

    def _completion_logprobs(
        self, index: int, logprobs: list[TokenLogprobs] | None
    ) -> CompletionLogprobs | None:
        if logprobs is None:
            return None
        tokens = [self._token_text(t.token_id) for t in logprobs]
        offsets = []
        for text in tokens:
            offsets.append(self._offsets[index])
            self._offsets[index] += len(text)
        return CompletionLogprobs(
            tokens=tokens, token_logprobs=[t.logprob for t in logprobs],
            top_logprobs=[self._top_dict(t.top) for t in logprobs],
            text_offset=offsets,
        )  # fmt: skip


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _tool_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=_call_id(), function=ToolCallFunction(name=call.name,
                                                             arguments=call.arguments))


def _speculation(outputs: list[RequestOutput]) -> dict[str, Any]:
    """SpecStats of every choice, summed, as a dict."""
    total = SpecStats()
    for o in outputs:
        total.merge(o.metrics.spec)
    return total.to_dict()
