"""Schema fuzzing with schemathesis: requests generated from the server's own OpenAPI description,
valid ones and invalid ones (wrong types, missing fields, out-of-range values), to every
operation it describes, never get a 5xx, and every error is in OpenAI's schema; chat also
against a model whose template takes tools, so generated tools, tool_choice, tool messages and
response formats reach the grammar and the engine. Every route the app serves, described or
not, also takes every method without a 5xx. Bounded: a few dozen examples per route and mode
(VERISPEC_SOAK=1: hundreds)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from tests.helpers.serving import speculative_llm
from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLES = 300 if os.environ.get("VERISPEC_SOAK") == "1" else 25
ROUTES = [("/v1/completions", "POST"), ("/v1/chat/completions", "POST"), ("/v1/responses", "POST"),
          ("/v1/models", "GET"), ("/v1/models/{model_id}", "GET"), ("/tokenize", "POST"),
          ("/detokenize", "POST"), ("/health", "GET")]  # fmt: skip


@pytest.fixture(scope="module")
def server(chat_pair):
    llm = speculative_llm(chat_pair, max_model_len=64)  # short answers even for large max_tokens
    with Server(llm.engine, port=0, model_name="tiny-chat") as s:
        yield s


@pytest.fixture(scope="module")
def tools_server(tools_pair):
    llm = speculative_llm(tools_pair, max_model_len=512)
    with Server(llm.engine, port=0, model_name="tiny-tools") as s:
        yield s


METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

CASES = [(path, method, mode) for path, method in ROUTES for mode in GenerationMode
         if method == "POST" or mode is GenerationMode.POSITIVE]  # a GET has nothing to break


@pytest.mark.parametrize(("path", "method", "mode"), CASES,
                         ids=[f"{m} {p} {g.value}" for p, m, g in CASES])  # fmt: skip
def test_no_5xx_and_every_error_in_openai_schema(server, path, method, mode) -> None:
    statuses = fuzz(server.url, path, method, mode)
    if mode is GenerationMode.NEGATIVE:
        assert any(400 <= s < 500 for s in statuses)  # invalid bodies were sent and refused
    elif method == "POST":
        assert 200 in statuses  # some generated requests were valid and answered


def test_the_fuzzed_routes_are_every_operation_the_schema_describes(server) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    described = {(op.path, op.method.upper()) for op in
                 (result.ok() for result in schema.get_all_operations())}  # fmt: skip
    assert described == set(ROUTES)


@pytest.mark.parametrize("method", METHODS)
def test_every_route_takes_every_method_without_a_5xx(server, method: str) -> None:
    """Every path the app serves (the page, /metrics and /docs included), with a body that is
    not JSON: answered, errors in OpenAI's schema."""
    paths = {route.path for route in server.app.routes}
    assert {"/", "/docs", "/metrics", "/openapi.json", "/v1/chat/completions"} <= paths
    for path in sorted(paths):
        request = urllib.request.Request(server.url + path, data=b"{", method=method,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        assert status < 500, (method, path, body)
        if status >= 400 and method != "HEAD":
            error = json.loads(body)["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda g: g.value)
def test_no_5xx_from_chats_with_tools_and_response_formats(tools_server, mode) -> None:
    statuses = fuzz(tools_server.url, "/v1/chat/completions", "POST", mode)
    assert any(400 <= s < 500 for s in statuses)


def fuzz(url: str, path: str, method: str, mode: GenerationMode) -> list[int]:
    """The statuses of schemathesis' requests to one route, after checking each response."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operation = schema[path][method]
    statuses: list[int] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)  # fmt: skip
    def check(case) -> None:
        response = case.call(base_url=url, timeout=60)
        statuses.append(response.status_code)
        assert response.status_code < 500, (case.body, response.text)
        if response.status_code >= 400:
            body = response.json()
            assert set(body) == {"error"}, body
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
            assert body["error"]["message"]

    check()
    assert statuses
    return statuses
