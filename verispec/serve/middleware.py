"""The ASGI layers around the API, outermost first: a trailing slash dropped, HEAD served as
GET, CORS (only for the origins the operator names), the API key checked before the body is
read (on /v1, /tokenize and /detokenize), and the body's size and time limits
(serve/limits.py)."""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Sequence

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.serve.errors import APIError
from verispec.serve.limits import BodyLimit, ServerLimits, drain, header

GUARDED = ("/v1", "/tokenize", "/detokenize")
"""The paths (and those under them) the API key guards: the API's; the pages, /health and
/metrics stay open."""
ORIGIN = re.compile(r"https?://[^/\s]+")
"""An origin as browsers send it: scheme and host, with a port or not, and no path."""


def check_origins(origins: Sequence[str]) -> list[str]:
    """The CORS origins as a list; a ValueError names one that no browser would send.

    >>> check_origins(["http://localhost:3000", "*"])
    ['http://localhost:3000', '*']
    >>> check_origins(["localhost:3000/"])
    Traceback (most recent call last):
    ValueError: allowed origin 'localhost:3000/' is not an origin: give scheme://host[:port] \
(no path), e.g. http://localhost:3000, or * for any
    """
    if isinstance(origins, str):
        raise ValueError("allowed origins must be a list of origins, not one string")
    for origin in origins:
        if origin != "*" and not ORIGIN.fullmatch(origin):
            raise ValueError(f"allowed origin {origin!r} is not an origin: give "
                             "scheme://host[:port] (no path), e.g. http://localhost:3000, or * "
                             "for any")  # fmt: skip
    return list(origins)


def add_layers(
    app: FastAPI, api_key: str | None, limits: ServerLimits, allowed_origins: Sequence[str]
) -> None:
    """Wrap the app in its layers (Starlette runs the last added first)."""
    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes,
                       timeout_s=limits.body_timeout_s)  # fmt: skip
    if api_key is not None:
        app.add_middleware(ApiKey, api_key=api_key, timeout_s=limits.body_timeout_s)
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=check_origins(allowed_origins),
                           allow_methods=["GET", "HEAD", "POST", "OPTIONS"], max_age=600,
                           allow_headers=["Authorization", "Content-Type"])  # fmt: skip
    app.add_middleware(HeadAsGet)
    app.add_middleware(TrailingSlash)


class TrailingSlash:
    """ASGI middleware serving /v1/completions/ as /v1/completions (clients that add a slash get
    the answer, not a redirect they may not follow with the body)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.app(scope, receive, send)


class HeadAsGet:
    """ASGI middleware answering HEAD as GET without the body (its headers, Content-Length
    included, as GET's), so that every route served to GET is served to HEAD."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)


class ApiKey:
    """ASGI middleware answering a request to a GUARDED path without `Authorization: Bearer
    KEY` with a 401 from its headers, before its body is read or parsed (the body is dropped
    unread, as BodyLimit drops a refused one, so the client gets the 401 rather than a reset).
    The key is compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str, timeout_s: float) -> None:
        self.app = app
        self.key = api_key.encode()
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        guarded = scope["type"] == "http" and any(
            path == p or path.startswith(p + "/") for p in GUARDED
        )
        if not guarded or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await drain(scope, receive, 0, time.monotonic() + self.timeout_s)
        error = APIError(401, "missing or invalid API key: send 'Authorization: Bearer KEY'",
                         code="invalid_api_key")  # fmt: skip
        await error.response()(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        scheme, _, token = (header(scope, b"authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("latin-1"), self.key
        )
