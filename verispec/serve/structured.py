"""What a request's answer must match: OpenAI's `response_format` and vLLM's `guided_*` and
`structured_outputs` fields as one `StructuredOutputsParams`, checked with llguidance before the
request is queued, so a bad schema, regex or grammar is a 400 naming its field."""

from __future__ import annotations

import json
from typing import Any

from verispec.sample.grammar import grammar_text, language_is_empty
from verispec.serve.errors import APIError
from verispec.serve.protocol import ChatCompletionRequest, CompletionRequest, StructuredOutputsField
from verispec.types.sampling_params import StructuredOutputsParams

CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar", "structured_outputs")  # fmt: skip
"""The request fields that constrain the answer; a request gives at most one."""


def requested_constraint(
    body: CompletionRequest | ChatCompletionRequest,
) -> StructuredOutputsParams | None:
    """The constraint the request's fields ask for (None: free text), checked: a 400 names the
    field when two are given or when llguidance refuses the schema, regex or grammar."""
    given = [(name, getattr(body, name)) for name in CONSTRAINT_FIELDS
             if getattr(body, name) is not None]  # fmt: skip
    given = [(n, v) for n, v in given if not (n == "response_format" and v.type == "text")]
    if not given:
        return None
    if len(given) > 1:
        raise APIError(400, f"give at most one of {', '.join(CONSTRAINT_FIELDS)}; got "
                       f"{' and '.join(n for n, _ in given)}", given[1][0])  # fmt: skip
    name, value = given[0]
    params = _as_params(name, value)
    check_constraint(params, name)
    return params


def _as_params(name: str, value: Any) -> StructuredOutputsParams:
    """One constraint field's value as StructuredOutputsParams (a 400 naming it if refused)."""
    try:
        if name == "response_format":
            if value.type == "json_object":
                return StructuredOutputsParams(json_object=True)
            schema = value.json_schema.schema_
            return StructuredOutputsParams(json={} if schema is None else schema)
        if name == "guided_json":
            return StructuredOutputsParams(json=_schema(value))
        if name == "structured_outputs":
            return _from_field(value)
        return StructuredOutputsParams(**{name.removeprefix("guided_"): value})
    except ValueError as e:
        raise APIError(400, f"{name}: {e}", name) from None


def _from_field(field: StructuredOutputsField) -> StructuredOutputsParams:
    json_schema = None if field.json_ is None else _schema(field.json_)
    return StructuredOutputsParams(json=json_schema, json_object=bool(field.json_object),
                                   regex=field.regex, choice=field.choice,
                                   grammar=field.grammar)  # fmt: skip


def _schema(value: dict[str, Any] | str) -> dict[str, Any]:
    """A JSON schema given as a dict or as its JSON text, as a dict."""
    if isinstance(value, dict):
        return value
    try:
        schema = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"the schema is not JSON text ({e})") from None
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema is an object, got {type(schema).__name__}")
    return schema


def check_constraint(params: StructuredOutputsParams, field: str) -> None:
    """Raise a 400 naming `field` unless llguidance compiles the constraint's grammar (the one
    the engine compiles, sample/grammar.py; here without the tokenizer, off the engine) and
    some text matches it (an answer that can match nothing could only be cut off)."""
    from llguidance import LLMatcher

    try:
        grammar = grammar_text(params)
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", field) from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise APIError(400, f"{field}: llguidance cannot compile it: {error.strip()}", field)
    if language_is_empty(grammar):
        raise APIError(400, f"{field}: no text matches it (its language is empty); give a "
                       "constraint some answer can meet", field)  # fmt: skip
