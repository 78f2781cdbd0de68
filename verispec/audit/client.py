"""A small client of a running `verispec serve` for `verispec verify --server`, on the standard
library's urllib (no extra dependency): JSON requests, Server-Sent Event streams, and every
failure as one ServerError line."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any


class ServerError(ValueError):
    """The server could not be reached or refused a request (status 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ServerClient:
    """POSTs to one server's OpenAI-compatible routes."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"--server must be an http(s) URL such as http://127.0.0.1:8000, "
                             f"got {url!r}")  # fmt: skip
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.timeout = timeout

    def get(self, route: str) -> Any:
        with self._open(route, None) as response:
            return json.load(response)

    def post(self, route: str, body: dict[str, Any]) -> Any:
        with self._open(route, body) as response:
            return json.load(response)

    def stream(self, route: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The events of a streamed request, parsed; closing the iterator early closes the
        connection, which the server answers by aborting the request."""
        with self._open(route, {**body, "stream": True}) as response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise ServerError(500, f"the server failed mid-stream: "
                                      f"{event['error'].get('message')}")  # fmt: skip
                yield event

    def _open(self, route: str, body: dict[str, Any] | None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + route, data=data, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise ServerError(e.code, f"{self.url}{route} answered {e.code}: "
                              f"{_error_message(e)}") from None  # fmt: skip
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerError(0, f"cannot reach {self.url}: {reason}") from None


def _error_message(error: urllib.error.HTTPError) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    body = error.read().decode("utf-8", "replace")
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200] or str(error.reason)
