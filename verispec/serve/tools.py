"""Tools and tool_choice of a chat request: which functions the chat template renders, whether
the answer's tool calls are parsed out (serve/tool_calls.py), and the grammar that forces a call
when one is required (llguidance's Lark with each function's parameters as `%json`, laid out as
Qwen2.5's template writes calls: Python's json.dumps separators, no free whitespace, so the
model continues text like its own and a call always ends). A template that takes no tools gets
them in the generic format instead (serve/generic_tools.py), its answer always constrained."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from verispec.serve.errors import APIError
from verispec.serve.generic_tool_calls import GenericCallParser
from verispec.serve.generic_tools import (
    TEXT,
    GenericPrompt,
    function_rules,
    generic_grammar,
    styled,
    system_text,
)
from verispec.serve.protocol import ChatCompletionRequest, FunctionDefinition
from verispec.serve.structured import check_constraint
from verispec.serve.tool_calls import CLOSE, OPEN, BareCallParser, CallParser, ToolCallParser
from verispec.types.sampling_params import SamplingParams, StructuredOutputsParams


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How a request's answer is shaped: the tools its chat template renders, the constraint
    it is sampled under, extra stop strings, the parser (a new one per answer) its tool calls
    are read by if any, and the rewriting of the conversation for a template without tools."""

    constraint: StructuredOutputsParams | None = None
    template_tools: list[dict[str, Any]] | None = None
    parse_tools: Callable[[], CallParser] | None = None
    stop: tuple[str, ...] = field(default=())
    prompt: GenericPrompt | None = None

    def apply(self, params: SamplingParams) -> SamplingParams:
        """`params` under this plan's constraint and stop strings."""
        if self.constraint is None and not self.stop:
            return params
        stop = [*params.stop, *(s for s in self.stop if s not in params.stop)]
        return replace(params, structured_outputs=self.constraint, stop=stop)

    def conversation(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages (ChatMessage.as_dict's) as the template is given them."""
        return list(messages) if self.prompt is None else self.prompt.apply(messages)


def _template_texts(tokenizer: Any) -> list[str]:
    """The texts of the tokenizer's chat templates (all of its named ones)."""
    template = getattr(tokenizer, "chat_template", None)
    return list(template.values()) if isinstance(template, dict) else [template or ""]


def takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template (any of its named ones) reads `tools`."""
    return any("tools" in t for t in _template_texts(tokenizer))


def generic_prompt(tokenizer: Any, system: str | None = None) -> GenericPrompt:
    """The rewriting of a conversation for this tokenizer's template (which takes no tools):
    tool results in `tool` turns if the template names that role, the tools' text in a system
    turn if it names that one."""
    texts = _template_texts(tokenizer)
    tool_role = any("'tool'" in t or '"tool"' in t for t in texts)
    return GenericPrompt(system, tool_role, any("system" in t for t in texts))


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
    false) of the given functions, forced by a grammar; a named function: one call of it. A
    template without tools gets them in the generic format, whose grammar always holds."""
    tools = body.tools or []
    choice = body.tool_choice or ("auto" if tools else "none")
    named = None if isinstance(choice, str) else choice.function.name
    generic = None if takes_tools(tokenizer) else generic_prompt(tokenizer)
    if choice == "none" or (choice == "auto" and not tools):
        return OutputPlan(constraint, prompt=generic)
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
    one_call = body.parallel_tool_calls is False or named is not None
    if choice == "auto":
        answer = _answer(constraint)
        called = functions
    else:
        if constraint is not None:
            raise APIError(400, f"tool_choice {named or choice!r} forces a tool call; it "
                           "cannot also follow a response format", "tool_choice")  # fmt: skip
        answer, called = None, [f for f in functions if named is None or f.name == named]
    if generic is not None:
        response = answer if constraint is not None else TEXT if choice == "auto" else None
        grammar = generic_grammar(called, one_call, response)
        prompt = replace(generic, system=system_text(called, one_call, response))
        parser = partial(GenericCallParser, constraint is not None)
        return OutputPlan(_checked(grammar), None, parser, prompt=prompt)
    rendered = [t.model_dump(exclude_none=True) for t in tools]
    if choice == "auto" and constraint is None:  # free text; one call: stop once it closes
        return OutputPlan(None, rendered, partial(BareCallParser, names),
                          (CLOSE,) if one_call else ())  # fmt: skip
    return OutputPlan(_checked(call_grammar(called, one_call, answer)), rendered, ToolCallParser)


def _answer(constraint: StructuredOutputsParams | None) -> Any:
    """The JSON schema a reply follows beside calls under auto (None: free text); a 400 for a
    constraint that is not JSON."""
    if constraint is None:
        return None
    if constraint.json is None and not constraint.json_object:
        raise APIError(400, "with tools and tool_choice auto, the answer can only be "
                       "constrained by a JSON response_format", "tools")  # fmt: skip
    if constraint.json_object:
        return {"type": "object"}
    return json.loads(constraint.json) if isinstance(constraint.json, str) else constraint.json


def _checked(grammar: str) -> StructuredOutputsParams:
    """The grammar as a constraint, checked by llguidance (a 400 naming tools if refused)."""
    forced = StructuredOutputsParams(grammar=grammar)
    check_constraint(forced, "tools")
    return forced


def call_grammar(functions: list[FunctionDefinition], one_call: bool, answer: Any = None) -> str:
    """llguidance Lark: tool-call blocks (one, or one or more separated by newlines), each
    `{"name": "<a function>", "arguments": <JSON its parameters schema accepts>}`; with `answer`
    (a JSON schema, or its JSON text), that JSON instead of calls is allowed too.

    >>> print(call_grammar([FunctionDefinition(name="f")], True).splitlines()[1])
    start: call
    """
    rules = ["%llguidance {}", "start: call" if one_call else 'start: call ("\\n" call)*']
    if answer is not None:
        rules[1] += " | answer"
        rules.append(f"answer: %json {styled(answer)}")
    alternatives, functions_ = function_rules(functions)
    rules.append(
        f"call: {json.dumps(OPEN + chr(10))} ({alternatives}) {json.dumps(chr(10) + CLOSE)}"
    )
    return "\n".join(rules + functions_) + "\n"
