"""Chat input: checks on prompt text and chat messages, and the model's chat template applied
to a conversation (what `LLM.chat` and `verispec chat` send to the engine)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2.defaults import DEFAULT_NAMESPACE
from transformers import PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

ROLES = ("system", "user", "assistant", "tool")
"""Roles a chat message may have."""

Message = Mapping[str, Any]
Conversation = Sequence[Message]


def _template_call_names() -> frozenset[str]:
    """The names chat_template_kwargs may not set: the parameters of transformers'
    apply_chat_template and of the renderer it calls (passed twice they are a TypeError, and
    `chat_template` would run the caller's own Jinja), the variables the renderer sets itself
    (`messages`), and the template's globals (`range`, `raise_exception`, ...), which a value
    would shadow."""
    names = {"messages", "raise_exception", "strftime_now", *DEFAULT_NAMESPACE}
    for function in (PreTrainedTokenizerBase.apply_chat_template, render_jinja_template):
        names |= {p.name for p in inspect.signature(function).parameters.values()
                  if p.kind is not p.VAR_KEYWORD}  # fmt: skip
    return frozenset(names)


RESERVED_TEMPLATE_NAMES = _template_call_names()
"""Names chat_template_kwargs may not set (conversation, tools, documents, chat_template,
tokenize, add_generation_prompt, continue_final_message, return_dict, tokenizer_kwargs, ...)."""


def check_text(text: str, what: str = "prompt") -> str:
    """Return `text` if it encodes to UTF-8, else raise a ValueError naming the first lone
    surrogate (Python strings may hold them; a tokenizer cannot encode them).

    >>> check_text("abc\\udc80")
    Traceback (most recent call last):
    ValueError: prompt is not valid UTF-8 text (lone surrogate at index 3)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid UTF-8 text (lone surrogate at index {e.start})"
        ) from None
    return text


def as_conversations(messages: Conversation | Sequence[Conversation]) -> list[list[Message]]:
    """One conversation (a list of {"role", "content"} dicts) or a list of them, checked, as a
    list of conversations; a ValueError names the first bad message by its index.

    >>> as_conversations([{"role": "user", "content": "hi"}])
    [[{'role': 'user', 'content': 'hi'}]]
    """
    if isinstance(messages, str | bytes | bytearray | Mapping) or not isinstance(
        messages, Sequence
    ):
        raise ValueError(
            "messages must be a list of {'role': ..., 'content': ...} dicts (one conversation) "
            f"or a list of such lists; got {type(messages).__name__}"
        )
    if messages and all(_is_list(c) for c in messages):
        return [check_conversation(c, f"conversation {i}") for i, c in enumerate(messages)]
    return [check_conversation(messages)]


def _is_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)


def check_conversation(conversation: Conversation, where: str = "") -> list[Message]:
    """The messages of one conversation as a list, after checking each (see check_message).

    >>> check_conversation([{"role": "robot", "content": "hi"}])
    Traceback (most recent call last):
    ValueError: message 0 has role 'robot'; allowed roles: system, user, assistant, tool
    """
    prefix = f"{where}: " if where else ""
    if not _is_list(conversation):
        raise ValueError(f"{prefix}a conversation must be a list of message dicts")
    if not conversation:
        raise ValueError(f"{prefix}the conversation is empty; give at least one message")
    for i, message in enumerate(conversation):
        check_message(message, f"{prefix}message {i}")
    return list(conversation)


def check_message(message: object, name: str = "message") -> None:
    """Raise a ValueError unless `message` is a dict with an allowed role and string content
    (other keys, e.g. "name", pass through to the template)."""
    if not isinstance(message, Mapping):
        raise ValueError(
            f"{name} must be a dict with 'role' and 'content', got {type(message).__name__}"
        )
    if "role" not in message:
        raise ValueError(f"{name} has no 'role'; allowed roles: {', '.join(ROLES)}")
    if message["role"] not in ROLES:
        raise ValueError(f"{name} has role {message['role']!r}; allowed roles: {', '.join(ROLES)}")
    if "content" not in message:
        raise ValueError(f"{name} has no 'content'; give its text as a string")
    content = message["content"]
    if not isinstance(content, str):
        raise ValueError(f"{name} content must be a string, got {type(content).__name__}")
    check_text(content, f"{name} content")


def require_chat_template(tokenizer: Any, model_name: str) -> None:
    """Raise a ValueError when the Hugging Face tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"model {model_name} has no chat template; use generate() with a plain prompt"
        )


class TemplateKwargsError(ValueError):
    """A chat_template_kwargs entry that is refused; `key` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def check_template_kwargs(
    template_kwargs: Mapping[str, Any] | None, allowed: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The template variables as a dict, unless one is a reserved name (RESERVED_TEMPLATE_NAMES,
    less `allowed`): then a TemplateKwargsError names it.

    >>> check_template_kwargs({"enable_thinking": False})
    {'enable_thinking': False}
    >>> check_template_kwargs({"tokenize": True})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    verispec.types.chat.TemplateKwargsError: chat_template_kwargs must not set 'tokenize': ...
    """
    if template_kwargs is not None and not isinstance(template_kwargs, Mapping):
        raise ValueError(
            f"chat_template_kwargs must be a dict, got {type(template_kwargs).__name__}"
        )
    kwargs = dict(template_kwargs or {})
    for key in kwargs:
        if key in RESERVED_TEMPLATE_NAMES and key not in allowed:
            raise TemplateKwargsError(key, f"chat_template_kwargs must not set {key!r}: "
                                      f"{_why_reserved(key)}")  # fmt: skip
    return kwargs


def _why_reserved(key: str) -> str:
    if key == "tools":
        return "give tools in the request's tools field"
    if key == "chat_template":
        return "the model's own chat template renders the messages"
    return "the template call sets it itself"


def chat_prompt(
    tokenizer: Any,
    conversation: Conversation,
    model_name: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[str, list[int]]:
    """(text, token ids) of a checked conversation rendered by the model's chat template,
    ending with the assistant's generation prompt. The template writes its own special tokens
    (BOS among them), so the text is tokenized without adding any: no second BOS. A reserved
    template variable is a ValueError (check_template_kwargs), as is any failure of the
    template with these messages and variables."""
    require_chat_template(tokenizer, model_name)
    text = render_chat(tokenizer, conversation, model_name, check_template_kwargs(template_kwargs))
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def render_chat(
    tokenizer: Any,
    conversation: Conversation,
    model_name: str,
    kwargs: Mapping[str, Any],
    add_generation_prompt: bool = True,
) -> str:
    """The text of a conversation rendered by the model's chat template, with the generation
    prompt unless told otherwise (a count of the conversation alone); any exception of the
    template (it runs on the caller's messages and variables) is a ValueError saying so."""
    try:
        return tokenizer.apply_chat_template(list(conversation), tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             **kwargs)  # fmt: skip
    except Exception as e:
        raise ValueError(f"the chat template of model {model_name} refused the messages: "
                         f"{_exception_text(e)}") from e  # fmt: skip


def _exception_text(error: Exception) -> str:
    """A template's error as its message (Jinja's own errors) or its type and message."""
    from jinja2 import TemplateError

    if isinstance(error, TemplateError):
        return str(error)
    return f"{type(error).__name__}: {error}"
