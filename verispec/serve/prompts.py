"""A request's prompts, from its body to token ids: text checked (no lone surrogates), a chat
rendered by the model's template or, when the server trusts them, by the request's own in a
worker process (serve/templates.py, serve/template_workers.py), its size capped before it is
tokenized, and its token count held to the context. These run in worker threads, off the
event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from verispec.serve.errors import APIError
from verispec.serve.protocol import ChatCompletionRequest, CompletionRequest
from verispec.serve.state import ServerState
from verispec.serve.structured import requested_constraint
from verispec.serve.templates import (
    prompt_too_large,
    render_request_template,
    template_kwargs,
    text_bytes,
)
from verispec.serve.tools import OutputPlan, plan_output
from verispec.types.chat import render_chat

T = TypeVar("T")


def check_text(value: Any, path: str = "") -> None:
    """Raise a 400 naming the first string in a request (a field, an item, a key) that is not
    text: a lone surrogate, which JSON's escapes can write, cannot be encoded or tokenized."""
    if isinstance(value, str):
        if value.isascii():
            return
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise APIError(400, f"{path}: invalid text at character {e.start}: a lone surrogate "
                           f"U+{ord(value[e.start]):04X} (a surrogate escape must be one of a "
                           "pair)", path or None) from None  # fmt: skip
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            check_text(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_text(item, f"{path}.{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, path)
            check_text(item, f"{path}.{key}")


def too_long(state: ServerState, num_tokens: int, param: str) -> APIError:
    return APIError(400, f"the prompt has {num_tokens} tokens but this model's context is "
                    f"{state.max_model_len} tokens; shorten it", param,
                    "context_length_exceeded")  # fmt: skip


def encode(
    state: ServerState, text: str, param: str, add_special_tokens: bool = True
) -> list[int]:
    """Token ids of a text that fits the context, else the context error. The count comes from
    the tokenizer's own encoding: a huge prompt's ids never become a Python list, whose making
    and freeing hold the interpreter lock (and so the event loop) for long."""
    hf = state.tokenizer.hf
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        ids = list(hf.encode(text, add_special_tokens=add_special_tokens))
    else:
        encoding = backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        if len(encoding) >= state.max_model_len:
            raise too_long(state, len(encoding), param)
        ids = encoding.ids
    if len(ids) >= state.max_model_len:
        raise too_long(state, len(ids), param)
    return ids


async def chat_prompt(
    state: ServerState,
    body: ChatCompletionRequest,
    raw: Request,
    add_generation_prompt: bool = True,
) -> tuple[str, list[int], OutputPlan]:
    """(text, token ids) of a chat request's messages with its tools rendered (and the
    assistant's generation prompt, which only /tokenize may leave out), and what its
    output must match and is parsed for. Checking, templating, tokenizing and compiling a
    constraint run in worker threads (a request's own template in a worker process); a client
    that leaves meanwhile stops them (its worker process is killed; the model's own template,
    bounded by the body's size, finishes, but its text is not tokenized)."""
    gone = threading.Event()
    conversation, kwargs, plan = await asyncio.to_thread(_chat_inputs, state, body)
    cap = state.limits.prompt_bytes(state.max_model_len)
    template = kwargs.pop("chat_template", None)
    if template is None or state.templates is None:
        own = asyncio.to_thread(_own_template_prompt, state, conversation, kwargs, cap, gone,
                                add_generation_prompt)  # fmt: skip
        text, ids = await _unless_gone(raw, gone, own)
        return text, ids, plan
    tools = kwargs.pop("tools", None)
    variables = {**_special_tokens(state.tokenizer.hf), **kwargs}
    request = {"template": template, "messages": conversation, "tools": tools,
               "variables": variables, "max_bytes": cap,
               "add_generation_prompt": add_generation_prompt}  # fmt: skip
    rendered = render_request_template(state.templates, request, state.max_model_len)
    text = await _unless_gone(raw, gone, rendered)
    ids = await _unless_gone(raw, gone, asyncio.to_thread(_encode_chat, state, text, gone))
    return text, ids, plan


def _chat_inputs(
    state: ServerState, body: ChatCompletionRequest
) -> tuple[list[dict[str, Any]], dict[str, Any], OutputPlan]:
    """The conversation, the template variables (the tools among them) and the output plan of
    a chat request, its variables and text checked first."""
    kwargs = template_kwargs(body.chat_template_kwargs, state.templates is not None)
    check_text(body)
    plan = plan_output(body, state.tokenizer.hf, state.model_name, requested_constraint(body))
    if plan.template_tools:
        kwargs["tools"] = plan.template_tools
    return plan.conversation([m.as_dict() for m in body.messages]), kwargs, plan


def _own_template_prompt(
    state: ServerState,
    conversation: list[dict[str, Any]],
    kwargs: dict[str, Any],
    cap: int,
    gone: threading.Event,
    add_generation_prompt: bool,
) -> tuple[str, list[int]]:
    """(text, ids) of a conversation rendered by the model's own chat template."""
    try:
        text = render_chat(state.tokenizer.hf, conversation, state.model_name, kwargs,
                           add_generation_prompt)  # fmt: skip
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    size = text_bytes(text)
    if size > cap:
        raise prompt_too_large(size, cap, state.max_model_len)
    return text, _encode_chat(state, text, gone)


def _encode_chat(state: ServerState, text: str, gone: threading.Event) -> list[int]:
    """A rendered chat's token ids (it holds its special tokens), unless the client has left."""
    if gone.is_set():
        raise APIError(400, "the client disconnected before its prompt was tokenized")
    return encode(state, text, "messages", add_special_tokens=False)


def _special_tokens(hf: Any) -> dict[str, Any]:
    """The tokenizer's special tokens as template variables (bos_token, eos_token, ...), as
    transformers hands them to every template."""
    return {k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str | list)}


async def _unless_gone(raw: Request, gone: threading.Event, work: Awaitable[T]) -> T:
    """The result of `work`, unless the client disconnects first: then `gone` is set, the work
    cancelled (a thread it runs in finishes on its own) and the request ends."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(raw))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        gone.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise APIError(400, "the client disconnected before its prompt was rendered")
    return task.result()


def completion_prompts(
    state: ServerState, body: CompletionRequest
) -> list[tuple[list[int], str | None]]:
    """(token ids, text) of each prompt of a completions request, its text checked first (a
    worker thread runs this)."""
    check_text(body)
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty; give text, texts, token ids or lists of them",
                       "prompt")  # fmt: skip
    if isinstance(prompt[0], int):  # validated: a list of ids, or of strings or lists
        prompt = [prompt]
    out = []
    for p in prompt:
        if isinstance(p, str):
            out.append((encode(state, p, "prompt"), p))
        else:
            out.append((list(p), None))
    return out


async def disconnected(raw: Request) -> None:
    """Return when the client has closed its connection (ASGI's http.disconnect; the body was
    read before, so nothing else arrives on a request's channel)."""
    while (await raw.receive())["type"] != "http.disconnect":
        pass
