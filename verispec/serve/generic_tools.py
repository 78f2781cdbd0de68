"""The generic tool format, for models whose chat template takes no tools: the tools and the
reply's shape written into the system turn, earlier calls and tool results written as JSON text
in turns every template renders, and the llguidance grammar that holds the answer to one JSON
object, a call `{"tool_call": {"name", "arguments"}}` (several: `{"tool_calls": [...]}`) or a
reply `{"response": ...}`, the shape llama.cpp's server uses (serve/generic_tool_calls.py parses
it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verispec.sample.grammar import JSON_FORMAT
from verispec.serve.protocol import FunctionDefinition

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
"""The arguments of a function that gives no parameters schema."""
TEXT = {"type": "string"}
"""The schema of a plain reply: text."""
CALL_KEY, CALLS_KEY = "tool_call", "tool_calls"
RESPONSE_KEY, RESULT_KEY = "response", "tool_response"


def styled(schema: Any) -> str:
    """A JSON schema's text with JSON_FORMAT's layout (its own x-guidance options win).

    >>> json.loads(styled({"type": "string"}))["x-guidance"]["whitespace_flexible"]
    False
    """
    value = json.loads(schema) if isinstance(schema, str) else schema
    if isinstance(value, dict):
        own = value.get("x-guidance")
        value = {**value, "x-guidance": {**JSON_FORMAT, **(own if isinstance(own, dict) else {})}}
    return json.dumps(value)


def function_rules(functions: Sequence[FunctionDefinition]) -> tuple[str, list[str]]:
    """(the alternatives of a call, their rules): `function_i` writes `{"name": "<its name>",
    "arguments": <JSON its parameters schema accepts>}`, each schema its own `%json` root so its
    `$ref`s resolve as written.

    >>> function_rules([FunctionDefinition(name="f")])[0]
    'function_0'
    """
    rules = []
    for i, f in enumerate(functions):
        head = f'{{"name": {json.dumps(f.name)}, "arguments": '
        schema = NO_ARGUMENTS if f.parameters is None else f.parameters
        rules.append(f'function_{i}: {json.dumps(head)} %json {styled(schema)} "}}"')
    return " | ".join(f"function_{i}" for i in range(len(functions))), rules


def generic_grammar(
    functions: Sequence[FunctionDefinition], one_call: bool, response: Any = None
) -> str:
    """llguidance Lark of a generic answer: `{"tool_call": <a call>}`, or also `{"tool_calls":
    [<a call>, ...]}` unless one_call; with `response` (a JSON schema, or its text), also
    `{"response": <JSON it accepts>}` (TEXT: a plain reply).

    >>> print(generic_grammar([FunctionDefinition(name="f")], True, TEXT).splitlines()[1])
    start: one_call | response
    """
    heads = ["one_call"] if one_call else ["one_call", "calls"]
    if response is not None:
        heads.append("response")
    rules = ["%llguidance {}", f"start: {' | '.join(heads)}"]
    alternatives, functions_ = function_rules(functions)
    rules.append(f"one_call: {json.dumps('{' + json.dumps(CALL_KEY) + ': ')} call \"}}\"")
    if not one_call:
        head = json.dumps("{" + json.dumps(CALLS_KEY) + ": [")
        rules.append(f'calls: {head} call (", " call)* "]}}"')
    if response is not None:
        head = json.dumps("{" + json.dumps(RESPONSE_KEY) + ": ")
        rules.append(f'response: {head} answer "}}"')
        rules.append(f"answer: %json {styled(response)}")
    rules.append(f"call: {alternatives}")
    return "\n".join(rules + functions_) + "\n"


def system_text(
    functions: Sequence[FunctionDefinition], one_call: bool, response: Any = None
) -> str:
    """The system turn's text that lists the functions (name, description, parameters) and the
    reply's forms the grammar allows (generic_grammar's arguments)."""
    listed = [json.dumps(f.model_dump(exclude_none=True, exclude={"strict"}), ensure_ascii=False)
              for f in functions]  # fmt: skip
    name = functions[0].name if len(functions) == 1 else "<function name>"
    call = f'{{"name": "{name}", "arguments": <its arguments as a JSON object>}}'
    forms = [f'{{"{CALL_KEY}": {call}}} to call a function']
    if not one_call:
        forms.append(f'{{"{CALLS_KEY}": [{call}, ...]}} to call several functions at once')
    if response == TEXT:
        forms.append(f'{{"{RESPONSE_KEY}": "<your reply>"}} to reply without calling a function')
    elif response is not None:
        forms.append(f'{{"{RESPONSE_KEY}": <your reply as JSON following this schema: '
                     f"{json.dumps(response, ensure_ascii=False)}>}} to reply without calling "
                     "a function")  # fmt: skip
    which = "one of these forms" if len(forms) > 1 else "this form"
    return "\n".join([
        "You can call functions. Each is a JSON object of its name, its description and the "
        "JSON schema of its arguments:", *listed, "",
        f"Answer with one JSON object and nothing else, in {which}:", *forms, "",
        f'A function\'s result comes back as {{"{RESULT_KEY}": {{"name": "<function name>", '
        '"content": "<its result>"}}.',
    ])  # fmt: skip


@dataclass(frozen=True, slots=True)
class GenericPrompt:
    """How a conversation is rewritten for a template without tools: the tools' text at the
    head of the system turn (None: no tools rendered), earlier calls as the JSON the model would
    write, tool results as JSON in `tool` turns (when the template names that role) or else in
    user turns merged with their neighbours (templates that demand alternating roles)."""

    system: str | None = None
    tool_role: bool = False
    system_role: bool = True

    def apply(self, conversation: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rewritten conversation (messages are dicts as ChatMessage.as_dict gives them)."""
        names: dict[str, str] = {}  # call id -> function name
        out: list[dict[str, Any]] = []
        merged = False  # out[-1] is a user turn holding tool results
        for m in conversation:
            calls = m.get("tool_calls") or []
            names.update((c["id"], c["function"]["name"]) for c in calls)
            if m["role"] == "tool":
                m, result = self._result(m, names), True
            elif calls:
                m = {**{k: v for k, v in m.items() if k != "tool_calls"},
                     "content": _joined(m["content"], calls_text(calls))}  # fmt: skip
                result = False
            else:
                result = False
            if out and m["role"] == "user" == out[-1]["role"] and (merged or result):
                out[-1] = {**out[-1], "content": _joined(out[-1]["content"], m["content"])}
                merged = True
                continue
            out.append(m)
            merged = result and m["role"] == "user"
        return self._with_system(out)

    def _result(self, message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
        """A tool message as a `tool` or user turn holding {"tool_response": {name, content}}."""
        name = names.get(message.get("tool_call_id", "")) or message.get("name")
        result = {"name": name, "content": message["content"]} if name else {
            "content": message["content"]}  # fmt: skip
        text = json.dumps({RESULT_KEY: result}, ensure_ascii=False)
        return {"role": "tool" if self.tool_role else "user", "content": text}

    def _with_system(self, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tools' text before the first system turn's, in a new one if there is none (in
        the first turn when the template has no system role)."""
        if self.system is None:
            return conversation
        first = conversation[0] if conversation else None
        if first is not None and (first["role"] == "system" or not self.system_role):
            return [{**first, "content": _joined(self.system, first["content"])},
                    *conversation[1:]]  # fmt: skip
        return [{"role": "system", "content": self.system}, *conversation]


def calls_text(calls: Sequence[dict[str, Any]]) -> str:
    """An assistant's earlier calls (OpenAI's, arguments decoded) as the generic JSON answer.

    >>> calls_text([{"function": {"name": "f", "arguments": {"x": 1}}}])
    '{"tool_call": {"name": "f", "arguments": {"x": 1}}}'
    """
    written = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
               for c in calls]  # fmt: skip
    value = {CALL_KEY: written[0]} if len(written) == 1 else {CALLS_KEY: written}
    return json.dumps(value, ensure_ascii=False)


def _joined(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if first and second else first or second
