"""Bad input answers 400 in OpenAI's error schema (never 422 or 500), the API key guards /v1,
unknown routes are 404, and a client that goes away has its request aborted and blocks freed."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

import pytest

from tests.helpers.serving import (
    assert_error,
    blocks_free,
    call,
    speculative_llm,
    wait_until,
)
from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")

MESSAGES = [{"role": "user", "content": "hi"}]


def completion(**fields: Any) -> dict[str, Any]:
    return {"prompt": "def f():", "max_tokens": 2, **fields}


BAD_COMPLETIONS = [
    (completion(temperature=-1), "temperature"),
    (completion(temperature="hot"), "temperature"),
    (completion(top_p=0), "top_p"),
    (completion(top_p=1.5), "top_p"),
    (completion(top_k=-5), "top_k"),
    (completion(min_p=2), "min_p"),
    (completion(presence_penalty=3), "presence_penalty"),
    (completion(frequency_penalty=-3), "frequency_penalty"),
    (completion(repetition_penalty=0), "repetition_penalty"),
    (completion(seed=-1), "seed"),
    (completion(stop=5), "stop"),
    (completion(stop=[""]), "stop"),
    (completion(stop_token_ids=[-1]), "stop_token_ids.0"),
    (completion(n=0), "n"),
    (completion(n=1000), "n"),
    (completion(stream="yes"), "stream"),
    (completion(stream_options={"include_usage": True}), "stream_options"),
    (completion(stream=True, stream_options={"usage": True}), "stream_options.usage"),
    (completion(max_tokens=0), "max_tokens"),
    (completion(max_tokens=10**6), "max_tokens"),
    (completion(max_tokens=1.5), "max_tokens"),
    (completion(logprobs=21), "logprobs"),
    (completion(logprobs=-1), "logprobs"),
    (completion(echo=True), "echo"),
    (completion(suffix="x"), "suffix"),
    (completion(best_of=3), "best_of"),
    (completion(model="gpt-4"), "model"),
    (completion(foo=1), "foo"),
    ({"max_tokens": 2}, "prompt"),
    (completion(prompt=5), "prompt"),
    (completion(prompt=[]), "prompt"),
    (completion(prompt=[[]]), "prompt"),
    (completion(prompt=[10**9]), "prompt"),
    (completion(prompt=[1.5]), "prompt"),
    (completion(prompt="x " * 400), "prompt"),  # longer than the 256-token context
    (completion(guided_regex="a(b"), "guided_regex"),
    (completion(guided_json="{"), "guided_json"),
    (completion(guided_grammar="start: nothing_here"), "guided_grammar"),
    (completion(guided_regex="[a&&b]"), "guided_regex"),  # compiles, matches nothing
    (completion(guided_regex="x[^\\s\\S]"), "guided_regex"),
    (completion(guided_grammar="start: /[a&&b]/"), "guided_grammar"),
    (completion(guided_grammar='start: a\na: "x" a'), "guided_grammar"),  # never ends
    (completion(structured_outputs={"regex": "[a&&b]"}), "structured_outputs"),
    (completion(tools=[]), "tools"),  # chat only
]


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS, ids=lambda v: str(v)[:40])
def test_every_bad_completion_field_is_a_400_naming_it(server: Server, body, param) -> None:
    assert_error(*call(server.url, "/v1/completions", body), 400, param)


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": 2, **fields}


BAD_CHATS = [
    ({"max_tokens": 2}, "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=[{"role": "robot", "content": "hi"}]), "messages.0.role"),
    (chat(messages=[{"role": "user"}]), "messages.0.content"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages.0.content"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=50), "top_logprobs"),
    (chat(max_tokens=2, max_completion_tokens=2), "max_completion_tokens"),
    (chat(max_completion_tokens=0), "max_completion_tokens"),
    (chat(chat_template_kwargs={"tokenize": True}), "chat_template_kwargs.tokenize"),
    (chat(guided_grammar='start: "xyzzy" /[a&&b]/'), "guided_grammar"),
    (chat(tools=[{"type": "function"}]), "tools.0.function"),
    (chat(tools=[{"type": "function", "function": {"name": "has space"}}]),
     "tools.0.function.name"),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}],  # a function not in tools
          tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice"),
    (chat(tool_choice="sometimes"), "tool_choice"),  # a bad tool_choice
    (chat(tool_choice="required"), "tool_choice"),  # no tools to call
    (chat(parallel_tool_calls="yes"), "parallel_tool_calls"),
    (chat(response_format={"type": "xml"}), "response_format"),
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema.json_schema"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     "response_format.json_schema.json_schema.name"),
    (chat(response_format={"type": "json_schema",
                           "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "response_format"),
    (chat(response_format={"type": "json_object"}, guided_regex="a"), "guided_regex"),
    (chat(guided_choice=[]), "guided_choice"),
    (chat(structured_outputs={"regex": "a(", "json": {}}), "structured_outputs"),
    (chat(messages=[{"role": "assistant", "content": None}]), "messages.0.content"),
    (chat(messages=[{"role": "user", "content": "hi", "tool_calls": []}]), "messages.0"),
    (chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]),
     "messages.0.tool_calls.0.function.arguments"),
    (chat(messages=[{"role": "user", "content": "x " * 400}]), "messages"),
]


@pytest.mark.parametrize(("body", "param"), BAD_CHATS, ids=lambda v: str(v)[:40])
def test_every_bad_chat_field_is_a_400_naming_it(server: Server, body, param) -> None:
    assert_error(*call(server.url, "/v1/chat/completions", body), 400, param)


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"", b"\xff\xfe", b'"prompt"'])
def test_a_body_that_is_not_a_json_object_is_a_400(server: Server, raw: bytes) -> None:
    assert_error(*call(server.url, "/v1/completions", raw=raw, method="POST"), 400)


def test_unknown_routes_and_methods(server: Server) -> None:
    assert_error(*call(server.url, "/v1/nothing"), 404)
    assert_error(*call(server.url, "/v1/completions", method="GET"), 405)


def test_chat_on_a_model_without_a_chat_template_is_a_400(llama_checkpoint) -> None:
    from verispec import LLM

    with Server(LLM(model=str(llama_checkpoint)).engine, port=0) as plain:
        status, body = call(plain.url, "/v1/chat/completions", chat())
        assert_error(status, body, 400, "messages")
        assert "chat template" in body["error"]["message"]
        assert call(plain.url, "/v1/completions", completion())[0] == 200


def test_api_key_guards_the_api_but_not_health_metrics_or_page(chat_pair) -> None:
    with Server(speculative_llm(chat_pair).engine, port=0, api_key="s3cret") as guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):  # fmt: skip
            for path, body in (("/v1/completions", completion()), ("/v1/models", None)):
                status, reply = call(guarded.url, path, body, headers)
                assert_error(status, reply, 401)
                assert reply["error"]["code"] == "invalid_api_key"
        ok = {"Authorization": "Bearer s3cret"}
        assert call(guarded.url, "/v1/completions", completion(), ok)[0] == 200
        assert call(guarded.url, "/v1/models", None, ok)[0] == 200
        for path in ("/health", "/metrics", "/"):
            assert call(guarded.url, path)[0] == 200


def test_server_without_a_key_needs_no_header(server: Server) -> None:
    assert call(server.url, "/v1/completions", completion())[0] == 200


def open_stream(url: str, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, Any]:
    """A streamed completion whose first event has arrived: (connection, response)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})  # fmt: skip
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    return conn, response


