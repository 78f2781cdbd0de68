"""Tools and tool_choice of a chat request: which functions the chat template renders, whether
the answer's tool calls are parsed out (serve/tool_calls.py), and the grammar that forces a call
when one is required (llguidance's Lark with each function's parameters as `%json`, laid out as
Qwen2.5's template writes calls: Python's json.dumps separators, no free whitespace, so the
model continues text like its own and a call always ends)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from verispec.sample.grammar import JSON_FORMAT
from verispec.serve.errors import APIError
from verispec.serve.protocol import ChatCompletionRequest, FunctionDefinition
from verispec.serve.structured import check_constraint
from verispec.serve.tool_calls import CLOSE, OPEN
from verispec.types.sampling_params import SamplingParams, StructuredOutputsParams

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
"""The arguments of a function that gives no parameters schema."""


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How a request's answer is shaped: the tools its chat template renders, the constraint
    it is sampled under, extra stop strings, and whether tool calls are parsed out of it."""

    constraint: StructuredOutputsParams | None = None
    template_tools: list[dict[str, Any]] | None = None
    parse_tools: bool = False
    stop: tuple[str, ...] = field(default=())

    def apply(self, params: SamplingParams) -> SamplingParams:
        """`params` under this plan's constraint and stop strings."""
        if self.constraint is None and not self.stop:
            return params
        stop = [*params.stop, *(s for s in self.stop if s not in params.stop)]
        return replace(params, structured_outputs=self.constraint, stop=stop)


def takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template (any of its named ones) reads `tools`."""
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template or ""]
    return any("tools" in t for t in texts)


def plan_output(
    body: ChatCompletionRequest,
    tokenizer: Any,
    model_name: str,
    constraint: StructuredOutputsParams | None,
) -> OutputPlan:
    """The plan of a chat request's answer (a 400 naming the field for what cannot be done).

    tool_choice none (the default without tools): no tools rendered, nothing parsed. auto:
    tools rendered, calls parsed, nothing forced (beside a JSON response_format, the answer is
    either calls or that JSON). required: one or more calls (one when parallel_tool_calls is
    false) of the given functions, forced by a grammar; a named function: one call of it."""
    tools = body.tools or []
    choice = body.tool_choice or ("auto" if tools else "none")
    named = None if isinstance(choice, str) else choice.function.name
    if choice == "none" or (choice == "auto" and not tools):
        return OutputPlan(constraint)
    if not tools:
        raise APIError(400, f"tool_choice {named or choice!r} needs tools", "tool_choice")
    functions = [t.function for t in tools]
    for i, f in enumerate(functions):
        if f.parameters is not None and f.parameters.get("type", "object") != "object":
            message = f"function {f.name}'s parameters must be a JSON schema of an object"
            raise APIError(400, message, f"tools.{i}.function.parameters")
    names = [f.name for f in functions]
    if len(set(names)) < len(names):
        raise APIError(400, f"tools name a function twice: {names}", "tools")
    if named is not None and named not in names:
        raise APIError(400, f"tool_choice names function {named!r}, which is not among the "
                       f"tools ({', '.join(names)})", "tool_choice")  # fmt: skip
    if not takes_tools(tokenizer):
        raise APIError(400, f"the chat template of model {model_name} does not take tools; send "
                       "no tools or tool_choice: none", "tools")  # fmt: skip
    rendered = [t.model_dump(exclude_none=True) for t in tools]
    one_call = body.parallel_tool_calls is False or named is not None
    if choice == "auto":
        if constraint is None:  # free text; at most one call: stop once the first closes
            return OutputPlan(None, rendered, True, (CLOSE,) if one_call else ())
        if constraint.json is None and not constraint.json_object:
            raise APIError(400, "with tools and tool_choice auto, the answer can only be "
                           "constrained by a JSON response_format", "tools")  # fmt: skip
        answer = {"type": "object"} if constraint.json_object else constraint.json
        grammar = call_grammar(functions, one_call, answer)
    else:
        if constraint is not None:
            raise APIError(400, f"tool_choice {named or choice!r} forces a tool call; it "
                           "cannot also follow a response format", "tool_choice")  # fmt: skip
        called = [f for f in functions if named is None or f.name == named]
        grammar = call_grammar(called, one_call)
    forced = StructuredOutputsParams(grammar=grammar)
    check_constraint(forced, "tools")
    return OutputPlan(forced, rendered, True)


def call_grammar(functions: list[FunctionDefinition], one_call: bool, answer: Any = None) -> str:
    """llguidance Lark: tool-call blocks (one, or one or more separated by newlines), each
    `{"name": "<a function>", "arguments": <JSON its parameters schema accepts>}`; with `answer`
    (a JSON schema, or its JSON text), that JSON instead of calls is allowed too. Each function's
    schema is its own `%json` root, so its `$ref`s resolve as written.

    >>> print(call_grammar([FunctionDefinition(name="f")], True).splitlines()[1])
    start: call
    """
    rules = ["%llguidance {}", "start: call" if one_call else 'start: call ("\\n" call)*']
    if answer is not None:
        rules[1] += " | answer"
        rules.append(f"answer: %json {_styled(answer)}")
    alternatives = " | ".join(f"function_{i}" for i in range(len(functions)))
    rules.append(
        f"call: {json.dumps(OPEN + chr(10))} ({alternatives}) {json.dumps(chr(10) + CLOSE)}"
    )
    for i, f in enumerate(functions):
        head = f'{{"name": {json.dumps(f.name)}, "arguments": '
        schema = NO_ARGUMENTS if f.parameters is None else f.parameters
        rules.append(f'function_{i}: {json.dumps(head)} %json {_styled(schema)} "}}"')
    return "\n".join(rules) + "\n"


def _styled(schema: Any) -> str:
    """A JSON schema's text with JSON_FORMAT's layout (its own x-guidance options win)."""
    value = json.loads(schema) if isinstance(schema, str) else schema
    if isinstance(value, dict):
        own = value.get("x-guidance")
        value = {**value, "x-guidance": {**JSON_FORMAT, **(own if isinstance(own, dict) else {})}}
    return json.dumps(value)
