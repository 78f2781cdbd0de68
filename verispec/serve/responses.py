"""OpenAI's response bodies in pydantic: completions and chat completions, whole or as stream
chunks, the model list and errors. Fields OpenAI sends as null are kept. Beside `usage` each
body carries verispec's `speculation` (SpecStats, vLLM's definitions), and each streamed choice
the step's (tokens, accepted drafts, their text); serve/openai_format.py fills them in.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class StepSpeculation(BaseModel):
    """What one engine step emitted for a streamed choice."""

    num_tokens: int
    """Tokens emitted this step."""
    num_accepted_tokens: int
    """Of those, drafts the target accepted (the rest the target produced itself)."""
    num_draft_tokens: int
    """Draft tokens the target checked this step."""
    accepted_text: str
    """The start of this chunk's text that the accepted drafts completed."""


class CompletionLogprobs(BaseModel):
    """The legacy completions format: token strings, their logprobs, the top alternatives."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class _TokenIds(BaseModel):
    prompt_token_ids: list[int] | None = None
    """With return_token_ids: the prompt's ids (in a stream, on the first chunk)."""
    token_ids: list[int] | None = None
    """With return_token_ids: the output's ids (in a stream, this chunk's)."""


class CompletionChoice(_TokenIds):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None
    speculation: StepSpeculation | None = None
    """Streamed chunks only."""


class _Envelope(BaseModel):
    """The fields every completion object carries, in OpenAI's order; each object names its
    own `object` and choices (a subclass's override keeps the field's place)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    usage: Usage | None = None
    speculation: dict[str, Any] | None = None
    """What speculative decoding did (summed over the choices): verify steps, draft and
    accepted tokens, acceptance rate, mean acceptance length, per-position rates."""


class CompletionResponse(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ToolCallFunction(BaseModel):
    name: str
    arguments: str
    """JSON text."""


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """The text outside tool calls; null when there is none beside them."""
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_TokenIds):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed tool call: sent whole, in one chunk, once its block has closed."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(_TokenIds):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    speculation: StepSpeculation | None = None


class ChatCompletionChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "verispec"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error, as OpenAI sends it."""

    error: ErrorInfo
