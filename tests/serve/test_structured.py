"""response_format and vLLM's guided fields: each maps to the StructuredOutputsParams it means,
bad ones are a 400 naming the field, and through the official `openai` client every answer
under a JSON schema validates (greedy and seeded, whole and streamed), greedy answers with
speculation equal plain decoding's, and the guided fields hold on completions."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest

from verispec.serve.errors import APIError
from verispec.serve.protocol import ChatCompletionRequest, CompletionRequest
from verispec.serve.structured import requested_constraint
from verispec.types.sampling_params import StructuredOutputsParams as S

pytestmark = pytest.mark.usefixtures("one_thread")

MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
SCHEMAS = {
    "object": PERSON,
    "enum": {"enum": ["red", "green", "blue"]},
    "array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
              "minItems": 1, "maxItems": 4},
    "numbers": {"type": "object",
                "properties": {"x": {"type": "number", "minimum": 0, "maximum": 10},
                               "ok": {"type": "boolean"}, "none": {"type": "null"}},
                "required": ["x", "ok", "none"], "additionalProperties": False},
    "nested": {"type": "object",
               "properties": {"user": PERSON,
                              "tags": {"type": "array", "maxItems": 3,
                                       "items": {"type": "string", "maxLength": 5}},
                              "kind": {"enum": ["a", "b"]}},
               "required": ["user", "tags", "kind"], "additionalProperties": False},
}  # fmt: skip


def chat_request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def json_schema(schema: Any = PERSON, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, **extra}}


MAPPED = [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, S(json_object=True)),
    ({"response_format": json_schema(strict=True)}, S(json=PERSON)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}}, S(json={})),
    ({"guided_json": PERSON}, S(json=PERSON)),
    ({"guided_json": json.dumps(PERSON)}, S(json=PERSON)),
    ({"guided_regex": "[0-9]{3}"}, S(regex="[0-9]{3}")),
    ({"guided_choice": ["yes", "no"]}, S(choice=["yes", "no"])),
    ({"guided_grammar": 'start: "a"+'}, S(grammar='start: "a"+')),
    ({"structured_outputs": {"json": PERSON}}, S(json=PERSON)),
    ({"structured_outputs": {"choice": ["x"]}}, S(choice=["x"])),
    ({"structured_outputs": {"json_object": True}}, S(json_object=True)),
    ({"response_format": {"type": "text"}, "guided_regex": "a"}, S(regex="a")),
]


@pytest.mark.parametrize(("fields", "expected"), MAPPED, ids=lambda v: str(v)[:50])
def test_each_field_maps_to_the_constraint_it_means(fields, expected) -> None:
    assert requested_constraint(chat_request(**fields)) == expected
    assert requested_constraint(CompletionRequest(prompt="x", **fields)) == expected


BAD = [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_json": PERSON, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"response_format": json_schema({"type": "nope"})}, "response_format"),
    ({"response_format": json_schema({"$ref": "#/$defs/missing"})}, "response_format"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": "[1]"}, "guided_json"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=lambda v: str(v)[:50])
def test_a_bad_constraint_is_a_400_naming_its_field(fields, param) -> None:
    with pytest.raises(APIError) as e:
        requested_constraint(chat_request(**fields))
    assert (e.value.status, e.value.param) == (400, param), e.value.message


# Through the openai client against a served model (the engine applies the constraint)


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    fields = {"messages": MESSAGES, "max_tokens": 400, **fields}
    return client.chat.completions.create(model="tiny-tools", **fields)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_answer_validates_against_its_schema(client: openai.OpenAI, name: str) -> None:
    schema = SCHEMAS[name]
    for seed in (None, 0, 1, 2):
        out = chat(client, response_format=json_schema(schema, strict=True), seed=seed,
                   temperature=0 if seed is None else 1)  # fmt: skip
        choice = out.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_answers_are_objects(client: openai.OpenAI) -> None:
    for seed in range(3):
        out = chat(client, response_format={"type": "json_object"}, seed=seed, temperature=1,
                   max_tokens=1000)  # fmt: skip
        if out.choices[0].finish_reason == "stop":  # an object may be long; what ends is one
            assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_greedy_with_speculation_equals_plain_decoding(client: openai.OpenAI) -> None:
    for schema in SCHEMAS.values():
        spec = chat(client, response_format=json_schema(schema), temperature=0)
        plain = chat(client, response_format=json_schema(schema), temperature=0,
                     extra_body={"speculative": False})  # fmt: skip
        assert spec.choices[0].message.content == plain.choices[0].message.content


def test_a_streamed_answer_equals_the_whole_one(client: openai.OpenAI) -> None:
    fields = {"response_format": json_schema(SCHEMAS["nested"]), "temperature": 0}
    whole = chat(client, **fields).choices[0].message.content
    stream = chat(client, **fields, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


def test_guided_fields_hold_on_completions(client: openai.OpenAI) -> None:
    def complete(**extra: Any) -> str:
        out = client.completions.create(model="tiny-tools", prompt="The answer:", max_tokens=60,
                                        temperature=1, seed=3, extra_body=extra)  # fmt: skip
        return out.choices[0].text

    assert complete(guided_choice=["yes", "no", "maybe"]) in ("yes", "no", "maybe")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", complete(guided_regex="[0-9]{3}-[a-z]{2}"))
    jsonschema.validate(json.loads(complete(guided_json=PERSON)), PERSON)
    assert complete(structured_outputs={"grammar": 'start: "ab"{2,3} "!"'}) in (
        "abab!", "ababab!")  # fmt: skip


def test_a_bad_schema_through_the_client_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="llguidance") as e:
        chat(client, response_format=json_schema({"type": "nope"}))
    assert e.value.body["param"] == "response_format"
