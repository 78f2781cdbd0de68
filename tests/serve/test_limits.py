"""The limits on one request: a body over --max-request-bytes is a 413 in OpenAI's schema
(declared or chunked), a body still arriving after --body-timeout a 408, prompts x n over
--max-sequences-per-request a 400 naming them, and a large body is tokenized off the event
loop, so /health answers meanwhile."""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.serving import assert_error, call
from verispec import LLM
from verispec.serve import Server, ServerLimits
from verispec.types.chat import chat_prompt

pytestmark = pytest.mark.usefixtures("one_thread")

LIMIT = 4096
BODY_TIMEOUT_S = 1.0


def completion(**fields: Any) -> dict[str, Any]:
    return {"prompt": "def f():", "max_tokens": 2, **fields}


@pytest.fixture(scope="module")
def small(chat_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The target alone (no drafts), with small limits."""
    limits = ServerLimits(max_request_bytes=LIMIT, max_sequences_per_request=6,
                          body_timeout_s=BODY_TIMEOUT_S)  # fmt: skip
    with Server(LLM(model=str(chat_pair[0])).engine, port=0, limits=limits) as s:
        yield s


def post(url: str, body: bytes, chunked: bool = False) -> tuple[int, Any]:
    """(status, JSON) of a POST to /v1/completions; chunked: no Content-Length, 1 KB chunks."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Content-Type": "application/json"}
    if chunked:
        chunks = (body[i : i + 1024] for i in range(0, len(body), 1024))
        conn.request("POST", "/v1/completions", chunks, headers, encode_chunked=True)
    else:
        conn.request("POST", "/v1/completions", body, headers)
    response = conn.getresponse()
    reply = response.status, json.loads(response.read())
    conn.close()
    return reply


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_in_openai_schema(small: Server, chunked: bool) -> None:
    within = json.dumps(completion(prompt="def f():", user="u" * (LIMIT - 100))).encode()
    assert len(within) <= LIMIT
    assert post(small.url, within, chunked)[0] == 200
    over = json.dumps(completion(prompt="def f():", user="u" * 2 * LIMIT)).encode()
    status, reply = post(small.url, over, chunked)
    assert_error(status, reply, 413)
    assert reply["error"]["code"] == "request_too_large"
    assert str(LIMIT) in reply["error"]["message"]
    assert "--max-request-bytes" in reply["error"]["message"]
    assert call(small.url, "/health")[0] == 200


def test_a_large_refused_body_is_answered_not_reset(small: Server) -> None:
    """urllib sends 'Connection: close' and the whole body before reading: the server reads and
    drops the rest, so the client gets the 413, not a connection reset. A client that waits
    for '100 Continue' gets the 413 without sending the body."""
    big = json.dumps(completion(user="u" * 20_000_000)).encode()
    status, reply = call(small.url, "/v1/completions", raw=big, method="POST")
    assert_error(status, reply, 413)
    host, port = small.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 5000000\r\nExpect: 100-continue"
                     b"\r\n\r\n")  # fmt: skip
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head


def test_a_slow_sender_gets_a_408_and_loses_its_connection(small: Server) -> None:
    """A byte every 0.2 s: the body is not whole after the timeout, so the server answers 408
    with `Connection: close` and closes the connection (there was no body-read timeout: it held
    on; and a 408 from the route's own read of the body left the connection waiting on it)."""
    host, port = small.url.removeprefix("http://").split(":")
    body = json.dumps(completion()).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        sock.settimeout(0.2)
        answer = b""
        for i in range(len(body)):
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                sock.sendall(body[i : i + 1])
        assert i < len(body) - 1  # answered before the body was complete
        sock.settimeout(30)
        while not answer.endswith(b"}"):
            answer += sock.recv(65536)
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:  # closed with bytes of the body it never read
            closed = True
        assert closed
    head, _, reply = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    error = json.loads(reply)["error"]
    assert error["code"] == "request_timeout" and "--body-timeout" in error["message"]
    assert call(small.url, "/health")[0] == 200


