"""What one request may ask of the server (ServerLimits), and BodyLimit: the ASGI middleware that
answers a body over the size limit with a 413 in OpenAI's schema, from its Content-Length before
the app reads it, or as soon as its chunks add up to more, and a body that has not arrived whole
within the body timeout with a 408."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.serve.errors import body_refused

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
"""A body may have at most 16 MiB (`--max-request-bytes`)."""
DEFAULT_MAX_SEQUENCES_PER_REQUEST = 64
"""One request may queue at most 64 sequences, prompts x n (`--max-sequences-per-request`)."""
DEFAULT_BODY_TIMEOUT_S = 30.0
"""A body must arrive whole within 30 s of its request (`--body-timeout`): 16 MiB at 0.6 MB/s."""
PROMPT_BYTES_PER_TOKEN = 64
"""The rendered chat prompt may have 64 bytes per token of the context: text averages 3-5 bytes
a token, and runs of blanks or symbols rarely exceed 16, so only a prompt that could never fit
the context is refused by size, before it is tokenized."""
DEFAULT_TEMPLATE_TIMEOUT_S = 2.0
"""A request's own chat template (`--trust-request-chat-template`) may render for 2 s."""
DEFAULT_TEMPLATE_MEMORY_BYTES = 512 * 2**20
"""A request's own chat template may use 512 MiB beyond its worker process's own."""
DRAIN_BYTES = 64 * 2**20
"""How much of a refused body is read and dropped before the 413 (see BodyLimit)."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds on one request, so that no client can fill the server's memory, queue or workers
    alone."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest request body in bytes; a larger one is a 413."""
    max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST
    """Most sequences (prompts x n) one request may queue; more is a 400."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """Seconds a body may take to arrive whole, from its request's headers; slower is a 408."""
    max_prompt_bytes: int | None = None
    """Largest rendered chat prompt in bytes (a 413 before it is tokenized); None:
    PROMPT_BYTES_PER_TOKEN x the model's context length."""
    trust_request_chat_template: bool = False
    """Let a request set `chat_template` in chat_template_kwargs (rendered in a worker process
    under template_timeout_s and template_memory_bytes); off, it is a 400."""
    template_timeout_s: float = DEFAULT_TEMPLATE_TIMEOUT_S
    """Seconds a request's own template may render; longer is a 400 (its worker is killed)."""
    template_memory_bytes: int = DEFAULT_TEMPLATE_MEMORY_BYTES
    """Memory a request's own template may take to render; more is a 413."""
    template_workers: int = 2
    """Worker processes rendering requests' own templates, each one template at a time."""

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_sequences_per_request", "template_memory_bytes",
                     "template_workers"):  # fmt: skip
            _require_positive_int(name, getattr(self, name))
        if self.max_prompt_bytes is not None:
            _require_positive_int("max_prompt_bytes", self.max_prompt_bytes)
        for name in ("body_timeout_s", "template_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and value > 0
            ):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if not isinstance(self.trust_request_chat_template, bool):
            raise ValueError("trust_request_chat_template must be a bool, got "
                             f"{self.trust_request_chat_template!r}")  # fmt: skip

    def prompt_bytes(self, max_model_len: int) -> int:
        """The cap on a rendered chat prompt's size for a model of this context length."""
        if self.max_prompt_bytes is not None:
            return self.max_prompt_bytes
        return PROMPT_BYTES_PER_TOKEN * max_model_len


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class BodyTooLarge(HTTPException):
    """A body over the limit; raised from `receive` so that FastAPI's body reading passes it on
    to the error handlers (serve/errors.py) as the 413 it is."""

    def __init__(self, limit: int, size: int | None = None) -> None:
        if size is not None:
            message = f"the request body has {size} bytes; this server takes at most {limit}"
        else:
            message = f"the request body exceeds {limit} bytes, the most this server takes"
        super().__init__(413, f"{message} (verispec serve --max-request-bytes)")


class BodyTimeout(HTTPException):
    """A body that did not arrive whole in time; raised from `receive` as BodyTooLarge is."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"the request body did not arrive whole within {timeout_s:g} s; "
                         "send it faster or in one piece (verispec serve --body-timeout)")


class BodyLimit:
    """ASGI middleware refusing request bodies over `max_bytes` (a declared Content-Length at
    once, a chunked body once what arrived exceeds it); the app never holds more. The rest of a
    refused body is read and dropped (up to DRAIN_BYTES) before the answer: a server that closes
    a connection with unread data resets it, and the client then sees the reset instead of the
    413. A client that asked `Expect: 100-continue` has sent nothing yet and is answered at
    once. A body still incomplete `timeout_s` after the request began is a 408 (a client
    sending a byte at a time holds a connection and a worker no longer)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await drain(scope, receive, 0, deadline)
            error = BodyTooLarge(self.max_bytes, int(declared))
            await body_refused(error.status_code, str(error.detail))(scope, receive, send)
            return
        received = 0
        complete = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:  # the body is in: later messages are the disconnect, never late
                return await receive()
            message = await receive_before(receive, deadline, self.timeout_s)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_bytes:
                    if not complete:
                        await drain(scope, receive, received, deadline)
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except (BodyTooLarge, BodyTimeout) as e:  # read outside FastAPI's error handlers
            if started:
                raise
            await body_refused(e.status_code, str(e.detail))(scope, receive, send)


async def receive_before(receive: Receive, deadline: float, timeout_s: float) -> Message:
    """The next ASGI message, or a BodyTimeout once the deadline (time.monotonic) has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise BodyTimeout(timeout_s)
    try:
        return await asyncio.wait_for(receive(), remaining)
    except TimeoutError:
        raise BodyTimeout(timeout_s) from None


async def drain(scope: Scope, receive: Receive, received: int, deadline: float) -> None:
    """Read and drop the rest of a body (DRAIN_BYTES at most, until the deadline) unless the
    client waits for a 100 Continue before sending it."""
    if (header(scope, b"expect") or "").lower() == "100-continue" and not received:
        return
    while received <= DRAIN_BYTES:
        try:
            message = await receive_before(receive, deadline, 0.0)
        except BodyTimeout:
            return
        if message["type"] != "http.request":
            return
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (the first, latin-1 as HTTP sends it), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1").strip()
    return None
