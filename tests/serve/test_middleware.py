"""The layers around the API (serve/middleware.py): the API key checked before the body is read,
HEAD served wherever GET is, CORS only for the origins the operator names, and /docs served
from the server itself."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.serving import assert_error, call
from verispec import LLM
from verispec.serve import Server
from verispec.serve.middleware import check_origins

pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "s3cret"
ORIGIN = "http://app.example:3000"
GET_ROUTES = ["/", "/health", "/metrics", "/v1/models", "/docs", "/openapi.json"]


@pytest.fixture(scope="module")
def guarded(chat_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The target alone, with an API key, serving one browser origin."""
    llm = LLM(model=str(chat_pair[0]))
    with Server(llm.engine, port=0, api_key=KEY, allowed_origins=[ORIGIN]) as s:
        yield s


def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """What the server answers to a request written by hand (its status line and headers)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        return sock.recv(65536)


def test_a_malformed_body_without_a_key_is_a_401(guarded: Server) -> None:
    """It was a 400: the body was parsed before the key was checked."""
    status, body = call(guarded.url, "/v1/chat/completions", raw=b"{not json", method="POST")
    assert_error(status, body, 401)
    assert body["error"]["code"] == "invalid_api_key"


def test_the_key_is_checked_before_the_body_is_read(guarded: Server) -> None:
    """A client that waits for '100 Continue' before sending its 10 MB body gets the 401 with
    nothing sent; one that sends it whole gets the 401, not a reset connection."""
    answer = raw_request(guarded.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 10000000\r\n"
                         b"Expect: 100-continue\r\n\r\n")  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 401"), answer
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 10_000_000}]}).encode()
    assert_error(*call(guarded.url, "/v1/chat/completions", raw=big, method="POST"), 401)
    ok = {"Authorization": f"Bearer {KEY}"}
    assert call(guarded.url, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, ok)[0] == 200


@pytest.mark.parametrize("path", GET_ROUTES)
def test_head_is_served_wherever_get_is(guarded: Server, path: str) -> None:
    """HEAD /v1/models was a 405."""
    headers = {"Authorization": f"Bearer {KEY}"}
    get = urllib.request.Request(guarded.url + path, headers=headers)
    with urllib.request.urlopen(get, timeout=30) as response:
        length = len(response.read())
    head = urllib.request.Request(guarded.url + path, headers=headers, method="HEAD")
    with urllib.request.urlopen(head, timeout=30) as response:
        assert response.status == 200
        assert response.read() == b""
        if path != "/metrics":  # the metrics move between the two requests
            assert int(response.headers["Content-Length"]) == length
    assert call(guarded.url, "/v1/chat/completions", method="HEAD", headers=headers)[0] == 405


def preflight(url: str, origin: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url + "/v1/chat/completions", method="OPTIONS", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}


def test_cors_is_off_unless_origins_are_named(server: Server, guarded: Server) -> None:
    """A preflight was a 405 everywhere; now it is answered for the named origins only."""
    status, headers = preflight(guarded.url, ORIGIN)
    assert status == 200
    assert headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"].lower()
    status, headers = preflight(guarded.url, "http://elsewhere.example")
    assert status == 400 and "access-control-allow-origin" not in headers
    request = urllib.request.Request(guarded.url + "/health", headers={"Origin": ORIGIN})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    status, headers = preflight(server.url, ORIGIN)  # no origins named: no CORS
    assert status == 405 and "access-control-allow-origin" not in headers


@pytest.mark.parametrize("origins", [["localhost:3000"], ["http://a.example/"], "http://a.b"])
def test_an_origin_no_browser_sends_is_refused(origins: list[str]) -> None:
    with pytest.raises(ValueError, match="allowed origin"):
        check_origins(origins)


def test_docs_load_nothing_from_elsewhere(server: Server) -> None:
    """/docs was FastAPI's Swagger UI, whose scripts and styles come from a CDN."""
    status, page = call(server.url, "/docs")
    assert status == 200 and "<title>verispec API</title>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), page
    assert not re.search(r"@import|url\(", page)
    assert "openapi.json" in page
    status, spec = call(server.url, "/openapi.json")
    assert status == 200 and "/v1/chat/completions" in spec["paths"]
    assert_error(*call(server.url, "/redoc"), 404)