def test_prompts_times_n_over_the_cap_is_a_400_naming_them(small: Server) -> None:
    status, reply = call(small.url, "/v1/completions", completion(prompt=["a", "b"], n=4))
    assert_error(status, reply, 400, "n")
    assert "2 prompt(s) x n 4 = 8 sequences" in reply["error"]["message"]
    assert "at most 6" in reply["error"]["message"]
    status, reply = call(small.url, "/v1/completions", completion(prompt=[[5, 6]] * 7))
    assert_error(status, reply, 400, "prompt")
    status, reply = call(small.url, "/v1/completions", completion(prompt=["a", "b"], n=3))
    assert status == 200 and len(reply["choices"]) == 6


class SlowTokenizer:
    """The Rust tokenizer of a Hugging Face tokenizer, taking 2 s to encode (as a 10 MB prompt
    does) without holding the interpreter lock."""

    def __init__(self, real: Any, started: threading.Event) -> None:
        self.real, self.started = real, started

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.started.set()
        time.sleep(2.0)
        return self.real.encode_batch(*args, **kwargs)


def test_tokenizing_a_prompt_leaves_the_event_loop_free(
    small: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = small.engine.engine.tokenizer.hf
    started = threading.Event()
    monkeypatch.setattr(hf, "_tokenizer", SlowTokenizer(hf._tokenizer, started))
    result: list[int] = []
    body = json.dumps(completion(prompt="a large prompt")).encode()
    sender = threading.Thread(target=lambda: result.append(post(small.url, body)[0]))
    sender.start()
    assert started.wait(10)
    latencies = []
    while sender.is_alive() and len(latencies) < 20:
        t0 = time.perf_counter()
        assert call(small.url, "/health")[0] == 200
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.05)
    sender.join()
    assert result == [200]
    assert len(latencies) >= 5 and max(latencies) < 0.5, latencies
    assert statistics.median(latencies) < 0.1, latencies


@pytest.mark.parametrize("field", ["max_request_bytes", "max_sequences_per_request",
                                   "max_prompt_bytes", "template_memory_bytes",
                                   "template_workers"])  # fmt: skip
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_server_limits_must_be_positive_integers(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 1"):
        ServerLimits(**{field: value})


@pytest.mark.parametrize("field", ["body_timeout_s", "template_timeout_s"])
@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), True, "1"])
def test_server_time_limits_must_be_positive_seconds(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a number of seconds > 0"):
        ServerLimits(**{field: value})


def test_the_prompt_cap_follows_the_context_unless_given() -> None:
    assert ServerLimits().prompt_bytes(8192) == 64 * 8192
    assert ServerLimits(max_prompt_bytes=1000).prompt_bytes(8192) == 1000


def test_a_prompt_too_long_is_refused_with_its_exact_token_count(small: Server) -> None:
    """The count comes from the tokenizer's encoding, not from a list of ids: the same count."""
    text = "def f(x):\n    return x * 2  # é\n" * 40
    tokenizer = small.engine.engine.tokenizer
    status, reply = call(small.url, "/v1/completions", completion(prompt=text))
    assert_error(status, reply, 400, "prompt")
    assert f"the prompt has {len(tokenizer.encode(text))} tokens" in reply["error"]["message"]
    messages = [{"role": "user", "content": text}]
    _, ids = chat_prompt(tokenizer.hf, messages, "tiny")
    status, reply = call(small.url, "/v1/chat/completions", {"messages": messages})
    assert_error(status, reply, 400, "messages")
    assert f"the prompt has {len(ids)} tokens" in reply["error"]["message"]
    short = "def f(x):"
    status, reply = call(small.url, "/v1/completions",
                         completion(prompt=short, return_token_ids=True))  # fmt: skip
    assert reply["choices"][0]["prompt_token_ids"] == tokenizer.encode(short)
