"""The OpenAI API's request bodies (the fields vLLM's server takes), in pydantic; the response
bodies are serve/responses.py's.

Requests are strict: a field of the wrong type, out of range or unknown is a 400 naming it
(OpenAI's SDKs only send fields their caller set; a field this server would ignore is refused
rather than silently dropped). verispec's one extension is `speculative`: false decodes a
request without drafts.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from verispec.types.sampling_params import SamplingParams

MAX_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's limit)."""
MAX_N = 16
"""Most choices per prompt."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send one more chunk before [DONE] with `usage` (and `speculation`) and no choices."""


FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
"""What a function's or a JSON schema's name may be (OpenAI's rule)."""


def _json_text(value: str) -> str:
    """value, when it parses as JSON (a ValueError saying why not otherwise)."""
    try:
        json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"arguments must be JSON text ({e})") from None
    return value


JsonArguments = Annotated[str, AfterValidator(_json_text)]
"""A call's arguments as JSON text (OpenAI's form), checked to parse."""


class JsonSchemaFormat(_Strict):
    """response_format's json_schema: the schema the answer follows."""

    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    """The JSON schema; none means any JSON value."""
    strict: bool | None = None
    """Accepted; the schema is always enforced."""


class ResponseFormatText(_Strict):
    type: Literal["text"]


class ResponseFormatJsonObject(_Strict):
    type: Literal["json_object"]


class ResponseFormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
    Field(discriminator="type"),
]


class StructuredOutputsField(_Strict):
    """vLLM's `structured_outputs` request field: exactly one of these."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    """llguidance's Lark syntax."""


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
    response_format: ResponseFormat | None = None
    """text (no constraint), json_object or json_schema (serve/structured.py)."""
    guided_json: dict[str, Any] | str | None = None
    """vLLM's extras: the answer follows a JSON schema, a regex, one of the strings, a grammar."""
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsField | None = None
    """vLLM's newer form of the guided_* fields."""

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


class FunctionCall(_Strict):
    name: str
    arguments: JsonArguments


class MessageToolCall(_Strict):
    """A tool call of an earlier assistant message, sent back with the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCall


_GIVEN = {"type": ["string", "array"]}
_MESSAGE_SHAPES = {
    "anyOf": [
        {"properties": {"role": {"enum": ["system", "user", "developer"]}, "content": _GIVEN},
         "required": ["content"],
         "not": {"anyOf": [{"required": ["tool_calls"]}, {"required": ["tool_call_id"]}]}},
        {"properties": {"role": {"const": "tool"}, "content": _GIVEN}, "required": ["content"],
         "not": {"required": ["tool_calls"]}},
        {"properties": {"role": {"const": "assistant"}, "content": _GIVEN},
         "required": ["content"], "not": {"required": ["tool_call_id"]}},
        {"properties": {"role": {"const": "assistant"}, "tool_calls": {"minItems": 1}},
         "required": ["tool_calls"], "not": {"required": ["tool_call_id"]}},
    ]
}  # fmt: skip
"""What the validators of ChatMessage check, said in its JSON schema (GET /openapi.json)."""


class ChatMessage(_Strict):
    model_config = ConfigDict(json_schema_extra=_MESSAGE_SHAPES)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    """An assistant message's tool calls."""
    tool_call_id: str | None = None
    """A tool message's call."""
    content: Annotated[str | list[TextPart] | None, Field(validate_default=True)] = None
    """Text, or a list of text parts (joined); images and audio are not supported. Null or
    absent only in an assistant message with tool_calls."""

    @field_validator("content")
    @classmethod
    def _content_given(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and not info.data.get("tool_calls"):
            raise ValueError("content is required (null only in an assistant message with "
                             "tool_calls)")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _fields_of_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls belong to assistant messages, not {self.role}")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(f"tool_call_id belongs to tool messages, not {self.role}")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template reads it (developer is system, as OpenAI maps; a
        tool call's arguments decoded, as templates write them with tojson)."""
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": text}
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name,
                              "arguments": json.loads(c.function.arguments)}}
                for c in self.tool_calls
            ]  # fmt: skip
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDefinition(_Strict):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema; none means no arguments."""
    strict: bool | None = None
    """Accepted; a required or named call always follows the schema."""


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


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
    tools: list[Tool] | None = None
    """Functions the model may call, rendered by its chat template (serve/tools.py)."""
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """Default auto with tools, none without."""
    parallel_tool_calls: bool | None = None
    """false: at most one call per answer."""
