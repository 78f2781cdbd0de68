"""Errors in OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 for a bad field
or body (never FastAPI's 422), 401 for a missing or wrong API key, 404 for an unknown route, 500
for a failed engine step or an unexpected exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from verispec.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
)


class APIError(Exception):
    """An error answered in OpenAI's schema."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind,
        )  # fmt: skip

    def response(self) -> JSONResponse:
        info = ErrorInfo(message=self.message, type=self.kind, param=self.param, code=self.code)
        return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=self.status)


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error, FastAPI's and Starlette's included, in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return _validation_error(e.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 404:
            return APIError(404, "no such route; see /docs for the API", code="not_found"
                            ).response()  # fmt: skip
        if e.status_code == 405:
            return APIError(405, f"method not allowed: {e.detail}", code="method_not_allowed"
                            ).response()  # fmt: skip
        return APIError(e.status_code, str(e.detail)).response()

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"
                        ).response()  # fmt: skip


def _validation_error(errors: Sequence[Any]) -> APIError:
    """The first of pydantic's errors as a 400 naming the field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        ctx = first.get("ctx", {})
        return APIError(400, f"the body is not valid JSON: {ctx.get('error', first['msg'])}")
    if not loc:
        return APIError(400, f"the body must be a JSON object of the request's fields: "
                        f"{first['msg']}")  # fmt: skip
    # a union's member tags ('str', 'list[int]', 'StreamOptions') follow a field in loc
    path = [loc[0], *(x for x in loc[1:] if x.isdigit() or _is_field_name(x))]
    param = ".".join(path)
    if kind == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}: this server does not take it (its "
                        "fields: GET /docs)", param)  # fmt: skip
    if kind == "missing":
        return APIError(400, f"{param} is required", param)
    return APIError(400, f"{param}: {first['msg']}", param)


def _is_field_name(part: str) -> bool:
    """Whether a part of pydantic's error location names a field (not a union member's type).

    >>> [p for p in ("str", "list[int]", "StreamOptions", "usage") if _is_field_name(p)]
    ['usage']
    """
    return part.isidentifier() and part not in _TYPE_TAGS and not part[0].isupper()


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
FIELD_NAMES = frozenset(
    {*CompletionRequest.model_fields, *ChatCompletionRequest.model_fields, "role", "content",
     "include_usage", "type", "text", "name"}
)  # fmt: skip
"""The request fields an error may name as its param."""
