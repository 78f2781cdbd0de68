"""The OpenAI-compatible HTTP API on FastAPI: the app and its routes (completions, chat
completions streamed with Server-Sent Events or not, models, health, Prometheus metrics, the
chat page at `/` and the API's page at `/docs`). Errors are answered in OpenAI's shape
(serve/errors.py); the response bodies are built by serve/openai_format.py (and by
serve/responses_reply.py for /v1/responses, whose request is answered as the chat completion it
translates into: serve/responses_request.py). A failed engine step
is a 500 for the requests it was serving only. Prompts are checked, templated and tokenized in a
worker thread, so that a large body does not hold up the event loop (and every other client)
while it is tokenized; a request's own chat template renders in a worker process
(serve/template_workers.py). The layers around the routes (API key, body limits, HEAD, CORS)
are serve/middleware.py's. /tokenize and /detokenize are serve/tokenization.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import BaseModel

from verispec.api.stream import DeltaMaker
from verispec.serve import tokenization
from verispec.serve.async_engine import AsyncEngine, EngineError, RequestGroup
from verispec.serve.errors import FIELD_NAMES, APIError, add_error_handlers
from verispec.serve.limits import ServerLimits
from verispec.serve.middleware import add_layers
from verispec.serve.openai_format import SSE_DONE, Reply, sse_event
from verispec.serve.prompts import chat_prompt, completion_prompts, disconnected, too_long
from verispec.serve.protocol import ChatCompletionRequest, CompletionRequest
from verispec.serve.responses import Delta, ErrorInfo, ErrorResponse, ModelCard, ModelList
from verispec.serve.responses_reply import ResponsesReply, response_events
from verispec.serve.responses_request import ResponsesRequest, chat_request, responses_errors
from verispec.serve.state import ServerState
from verispec.serve.structured import requested_constraint
from verispec.serve.template_workers import TemplateWorkers
from verispec.serve.tokenization import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from verispec.serve.tools import OutputPlan
from verispec.types.chat import require_chat_template
from verispec.types.outputs import RequestOutput
from verispec.types.sampling_params import SamplingParams

DEFAULT_COMPLETION_TOKENS = 16
"""max_tokens of a completion that gives none (OpenAI's default)."""


def create_app(
    engine: AsyncEngine,
    model_name: str,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    allowed_origins: Sequence[str] = (),
) -> FastAPI:
    """The FastAPI application serving `engine` (started and stopped with the app, as are the
    template workers when the limits trust requests' own templates). A path with a trailing
    slash is served as the path without it (no redirect); browsers on `allowed_origins` may call
    it (CORS; "*": any origin)."""
    limits = limits or ServerLimits()
    templates = None
    if limits.trust_request_chat_template:
        templates = TemplateWorkers(limits.template_workers, limits.template_timeout_s,
                                    limits.template_memory_bytes)  # fmt: skip
    state = ServerState(engine, model_name, int(time.time()), limits, templates)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if templates is not None:
            await templates.start()
        try:
            yield
        finally:
            if templates is not None:
                await templates.stop()

    app = FastAPI(title="verispec", description="OpenAI-compatible speculative decoding server",
                  version="0.1.0", redirect_slashes=False, docs_url=None, redoc_url=None,
                  lifespan=lifespan)  # fmt: skip
    app.state.verispec = state
    add_error_handlers(app)
    add_layers(app, api_key, limits, allowed_origins)

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("verispec.serve").joinpath("page.html").read_text())

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(resources.files("verispec.serve").joinpath("docs.html").read_text())

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        m = state.engine.metrics
        body = m.exposition() if m is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[_card(state)])

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        if model_id != state.model_name:
            raise APIError(404, f"model {model_id!r} is not served here; this server serves "
                           f"{state.model_name!r} (GET /v1/models)", "model",
                           "model_not_found")  # fmt: skip
        return _card(state)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, raw: Request) -> TokenizeResponse:
        _check_model(state, body.model)
        return await tokenization.tokenize(state, body, raw)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        _check_model(state, body.model)
        return await tokenization.detokenize(state, body)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, raw: Request) -> Response | BaseModel:
        _check_request(state, body, _num_prompts(body.prompt))
        if body.best_of is not None and body.best_of != body.n:
            raise APIError(400, f"best_of must equal n ({body.n}): choices are not re-ranked",
                           "best_of")  # fmt: skip
        prompts = await asyncio.to_thread(completion_prompts, state, body)
        plan = OutputPlan(await asyncio.to_thread(requested_constraint, body))
        return await _generate(state, body, raw, prompts, body.max_tokens, "max_tokens",
                               body.logprobs, chat=False, plan=plan)  # fmt: skip

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response | BaseModel:
        _check_request(state, body, 1)
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both",
                           "max_completion_tokens")  # fmt: skip
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        _check_chat_template(state)
        text, ids, plan = await chat_prompt(state, body, raw)
        num_top = (body.top_logprobs or 0) if body.logprobs else None
        if body.max_completion_tokens is not None:
            max_tokens, field = body.max_completion_tokens, "max_completion_tokens"
        else:
            max_tokens, field = body.max_tokens, "max_tokens"
        return await _generate(state, body, raw, [(ids, text)], max_tokens, field, num_top,
                               chat=True, plan=plan)  # fmt: skip

    @app.post("/v1/responses", response_model=None)
    async def responses(body: ResponsesRequest, raw: Request) -> Response | BaseModel:
        with responses_errors():  # the chat path's 400s name the Responses fields
            chat = chat_request(body)
            _check_request(state, chat, 1)
            _check_chat_template(state)
            text, ids, plan = await chat_prompt(state, chat, raw)
            params = plan.apply(_choice_params(state, chat, len(ids), chat.max_completion_tokens,
                                               "max_output_tokens", None, 0))  # fmt: skip
            try:
                group = await state.engine.submit([(ids, text)], [params])
            except ValueError as e:
                raise APIError(400, str(e), "input") from None
        reply = ResponsesReply(state.model_name, body, len(ids), plan.parse_tools)
        if body.stream:
            events = response_events(state.engine, group, reply,
                                     DeltaMaker(state.tokenizer, params.stop))  # fmt: skip
            return StreamingResponse(events, media_type="text/event-stream")
        return reply.response((await _collect(state, group, raw))[0])

    return app


