"""Errors in OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 for a bad field
or body (never FastAPI's 422), 401 for a missing or wrong API key, 404 for an unknown route, 408
for a body that did not arrive in time, 413 for a body or a rendered prompt over its size limit,
415 for a body that is not sent as JSON, 429 when the template workers are all busy, 500 for a
failed engine step or an unexpected exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from email.message import Message
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from verispec.serve.protocol import ChatCompletionRequest, CompletionRequest
from verispec.serve.responses import ErrorInfo, ErrorResponse


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
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(e.errors(), request.headers.get("content-type"),
                                request.url.path).response()  # fmt: skip

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 404:
            return APIError(404, "no such route; see /docs for the API", code="not_found"
                            ).response()  # fmt: skip
        if e.status_code == 405:
            return APIError(405, f"method not allowed: {e.detail}", code="method_not_allowed"
                            ).response()  # fmt: skip
        if e.status_code in (408, 413):
            return body_refused(e.status_code, str(e.detail))
        return APIError(e.status_code, str(e.detail)).response()

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"
                        ).response()  # fmt: skip


def validation_error(
    errors: Sequence[Any], content_type: str | None = None, path: str = ""
) -> APIError:
    """The first of pydantic's errors as a 400 naming the field (a 415 when the body was not
    sent as JSON, which is why it did not parse as an object)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        ctx = first.get("ctx", {})
        return APIError(400, f"the body is not valid JSON: {ctx.get('error', first['msg'])}")
    if not loc and kind == "missing":
        example = _EXAMPLES.get(path.rstrip("/"), "")
        return APIError(400, "the body is empty; send a JSON object with the request's fields"
                        + (f", e.g. {example}" if example else ""))  # fmt: skip
    if not loc and not _is_json(content_type):
        got = f"got {content_type!r}" if content_type else "the request has no Content-Type"
        return APIError(415, "the body must be a JSON object sent with 'Content-Type: "
                        f"application/json' ({got})", code="unsupported_media_type")  # fmt: skip
    if not loc:
        return APIError(400, f"the body must be a JSON object of the request's fields: "
                        f"{first['msg']}")  # fmt: skip
    # a union's member tags ('str', 'list[int]', 'StreamOptions') follow a field in loc
    fields = [x for x in loc[1:] if x.isdigit() or _is_field_name(x)]
    param = ".".join([loc[0], *fields])
    if kind == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}: this server does not take it (its "
                        "fields: GET /docs)", param)  # fmt: skip
    if kind == "missing":
        return APIError(400, f"{param} is required", param)
    if kind == "finite_number":
        return APIError(400, f"{param} must be a finite number, got {first.get('input')}", param)
    if len(fields) < len(loc) - 1:  # a value none of a union's forms took
        union = _union_error(errors, loc)
        if union is not None:
            return union
    return APIError(400, f"{param}: {first['msg']}", param)


def _union_error(errors: Sequence[Any], loc: list[str]) -> APIError | None:
    """A union field's error as what the field allows (pydantic's first error reads as if only
    its first form were allowed); None for a union this module has no words for."""
    tag = next(i for i, x in enumerate(loc) if not (x.isdigit() or _is_field_name(x)))
    field, param = loc[tag - 1], ".".join(loc[:tag])
    forms = _UNION_FORMS.get(field)
    if forms is None:
        return None
    prefix = loc[:tag]
    for error in errors:  # a content part of a type this server does not take, say image_url
        at = [str(x) for x in error.get("loc", ()) if x != "body"]
        if (field == "content" and at[:tag] == prefix and at[-1] == "type"
                and error.get("type") == "literal_error"):  # fmt: skip
            return APIError(400, f"{param}: content parts must be {{\"type\": \"text\", "
                            f"\"text\": ...}}; {error.get('input')!r} parts are not supported",
                            param)  # fmt: skip
    return APIError(400, f"{param} must be {forms}", param)


def _is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header names JSON (application/json or application/*+json)."""
    if not content_type:
        return False
    header = Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


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
_UNION_FORMS = {
    "prompt": "a string, a list of strings, a list of token ids or a list of lists of token ids",
    "content": 'a string or a list of {"type": "text", "text": ...} parts (text only)',
    "stop": "a string or a list of strings",
    "input": "a string or a list of items (objects: messages, function_call, "
    "function_call_output)",
}
"""What a union field allows, in words."""
_EXAMPLES = {
    "/v1/completions": '{"prompt": "Once upon a time", "max_tokens": 16}',
    "/v1/chat/completions": '{"messages": [{"role": "user", "content": "Hi"}]}',
    "/v1/responses": '{"input": "Hi"}',
}
"""A minimal body of each generation route, quoted when the body is empty."""


def body_refused(status: int, detail: str) -> JSONResponse:
    """The 408 (body too slow) or 413 (too large) of a refused request body, with
    `Connection: close`: the rest of the body may still be on its way, so the connection
    cannot carry another request (without the header the server would wait on it)."""
    code = "request_timeout" if status == 408 else "request_too_large"
    response = APIError(status, detail, code=code).response()
    response.headers["connection"] = "close"
    return response
