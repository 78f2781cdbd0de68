"""Shared by the server's tests: the speculative LLM a test server runs, one HTTP request as
(status, body), an error's check against OpenAI's schema, and polling until the server is idle
again."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verispec import LLM, SpecConfig
from verispec.serve import Server


def speculative_llm(chat_pair: tuple[Path, Path], adaptive: bool = False, **options) -> LLM:
    """The target with its draft model, k = 4 (up to 4 when adaptive), batch-invariant (greedy
    output equals plain)."""
    target, draft = chat_pair
    spec = SpecConfig(method="draft_model", model=str(draft), num_speculative_tokens=4,
                      adaptive=adaptive)  # fmt: skip
    return LLM(model=str(target), speculative=spec, batch_invariant=True, **options)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll condition until it holds; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def blocks_free(server: Server) -> bool:
    """Every KV block of the target and of the draft model is back in its allocator."""
    engine = server.engine.engine
    allocators = [engine.allocator]
    draft = getattr(engine.proposer, "paged", None)
    if draft is not None:
        allocators.append(draft.allocator)
    return all(a.num_used == 0 for a in allocators)


def call(
    url: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
    method: str | None = None, raw: bytes | None = None,
) -> tuple[int, Any]:  # fmt: skip
    """(status, parsed JSON or text) of one HTTP request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def assert_error(status: int, body: Any, expected_status: int, param: str | None = None) -> None:
    """The answer is an error of this status in OpenAI's schema (naming param when given)."""
    assert status == expected_status, body
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and isinstance(body["error"]["type"], str)
    if param is not None:
        assert body["error"]["param"] == param, body