LONG = completion(max_tokens=200, ignore_eos=True, temperature=0)


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server: Server) -> None:
    conn, _ = open_stream(server.url, {**LONG, "stream": True})
    engine = server.engine.engine
    wait_until(lambda: not blocks_free(server))  # it holds blocks while it runs
    conn.sock.close()  # the client goes away mid-answer
    wait_until(lambda: blocks_free(server) and not engine.has_unfinished())
    assert engine.spec_stats.num_draft_tokens > 0  # it was speculating (draft blocks too)
    assert call(server.url, "/v1/completions", completion())[0] == 200  # still serving


def test_a_client_that_disconnects_before_a_whole_answer_frees_its_blocks(
    server: Server,
) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(LONG), {"Content-Type": "application/json"})
    engine = server.engine.engine
    wait_until(engine.has_unfinished)
    conn.close()
    wait_until(lambda: blocks_free(server) and not engine.has_unfinished())


def test_a_failing_step_fails_its_requests_with_500_and_the_server_goes_on(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.engine.engine
    real_step = engine.step
    calls = {"n": 0}

    def failing_step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    status, body = call(server.url, "/v1/completions", completion())
    assert_error(status, body, 500)
    assert "injected fault" in body["error"]["message"]
    wait_until(lambda: blocks_free(server))
    assert call(server.url, "/v1/completions", completion())[0] == 200
    calls["n"] = 0  # and mid-stream: one error event, then the stream ends
    status, text = call(server.url, "/v1/completions", completion(stream=True))
    assert status == 200
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]
    assert "injected fault" in events[-1]["error"]["message"]


