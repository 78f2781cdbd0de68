"""A chat request's template variables and rendered prompt, within bounds.

`chat_template_kwargs` holds JSON values only (no NaN), nested at most MAX_KWARGS_DEPTH deep and
MAX_KWARGS_CHARS long as JSON, and no name the template call reserves (verispec/types/chat.py):
`chat_template` only on a server started with `--trust-request-chat-template`. The rendered
prompt may have at most ServerLimits.prompt_bytes(max_model_len) bytes, checked before it is
tokenized; a request's own template renders in a worker process (serve/template_workers.py),
whose answers become the errors here.
"""

from __future__ import annotations

import math
from typing import Any

from verispec.serve.errors import APIError
from verispec.serve.template_workers import TemplateTimeout, TemplateWorkers, WorkersBusy
from verispec.types.chat import TemplateKwargsError, check_template_kwargs

MAX_KWARGS_DEPTH = 16
"""How deep chat_template_kwargs' values may nest (a top-level value is depth 1)."""
MAX_KWARGS_CHARS = 64 * 1024
"""How long chat_template_kwargs may be as JSON, in characters: template variables are flags
and short texts; the conversation belongs in messages."""
FIELD = "chat_template_kwargs"


def template_kwargs(kwargs: dict[str, Any] | None, trust_templates: bool) -> dict[str, Any]:
    """A request's template variables, checked; a 400 names the first refused key."""
    allowed = frozenset({"chat_template"}) if trust_templates else frozenset()
    try:
        checked = check_template_kwargs(kwargs, allowed)
    except TemplateKwargsError as e:
        message = str(e)
        if e.key == "chat_template":
            message += ("; this server does not run templates sent by clients (its operator "
                        "can allow them: --trust-request-chat-template)")  # fmt: skip
        raise APIError(400, message, f"{FIELD}.{e.key}") from None
    size = 2
    for key, value in checked.items():
        size += len(key) + 4 + _json_size(key, value, MAX_KWARGS_CHARS - size)
    template = checked.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise APIError(400, f"{FIELD}.chat_template must be a string (a Jinja template), got "
                       f"{_json_kind(template)}", f"{FIELD}.chat_template")  # fmt: skip
    return checked


def _json_size(key: str, value: Any, room: int) -> int:
    """About how many characters `value` takes as JSON; a 400 naming the key when it is not a
    JSON value, nests deeper than MAX_KWARGS_DEPTH or takes more than `room` (walked with a
    stack, not by recursion: a value nested thousands deep must not exhaust Python's)."""
    param = f"{FIELD}.{key}"
    size = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_KWARGS_DEPTH:
            raise APIError(400, f"{param} nests deeper than {MAX_KWARGS_DEPTH} levels; "
                           f"template variables may nest at most {MAX_KWARGS_DEPTH} deep",
                           param)  # fmt: skip
        if isinstance(item, dict):
            size += 2 + sum(len(k) + 4 for k in item if isinstance(k, str))
            if not all(isinstance(k, str) for k in item):
                raise APIError(400, f"{param}: object keys must be strings", param)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            size += 2 + len(item)
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            size += len(item) + 2
        elif item is None or isinstance(item, bool):
            size += 5
        elif isinstance(item, int):
            size += item.bit_length() // 3 + 1
        elif isinstance(item, float) and math.isfinite(item):
            size += 24
        else:
            raise APIError(400, f"{param} must hold JSON values only (objects, arrays, strings, "
                           f"finite numbers, booleans, null); got {_json_kind(item)}",
                           param)  # fmt: skip
        if size > room:
            raise APIError(400, f"{FIELD} is longer than {MAX_KWARGS_CHARS} characters as JSON "
                           f"(at {param}); template variables are flags and short texts, the "
                           "conversation belongs in messages", param)  # fmt: skip
    return size


def _json_kind(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return type(value).__name__


def text_bytes(text: str) -> int:
    """A text's size in UTF-8 bytes (an ASCII text's length, which Python knows at once)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def prompt_too_large(size: int, cap: int, max_model_len: int) -> APIError:
    """The 413 of a rendered prompt of `size` bytes over the cap."""
    return APIError(413, f"the rendered prompt has {size} bytes; this server renders at most "
                    f"{cap} bytes for its {max_model_len}-token context (verispec serve "
                    "--max-prompt-bytes); shorten the messages", "messages",
                    "prompt_too_large")  # fmt: skip


async def render_request_template(
    workers: TemplateWorkers, request: dict[str, Any], max_model_len: int
) -> str:
    """A request's own template rendered by a worker (`request` as serve/template_worker.py
    reads it), or the 4xx that says why not."""
    param = f"{FIELD}.chat_template"
    try:
        answer = await workers.render(request)
    except TemplateTimeout:
        raise APIError(400, f"{param} took longer than {workers.timeout_s:g} s to render "
                       "(verispec serve --template-timeout); it was stopped", param,
                       "template_timeout") from None  # fmt: skip
    except WorkersBusy:
        raise APIError(429, "every template worker is busy rendering other requests' "
                       "templates; retry later", param, "template_workers_busy"
                       ) from None  # fmt: skip
    if "text" in answer:
        return answer["text"]
    if "too_large" in answer:
        raise prompt_too_large(answer["too_large"], request["max_bytes"], max_model_len)
    if answer.get("out_of_memory"):
        raise APIError(413, f"{param} needed more than {workers.memory_bytes // 2**20} MiB to "
                       "render; it was stopped", param, "template_memory_exceeded")  # fmt: skip
    raise APIError(400, f"{param} failed to render these messages: {answer.get('error')}", param)
