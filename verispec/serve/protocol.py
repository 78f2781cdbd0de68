"""The OpenAI API's request and response bodies (the fields vLLM's server takes), in pydantic.

Requests are strict: a field of the wrong type, out of range or unknown is a 400 naming it
(OpenAI's SDKs only send fields their caller set; a field this server would ignore is refused
rather than silently dropped). Responses carry one extension beside `usage`: `speculation`,
what speculative decoding did for the request (verispec's SpecStats, vLLM's definitions), and
each streamed choice carries the step's `speculation` (tokens, accepted drafts, their text).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verispec.api.sampling_params import SamplingParams

MAX_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's limit)."""
MAX_N = 16
"""Most choices per prompt."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send one more chunk before [DONE] with `usage` (and `speculation`) and no choices."""


class _GenerationRequest(_Strict):
    """Fields completions and chat completions share."""

    model: str | None = None
    """The served model's name (GET /v1/models); optional: there is one model."""
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: int | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    """An end-user id, as in OpenAI's API; accepted and not used."""
    logit_bias: dict[str, float] | None = None
    """Accepted empty ({} or null), as frameworks send it; tokens are not biased."""
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    """Add each choice's prompt_token_ids and token_ids (vLLM's extension)."""
    speculative: bool = True
    """verispec's extension: false decodes this request without drafts (0 every step, plain
    decoding of the same engine), the reference `verispec verify --server` compares with."""

    def sampling_params(
        self, max_tokens: int, logprobs: int | None, seed: int | None
    ) -> SamplingParams:
        """SamplingParams of one choice (unset fields take OpenAI's defaults)."""
        given = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "min_p": self.min_p, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
        }  # fmt: skip
        return SamplingParams(
            max_tokens=max_tokens, seed=seed, logprobs=logprobs, ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            speculative=self.speculative, **{k: v for k, v in given.items() if v is not None},
        )  # fmt: skip


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    """Text, texts (one completion each), token ids, or lists of token ids."""
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """Default 16, as OpenAI's (less when the context has less room)."""
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    """Log-probabilities of each token and of this many likeliest alternatives."""
    echo: Literal[False] = False
    """Echoing the prompt is not supported."""
    suffix: None = None
    """Insertion is not supported."""
    best_of: Annotated[int, Field(ge=1)] | None = None
    """Accepted only equal to n (no re-ranking)."""


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart]
    """Text, or a list of text parts (joined); images and audio are not supported."""
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template reads it (developer is system, as OpenAI maps)."""
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": text, **({"name": self.name} if self.name else {})}


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """Default: the rest of the context."""
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    """OpenAI's newer name for max_tokens; give one of the two."""
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    """Alternatives per token (needs logprobs: true)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the model's chat template."""


# Responses: the shapes of OpenAI's API (fields OpenAI sends as null are kept).


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


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculation: dict[str, Any] | None = None
    """What speculative decoding did (summed over the choices): verify steps, draft and
    accepted tokens, acceptance rate, mean acceptance length, per-position rates."""


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_TokenIds):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculation: dict[str, Any] | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_TokenIds):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None
    speculation: StepSpeculation | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculation: dict[str, Any] | None = None


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
