"""The OpenAI-compatible HTTP API on FastAPI: completions, chat completions (streamed with
Server-Sent Events or not), models, health, Prometheus metrics and the chat page at `/`.

Every error has OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 for a
bad field or body (never FastAPI's 422), 401 for a missing or wrong API key, 404 for an unknown
route; a failed engine step is a 500 for the requests it was serving only.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from verispec.api.chat import chat_prompt, require_chat_template
from verispec.api.outputs import RequestOutput, StreamDelta, TokenLogprobs
from verispec.api.sampling_params import SamplingParams
from verispec.api.stream import DeltaMaker
from verispec.engine.stats import SpecStats
from verispec.serve.async_engine import AsyncEngine, EngineError, RequestGroup
from verispec.serve.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Delta,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    StepSpeculation,
    TokenLogprob,
    TopLogprob,
    Usage,
)

DEFAULT_COMPLETION_TOKENS = 16
"""max_tokens of a completion that gives none (OpenAI's default)."""
DISCONNECT_POLL_S = 0.5
"""How often a non-streamed request checks that its client is still connected."""


class APIError(Exception):
    """An error answered in OpenAI's schema."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind,
        )  # fmt: skip

    def response(self) -> JSONResponse:
        info = ErrorInfo(message=self.message, type=self.kind, param=self.param, code=self.code)
        return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=self.status)


@dataclass(slots=True)
class ServerState:
    """What the routes share: the engine, the names the model answers to, the API key."""

    engine: AsyncEngine
    model_name: str
    api_key: str | None
    created: int

    @property
    def tokenizer(self) -> Any:
        return self.engine.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len


def create_app(engine: AsyncEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI application serving `engine` (started and stopped with the app)."""
    state = ServerState(engine, model_name, api_key, int(time.time()))
    app = FastAPI(title="verispec", description="OpenAI-compatible speculative decoding server",
                  version="0.1.0")  # fmt: skip
    app.state.verispec = state
    _add_error_handlers(app)

    def authorize(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), state.api_key.encode()
        ):
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key")  # fmt: skip

    guarded = [Depends(authorize)]

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("verispec.serve").joinpath("page.html").read_text())

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        m = state.engine.metrics
        body = m.exposition() if m is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> ModelList:
        card = ModelCard(id=state.model_name, created=state.created,
                         max_model_len=state.max_model_len)  # fmt: skip
        return ModelList(data=[card])

    @app.post("/v1/completions", dependencies=guarded, response_model=None)
    async def completions(body: CompletionRequest, raw: Request) -> Response | BaseModel:
        _check_model(state, body.model)
        if body.best_of is not None and body.best_of != body.n:
            raise APIError(400, f"best_of must equal n ({body.n}): choices are not re-ranked",
                           "best_of")  # fmt: skip
        prompts = _completion_prompts(state, body.prompt)
        return await _generate(state, body, raw, prompts, body.max_tokens, body.logprobs,
                               chat=False)  # fmt: skip

    @app.post("/v1/chat/completions", dependencies=guarded, response_model=None)
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response | BaseModel:
        _check_model(state, body.model)
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both",
                           "max_completion_tokens")  # fmt: skip
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        hf = state.tokenizer.hf
        try:
            require_chat_template(hf, state.model_name)
        except ValueError:
            raise APIError(400, f"model {state.model_name} has no chat template; send a plain "
                           "prompt to /v1/completions", "messages") from None  # fmt: skip
        try:
            text, ids = chat_prompt(hf, [m.as_dict() for m in body.messages], state.model_name,
                                    body.chat_template_kwargs)  # fmt: skip
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        num_top = (body.top_logprobs or 0) if body.logprobs else None
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await _generate(state, body, raw, [(ids, text)], max_tokens, num_top, chat=True)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return _validation_error(e.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 404:
            return APIError(404, "no such route; see /docs for the API", code="not_found"
                            ).response()  # fmt: skip
        if e.status_code == 405:
            return APIError(405, f"method not allowed: {e.detail}", code="method_not_allowed"
                            ).response()  # fmt: skip
        return APIError(e.status_code, str(e.detail)).response()

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"
                        ).response()  # fmt: skip


