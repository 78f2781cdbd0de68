"""POST /tokenize and POST /detokenize (vLLM's and llama-server's extras): text or a chat to the
token ids the server would run, and ids back to text, with their request and response bodies.

A chat is rendered exactly as /v1/chat/completions renders it (serve/prompts.py: the model's
template or, when trusted, the request's own in a worker process, under the same size cap), so
its ids are the ones a chat request with these messages would send the engine; a prompt is
tokenized as /v1/completions tokenizes it. Either must fit the context as there: what the
server could not run is a 400 whose message gives its token count.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from verispec.serve.errors import APIError
from verispec.serve.prompts import chat_prompt, check_text, encode
from verispec.serve.protocol import ChatCompletionRequest, ChatMessage, Tool
from verispec.serve.state import ServerState
from verispec.types.chat import require_chat_template

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
"""The request bodies are strict, as protocol.py's: a wrong type or unknown field is a 400."""
CHAT_FIELDS = ("add_generation_prompt", "tools", "chat_template_kwargs")
"""Fields of /tokenize that shape a chat's rendering, so apply to messages only."""
_TOKENIZE_SHAPES = {
    "anyOf": [
        {"required": ["prompt"],
         "not": {"anyOf": [{"required": [f]} for f in ("messages", *CHAT_FIELDS)]}},
        {"required": ["messages"], "not": {"required": ["prompt"]}},
    ]
}  # fmt: skip
"""What TokenizeRequest's handler checks, said in its JSON schema (GET /openapi.json)."""


class TokenizeRequest(BaseModel):
    """POST /tokenize: a prompt, or a chat's messages (with their tools) to render first."""

    model_config = ConfigDict(**STRICT, json_schema_extra=_TOKENIZE_SHAPES)

    model: str | None = None
    """The served model's name (GET /v1/models); optional: there is one model."""
    prompt: str | None = None
    """Text, tokenized as /v1/completions tokenizes a prompt. Give this or messages."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    """A chat, rendered by the chat template as /v1/chat/completions renders it."""
    add_special_tokens: bool | None = None
    """Let the tokenizer add its special tokens (BOS, ...): default true for a prompt, false
    for messages, whose template writes its own."""
    add_generation_prompt: bool | None = None
    """Messages only: end with the assistant's turn opening, as a chat request does (default
    true); false counts the conversation alone."""
    tools: list[Tool] | None = None
    """Messages only: functions rendered by the chat template, as a chat request's are."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Messages only: extra variables for the chat template, as in a chat request."""
    return_token_strs: bool = False
    """Also answer each token as the tokenizer's vocabulary writes it."""


class TokenizeResponse(BaseModel):
    count: int
    """How many tokens."""
    max_model_len: int
    """The model's context length, prompt and answer together."""
    tokens: list[int]
    token_strs: list[str] | None = None
    """With return_token_strs: each token's vocabulary entry (byte-level BPE writes a space as
    Ġ); else null."""


class DetokenizeRequest(BaseModel):
    """POST /detokenize: token ids to text."""

    model_config = STRICT

    model: str | None = None
    """The served model's name (GET /v1/models); optional: there is one model."""
    tokens: list[int]
    """Ids in [0, the tokenizer's vocabulary size); special tokens are written out."""


class DetokenizeResponse(BaseModel):
    prompt: str


async def tokenize(state: ServerState, body: TokenizeRequest, raw: Request) -> TokenizeResponse:
    """The token ids of a prompt or a chat (a 400 naming the field for what cannot be done)."""
    if (body.prompt is None) == (body.messages is None):
        given = "both" if body.prompt is not None else "neither"
        raise APIError(400, f"give prompt (text) or messages (a chat), one of the two; got "
                       f"{given}", "prompt" if given == "both" else None)  # fmt: skip
    if body.messages is None:
        chat_only = next((f for f in CHAT_FIELDS if getattr(body, f) is not None), None)
        if chat_only is not None:
            raise APIError(400, f"{chat_only} applies to messages only, not to a prompt",
                           chat_only)  # fmt: skip
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = await asyncio.to_thread(_prompt_ids, state, body.prompt or "", add_special)
    else:
        ids = await _chat_ids(state, body, raw)
    strs = None
    if body.return_token_strs:
        strs = await asyncio.to_thread(state.tokenizer.hf.convert_ids_to_tokens, ids)
    return TokenizeResponse(count=len(ids), max_model_len=state.max_model_len, tokens=ids,
                            token_strs=strs)  # fmt: skip


def _prompt_ids(state: ServerState, prompt: str, add_special_tokens: bool) -> list[int]:
    check_text(prompt, "prompt")
    return list(encode(state, prompt, "prompt", add_special_tokens))


async def _chat_ids(state: ServerState, body: TokenizeRequest, raw: Request) -> list[int]:
    """A chat's ids as /v1/chat/completions computes them, special tokens added on request."""
    try:
        require_chat_template(state.tokenizer.hf, state.model_name)
    except ValueError:
        raise APIError(400, f"model {state.model_name} has no chat template; send a plain "
                       "prompt instead of messages", "messages") from None  # fmt: skip
    chat = ChatCompletionRequest(messages=body.messages or [], tools=body.tools,
                                 chat_template_kwargs=body.chat_template_kwargs)  # fmt: skip
    add_generation = body.add_generation_prompt is not False
    text, ids, _ = await chat_prompt(state, chat, raw, add_generation)
    if body.add_special_tokens:
        return list(await asyncio.to_thread(encode, state, text, "messages", True))
    return list(ids)


async def detokenize(state: ServerState, body: DetokenizeRequest) -> DetokenizeResponse:
    """The text of token ids (checked and decoded in a worker thread: a body may hold millions)."""
    return DetokenizeResponse(prompt=await asyncio.to_thread(_decode, state, body.tokens))


def _decode(state: ServerState, tokens: list[int]) -> str:
    """Ids to text, special tokens written out and spaces as the ids give them (no clean-up),
    so a prompt's ids give the prompt back; an id the tokenizer lacks is a 400 naming it."""
    size = state.tokenizer.vocab_size
    bad = next((i for i, t in enumerate(tokens) if not 0 <= t < size), None)
    if bad is not None:
        raise APIError(400, f"token id {tokens[bad]} (tokens.{bad}) is outside the vocabulary: "
                       f"ids are 0 to {size - 1}", f"tokens.{bad}")  # fmt: skip
    return state.tokenizer.hf.decode(tokens, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)  # fmt: skip
