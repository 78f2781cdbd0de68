"""What one request may ask of the server (ServerLimits), and BodyLimit: the ASGI middleware that
answers a body over the size limit with a 413 in OpenAI's schema, from its Content-Length before
the app reads it, or as soon as its chunks add up to more."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.serve.errors import APIError

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
"""A body may have at most 16 MiB (`--max-request-bytes`)."""
DEFAULT_MAX_SEQUENCES_PER_REQUEST = 64
"""One request may queue at most 64 sequences, prompts x n (`--max-sequences-per-request`)."""
DRAIN_BYTES = 64 * 2**20
"""How much of a refused body is read and dropped before the 413 (see BodyLimit)."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds on one request, so that no client can fill the server's memory or queue alone."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest request body in bytes; a larger one is a 413."""
    max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST
    """Most sequences (prompts x n) one request may queue; more is a 400."""

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_sequences_per_request"):
            value = getattr(self, name)
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


class BodyLimit:
    """ASGI middleware refusing request bodies over `max_bytes` (a declared Content-Length at
    once, a chunked body once what arrived exceeds it); the app never holds more. The rest of a
    refused body is read and dropped (up to DRAIN_BYTES) before the answer: a server that closes
    a connection with unread data resets it, and the client then sees the reset instead of the
    413. A client that asked `Expect: 100-continue` has sent nothing yet and is answered at
    once."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _drain(scope, receive, 0)
            error = BodyTooLarge(self.max_bytes, int(declared))
            await _error_response(error)(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(scope, receive, received)
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except BodyTooLarge as e:  # read outside FastAPI's error handlers
            if started:
                raise
            await _error_response(e)(scope, receive, send)


def _error_response(error: BodyTooLarge) -> ASGIApp:
    return APIError(413, str(error.detail), code="request_too_large").response()


async def _drain(scope: Scope, receive: Receive, received: int) -> None:
    """Read and drop the rest of a body (DRAIN_BYTES at most) unless the client waits for a
    100 Continue before sending it."""
    if (_header(scope, b"expect") or "").lower() == "100-continue" and not received:
        return
    while received <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1").strip()
    return None