def _check_chat_template(state: ServerState) -> None:
    """A 400 unless the model has a chat template."""
    try:
        require_chat_template(state.tokenizer.hf, state.model_name)
    except ValueError:
        raise APIError(400, f"model {state.model_name} has no chat template; send a plain "
                       "prompt to /v1/completions", "messages") from None  # fmt: skip


def _check_request(
    state: ServerState, body: CompletionRequest | ChatCompletionRequest, num_prompts: int
) -> None:
    """The checks that need no tokenizing: model, unsupported values, the sequence cap."""
    _check_model(state, body.model)
    if body.logit_bias:
        raise APIError(400, "logit_bias is not supported: this server does not bias tokens; "
                       "send {} or null, or leave it out", "logit_bias")  # fmt: skip
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options needs stream: true", "stream_options")
    cap = state.limits.max_sequences_per_request
    if num_prompts * body.n > cap:
        param = "n" if body.n > 1 else "prompt"
        raise APIError(400, f"this request asks for {num_prompts} prompt(s) x n {body.n} = "
                       f"{num_prompts * body.n} sequences; this server takes at most {cap} per "
                       "request (verispec serve --max-sequences-per-request); split it",
                       param)  # fmt: skip


def _card(state: ServerState) -> ModelCard:
    return ModelCard(id=state.model_name, created=state.created,
                     max_model_len=state.max_model_len)  # fmt: skip


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        message = (f"model {model!r} is not served here; this server serves "
                   f"{state.model_name!r} (GET /v1/models)")  # fmt: skip
        raise APIError(400, message, "model", "model_not_found")