def test_a_client_that_leaves_while_tokens_flow_is_aborted_at_once(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disconnect is seen while news keeps arriving (no gap in news), well before the
    request could finish on its own."""
    engine = server.engine.engine
    real_step = engine.step

    def slow_step():  # 200 plain steps take at least 10 s
        time.sleep(0.05)
        return real_step()

    monkeypatch.setattr(engine, "step", slow_step)
    long = completion(max_tokens=200, ignore_eos=True, temperature=0, speculative=False)
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(long),
                 {"Content-Type": "application/json"})  # fmt: skip
    wait_until(lambda: not blocks_free(server))
    time.sleep(0.5)  # tokens flow: a step's news every 0.05 s
    conn.close()
    left = time.monotonic()
    wait_until(lambda: blocks_free(server) and not engine.has_unfinished(), timeout=2.0)
    assert time.monotonic() - left < 2.0
    monkeypatch.undo()
    assert call(server.url, "/v1/completions", completion())[0] == 200


def _post(conn: http.client.HTTPConnection, path: str, body: Any) -> tuple[int, Any]:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


@pytest.mark.parametrize(
    ("path", "body", "param", "where"),
    [
        ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "hello\ud800!"}]),
         "messages.0.content", "character 5: a lone surrogate U+D800"),
        ("/v1/chat/completions",
         chat(messages=[{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]),
         "messages.0.content.0.text", "character 0: a lone surrogate U+DC80"),
        ("/v1/completions", completion(prompt=["fine", "ab\udfffc"]), "prompt.1",
         "character 2: a lone surrogate U+DFFF"),
        ("/v1/completions", completion(prompt="\ud800"), "prompt", "character 0"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_field_and_position_on_a_live_connection(
    server: Server, path: str, body: dict[str, Any], param: str, where: str
) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    status, reply = _post(conn, path, body)  # json.dumps writes the surrogate as an escape
    assert_error(status, reply, 400, param)
    assert f"{param}: invalid text at {where}" in reply["error"]["message"]
    assert _post(conn, "/v1/completions", completion())[0] == 200  # the same connection
    conn.close()


CONTENT_PARTS = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
UNCLEAR = [
    ("/v1/completions", {"raw": b'{"prompt": "x"}', "headers": {"Content-Type": "text/plain"}},
     415, None, "must be a JSON object sent with 'Content-Type: application/json'"),
    ("/v1/completions", {"raw": b""}, 400, None, "the body is empty; send a JSON object"),
    ("/v1/chat/completions", {"raw": b""}, 400, None, '"messages": [{"role": "user"'),
    ("/v1/completions", {"body": completion(prompt=[True])}, 400, "prompt",
     "prompt must be a string, a list of strings, a list of token ids or a list of lists"),
    ("/v1/completions", {"body": completion(stop=5)}, 400, "stop",
     "stop must be a string or a list of strings"),
    ("/v1/chat/completions", {"body": chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, CONTENT_PARTS]}])}, 400, "messages.0.content",
     "content parts must be {\"type\": \"text\", \"text\": ...}; 'image_url' parts are not"),
    ("/v1/chat/completions", {"body": chat(messages=[{"role": "user", "content": 5}])}, 400,
     "messages.0.content", "must be a string or a list of {\"type\": \"text\""),
    ("/v1/completions", {"raw": b'{"prompt": "x", "temperature": NaN}'}, 400, "temperature",
     "temperature must be a finite number"),
    ("/v1/completions", {"raw": b'{"prompt": "x", "top_p": Infinity}'}, 400, "top_p",
     "top_p must be a finite number"),
    ("/v1/chat/completions", {"body": {"messages": MESSAGES, "max_completion_tokens": 10**6}},
     400, "max_completion_tokens", "lower max_completion_tokens to at most"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "request_", "status", "param", "message"), UNCLEAR,
                         ids=[m[:30] for *_, m in UNCLEAR])  # fmt: skip
def test_messages_say_what_is_wrong_and_what_is_allowed(
    server: Server, path: str, request_: dict[str, Any], status: int, param: str | None,
    message: str,
) -> None:  # fmt: skip
    raw = request_.get("raw")
    got, reply = call(server.url, path, request_.get("body"), request_.get("headers"),
                      "POST", raw)  # fmt: skip
    assert_error(got, reply, status, param)
    assert message in reply["error"]["message"], reply


def test_harmless_defaults_are_accepted(server: Server) -> None:
    """What frameworks send by default: empty logit_bias, user; HEAD /health; a trailing
    slash (served as the route without it)."""
    for bias in ({}, None):
        for path, make in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
            status, reply = call(server.url, path, make(logit_bias=bias, user="u-1"))
            assert status == 200, reply
    status, reply = call(server.url, "/v1/completions", completion(logit_bias={"50": -100}))
    assert_error(status, reply, 400, "logit_bias")
    assert "logit_bias is not supported" in reply["error"]["message"]
    assert call(server.url, "/health", method="HEAD")[0] == 200
    assert call(server.url, "/health/") == (200, {"status": "ok"})
    greedy = chat(temperature=0, max_tokens=4)
    status, slashed = call(server.url, "/v1/chat/completions/", greedy)
    assert status == 200, slashed
    plain = call(server.url, "/v1/chat/completions", greedy)[1]
    assert slashed["choices"][0]["message"] == plain["choices"][0]["message"]
