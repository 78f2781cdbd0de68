"""OpenAI's response bodies for completions and chat completions, whole or as Server-Sent
Events chunks, with verispec's speculation statistics beside the usage."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel

from verispec.api.outputs import RequestOutput, StreamDelta, TokenLogprobs
from verispec.api.sampling_params import SamplingParams
from verispec.engine.stats import SpecStats
from verispec.serve.protocol import (
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
    StepSpeculation,
    TokenLogprob,
    TopLogprob,
    Usage,
)

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
    ) -> None:
        self.model_name, self.tokenizer = model_name, tokenizer
        self.chat, self.params, self.n = chat, params, n
        self.prompts = prompts
        self.return_token_ids = return_token_ids
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
                ChatChoice(index=i, message=AssistantMessage(content=o.text),
                           logprobs=self._chat_logprobs(o.logprobs), finish_reason=o.finish_reason,
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
            return self.chat_chunk(index, Delta(content=delta.text), delta.finish_reason,
                                   self._chat_logprobs(delta.logprobs), spec, ids)  # fmt: skip
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


def _speculation(outputs: list[RequestOutput]) -> dict[str, Any]:
    """SpecStats of every choice, summed, as a dict."""
    total = SpecStats()
    for o in outputs:
        total.merge(o.metrics.spec)
    return total.to_dict()