def _num_prompts(prompt: Any) -> int:
    """How many prompts a completions request's prompt field holds (before tokenizing; its
    lists are of one kind, so the first item tells)."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


async def _generate(
    state: ServerState,
    body: CompletionRequest | ChatCompletionRequest,
    raw: Request,
    prompts: list[tuple[list[int], str | None]],
    max_tokens: int | None,
    max_tokens_field: str,
    num_logprobs: int | None,
    chat: bool,
    plan: OutputPlan,
) -> Response | BaseModel:
    """Submit every prompt's n choices, then stream them or answer once all are done."""
    params = [
        plan.apply(_choice_params(state, body, len(ids), max_tokens, max_tokens_field,
                                  num_logprobs, j))
        for ids, _ in prompts
        for j in range(body.n)
    ]
    choices = [p for p in prompts for _ in range(body.n)]
    try:
        group = await state.engine.submit(choices, params)
    except ValueError as e:
        raise APIError(400, str(e), "messages" if chat else "prompt") from None
    reply = Reply(state.model_name, state.tokenizer, chat, [ids for ids, _ in choices], params,
                  body.n, body.return_token_ids, plan.parse_tools)  # fmt: skip
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
    max_tokens_field: str,
    num_logprobs: int | None,
    index: int,
) -> SamplingParams:
    """One choice's SamplingParams: its seed is seed + index, so n choices differ and each is
    reproducible; max_tokens (named as the request named it) must fit the context (vLLM's
    rule), an unset one is capped."""
    room = state.max_model_len - num_prompt_tokens
    if room < 1:
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise too_long(state, num_prompt_tokens, param)
    if max_tokens is None:
        default = room if isinstance(body, ChatCompletionRequest) else DEFAULT_COMPLETION_TOKENS
        max_tokens = min(default, room)
    elif max_tokens > room:
        raise APIError(400, f"this model's context is {state.max_model_len} tokens, but "
                       f"{num_prompt_tokens} prompt tokens + {max_tokens_field} {max_tokens} = "
                       f"{num_prompt_tokens + max_tokens}; lower {max_tokens_field} to at most "
                       f"{room}", max_tokens_field, "context_length_exceeded")  # fmt: skip
    seed = None if body.seed is None else body.seed + index
    try:
        return body.sampling_params(max_tokens, num_logprobs, seed)
    except ValueError as e:
        field = str(e).split(" ", 1)[0]
        raise APIError(400, str(e), field if field in FIELD_NAMES else None) from None


async def _collect(state: ServerState, group: RequestGroup, raw: Request) -> list[RequestOutput]:
    """Wait for every choice's output; abort the group as soon as the client goes away (a
    watcher awaits the disconnect while tokens flow)."""
    outputs: dict[int, RequestOutput] = {}
    stream = aiter(group)
    gone = asyncio.ensure_future(disconnected(raw))
    next_item = asyncio.ensure_future(anext(stream))
    try:
        while True:
            await asyncio.wait({next_item, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                break
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
        gone.cancel()
        if not group.done:
            state.engine.abort(group)
    if len(outputs) < len(group.requests):  # nobody is left to read this
        raise APIError(400, "the client disconnected before the answer was complete")
    return [outputs[i] for i in range(len(outputs))]


async def _sse(
    state: ServerState, group: RequestGroup, reply: Reply, include_usage: bool
) -> AsyncIterator[str]:
    """Server-Sent Events: one chunk per engine step per choice, then usage, then [DONE]. A
    client that disconnects cancels this generator; its requests are aborted."""
    deltas = [DeltaMaker(state.tokenizer, p.stop) for p in reply.params]
    outputs: dict[int, RequestOutput] = {}
    try:
        if reply.chat:
            for i in range(len(reply.params)):
                yield sse_event(reply.chat_chunk(i, Delta(role="assistant", content="")))
        async for index, news in group:
            delta = deltas[index].delta(news)
            if delta.output is not None:
                outputs[index] = delta.output
            yield sse_event(reply.chunk(index, delta))
        if include_usage:
            yield sse_event(reply.usage_chunk([outputs[i] for i in range(len(outputs))]))
        yield SSE_DONE
    except EngineError as e:
        error = ErrorInfo(message=str(e), type="server_error")
        yield sse_event(ErrorResponse(error=error))
    finally:
        if not group.done:
            state.engine.abort(group)