def _validation_error(errors: Sequence[Any]) -> APIError:
    """The first of pydantic's errors as a 400 naming the field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        ctx = first.get("ctx", {})
        return APIError(400, f"the body is not valid JSON: {ctx.get('error', first['msg'])}")
    if not loc:
        return APIError(400, f"the body must be a JSON object of the request's fields: "
                        f"{first['msg']}")  # fmt: skip
    # a union's member tags ('str', 'list[int]', 'StreamOptions') follow a field in loc
    path = [loc[0], *(x for x in loc[1:] if x.isdigit() or _is_field_name(x))]
    param = ".".join(path)
    if kind == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}: this server does not take it (its "
                        "fields: GET /docs)", param)  # fmt: skip
    if kind == "missing":
        return APIError(400, f"{param} is required", param)
    return APIError(400, f"{param}: {first['msg']}", param)


def _is_field_name(part: str) -> bool:
    """Whether a part of pydantic's error location names a field (not a union member's type).

    >>> [p for p in ("str", "list[int]", "StreamOptions", "usage") if _is_field_name(p)]
    ['usage']
    """
    return part.isidentifier() and part not in _TYPE_TAGS and not part[0].isupper()


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_FIELD_NAMES = frozenset(
    {*CompletionRequest.model_fields, *ChatCompletionRequest.model_fields, "role", "content",
     "include_usage", "type", "text", "name"}
)  # fmt: skip


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        message = (f"model {model!r} is not served here; this server serves "
                   f"{state.model_name!r} (GET /v1/models)")  # fmt: skip
        raise APIError(400, message, "model", "model_not_found")


def _completion_prompts(state: ServerState, prompt: Any) -> list[tuple[list[int], str | None]]:
    """(token ids, text) of each prompt of a completions request."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty; give text, texts, token ids or lists of them",
                       "prompt")  # fmt: skip
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    out = []
    for p in prompt:
        if isinstance(p, str):
            out.append((state.tokenizer.encode(p), p))
        else:
            out.append((list(p), None))
    return out


async def _generate(
    state: ServerState,
    body: CompletionRequest | ChatCompletionRequest,
    raw: Request,
    prompts: list[tuple[list[int], str | None]],
    max_tokens: int | None,
    num_logprobs: int | None,
    chat: bool,
) -> Response | BaseModel:
    """Submit every prompt's n choices, then stream them or answer once all are done."""
    params = [
        _choice_params(state, body, len(ids), max_tokens, num_logprobs, j)
        for ids, _ in prompts
        for j in range(body.n)
    ]
    choices = [p for p in prompts for _ in range(body.n)]
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options needs stream: true", "stream_options")
    try:
        group = await state.engine.submit(choices, params)
    except ValueError as e:
        raise APIError(400, str(e), "messages" if chat else "prompt") from None
    reply = _Reply(state, chat, [ids for ids, _ in choices], params, body.n,
                   body.return_token_ids)  # fmt: skip
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_sse(state, group, reply, usage),
                                 media_type="text/event-stream")  # fmt: skip
    outputs = await _collect(state, group, raw)
    return reply.response(outputs)


def _choice_params(
    state: ServerState,
    body: CompletionRequest | ChatCompletionRequest,
    num_prompt_tokens: int,
    max_tokens: int | None,
    num_logprobs: int | None,
    index: int,
) -> SamplingParams:
    """One choice's SamplingParams: its seed is seed + index, so n choices differ and each is
    reproducible; max_tokens must fit the context (vLLM's rule), an unset one is capped."""
    room = state.max_model_len - num_prompt_tokens
    if room < 1:
        raise APIError(400, f"the prompt has {num_prompt_tokens} tokens but this model's "
                       f"context is {state.max_model_len} tokens; shorten it",
                       "messages" if isinstance(body, ChatCompletionRequest) else "prompt",
                       "context_length_exceeded")  # fmt: skip
    if max_tokens is None:
        default = room if isinstance(body, ChatCompletionRequest) else DEFAULT_COMPLETION_TOKENS
        max_tokens = min(default, room)
    elif max_tokens > room:
        raise APIError(400, f"this model's context is {state.max_model_len} tokens, but "
                       f"{num_prompt_tokens} prompt tokens + max_tokens {max_tokens} = "
                       f"{num_prompt_tokens + max_tokens}; lower max_tokens to at most {room}",
                       "max_tokens", "context_length_exceeded")  # fmt: skip
    seed = None if body.seed is None else body.seed + index
    try:
        return body.sampling_params(max_tokens, num_logprobs, seed)
    except ValueError as e:
        field = str(e).split(" ", 1)[0]
        raise APIError(400, str(e), field if field in _FIELD_NAMES else None) from None


async def _collect(state: ServerState, group: RequestGroup, raw: Request) -> list[RequestOutput]:
    """Wait for every choice's output; abort the group if the client goes away."""
    outputs: dict[int, RequestOutput] = {}
    stream = aiter(group)
    next_item = asyncio.ensure_future(anext(stream))
    try:
        while True:
            done, _ = await asyncio.wait({next_item}, timeout=DISCONNECT_POLL_S)
            if not done:
                if await raw.is_disconnected():
                    break
                continue
            try:
                index, news = next_item.result()
            except StopAsyncIteration:
                break
            except EngineError as e:
                raise APIError(500, str(e), kind="server_error") from None
            if news.output is not None:
                outputs[index] = news.output
            next_item = asyncio.ensure_future(anext(stream))
    finally:
        next_item.cancel()
        if not group.done:
            state.engine.abort(group)
    if len(outputs) < len(group.requests):  # nobody is left to read this
        raise APIError(400, "the client disconnected before the answer was complete")
    return [outputs[i] for i in range(len(outputs))]


async def _sse(
    state: ServerState, group: RequestGroup, reply: _Reply, include_usage: bool
) -> AsyncIterator[str]:
    """Server-Sent Events: one chunk per engine step per choice, then usage, then [DONE]. A
    client that disconnects cancels this generator; its requests are aborted."""
    deltas = [DeltaMaker(state.tokenizer, p.stop) for p in reply.params]
    outputs: dict[int, RequestOutput] = {}
    try:
        if reply.chat:
            for i in range(len(reply.params)):
                yield _event(reply.chat_chunk(i, Delta(role="assistant", content="")))
        async for index, news in group:
            delta = deltas[index].delta(news)
            if delta.output is not None:
                outputs[index] = delta.output
            yield _event(reply.chunk(index, delta))
        if include_usage:
            yield _event(reply.usage_chunk([outputs[i] for i in range(len(outputs))]))
        yield "data: [DONE]\n\n"
    except EngineError as e:
        error = ErrorInfo(message=str(e), type="server_error")
        yield _event(ErrorResponse(error=error))
    finally:
        if not group.done:
            state.engine.abort(group)


def _event(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


class _Reply:
    """Builds one request's response bodies (whole or chunked) in the API's formats."""

    def __init__(
        self,
        state: ServerState,
        chat: bool,
        prompts: list[list[int]],
        params: list[SamplingParams],
        n: int,
        return_token_ids: bool,
    ) -> None:
        self.state, self.chat, self.params, self.n = state, chat, params, n
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
        model = self.state.model_name
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
                                  model=self.state.model_name, choices=[choice])  # fmt: skip

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
                                   model=self.state.model_name, choices=[choice])  # fmt: skip

    def usage_chunk(self, outputs: list[RequestOutput]) -> BaseModel:
        usage, spec = self._usage(outputs), _speculation(outputs)
        model = self.state.model_name
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
        return self.state.tokenizer.decode([token_id])

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

