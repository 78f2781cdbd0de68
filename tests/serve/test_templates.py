"""Chat templates within bounds (serve/templates.py, serve/template_workers.py): reserved and
non-JSON template variables are 400s naming them, a request's own template is refused unless
the server trusts them, and a trusted one is capped in output size, memory and time, stopped
when its client leaves, and never holds up chats that use the model's own template."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.serving import assert_error, call, wait_until
from verispec import LLM
from verispec.serve import Server, ServerLimits, prompts
from verispec.serve.errors import APIError

pytestmark = pytest.mark.usefixtures("one_thread")

MESSAGES = [{"role": "user", "content": "hi"}]
BOMB = '{{ "hello " * 1000 }}'  # 6000 bytes, over PROMPT_CAP
MEMORY_BOMB = '{{ "hello " * 100000000 }}'  # 600 MB, over the workers' 64 MiB
CPU_BOMB = ("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(50) %}"
            "{% endfor %}{% endfor %}{% endfor %}hi")  # fmt: skip
PROMPT_CAP = 2000
OWN_TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}</s>"


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": 2, "return_token_ids": True, **fields}


def with_template(template: str) -> dict[str, Any]:
    return chat(chat_template_kwargs={"chat_template": template})


@pytest.fixture(scope="module")
def trusting(chat_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The target alone, trusting requests' templates, with tight caps on them."""
    limits = ServerLimits(trust_request_chat_template=True, template_timeout_s=1.0,
                          template_memory_bytes=64 * 2**20,
                          max_prompt_bytes=PROMPT_CAP)  # fmt: skip
    with Server(LLM(model=str(chat_pair[0])).engine, port=0, limits=limits) as s:
        yield s


def workers(server: Server) -> Any:
    return server.app.state.verispec.templates


def pids(server: Server) -> set[int]:
    return {w.process.pid for w in workers(server).workers}


def ready(server: Server) -> set[int]:
    """The pids of the server's two workers, once both are up and idle (a replaced one takes
    seconds to start)."""
    wait_until(lambda: workers(server).num_idle == 2, timeout=120)
    return pids(server)


RESERVED = ["conversation", "documents", "chat_template", "tokenize", "add_generation_prompt",
            "continue_final_message", "tools", "return_dict", "tokenizer_kwargs", "messages",
            "range"]  # fmt: skip


@pytest.mark.parametrize("name", RESERVED)
def test_a_reserved_template_name_is_a_400_naming_it(server: Server, name: str) -> None:
    """conversation and documents were 500s (a TypeError), chat_template ran the client's
    Jinja on the server."""
    status, body = call(server.url, "/v1/chat/completions",
                        chat(chat_template_kwargs={name: 1}))  # fmt: skip
    assert_error(status, body, 400, f"chat_template_kwargs.{name}")
    assert f"must not set '{name}'" in body["error"]["message"]


def test_a_request_template_names_the_flag_that_allows_it(server: Server) -> None:
    status, body = call(server.url, "/v1/chat/completions", with_template(BOMB))
    assert_error(status, body, 400, "chat_template_kwargs.chat_template")
    assert "--trust-request-chat-template" in body["error"]["message"]


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(("value", "words"), [
    (nested(500), "nests deeper than 16 levels"),  # was a RecursionError, a 500
    (nested(17), "nests deeper than 16 levels"),
    ({"a": float("nan")}, "JSON values only"),
    ("x" * 70_000, "longer than 65536 characters"),
    ([{"text": "y" * 40_000}, {"text": "y" * 40_000}], "longer than 65536 characters"),
], ids=["500-deep", "17-deep", "nan", "long-string", "long-list"])  # fmt: skip
def test_template_variables_are_shallow_short_json(server: Server, value: Any, words: str) -> None:
    status, body = call(server.url, "/v1/chat/completions",
                        chat(chat_template_kwargs={"var": value}))  # fmt: skip
    assert_error(status, body, 400, "chat_template_kwargs.var")
    assert words in body["error"]["message"]


def test_plain_template_variables_reach_the_model_template(server: Server) -> None:
    tokenizer = server.engine.engine.tokenizer.hf
    status, body = call(server.url, "/v1/chat/completions",
                        chat(chat_template_kwargs={"bos_token": "<B>", "deep": nested(16)}))
    assert status == 200, body
    expected = tokenizer.encode("<B><|user|>\nhi</s>\n<|assistant|>\n", add_special_tokens=False)
    assert body["choices"][0]["prompt_token_ids"] == expected


class CountingTokenizer:
    """The Rust tokenizer of a Hugging Face tokenizer, counting the texts it encodes."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real.encode_batch(*args, **kwargs)


def test_the_model_template_prompt_is_capped_by_size_before_tokenizing(
    trusting: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = trusting.engine.engine.tokenizer.hf
    counting = CountingTokenizer(hf._tokenizer)
    monkeypatch.setattr(hf, "_tokenizer", counting)
    long = [{"role": "user", "content": "y" * PROMPT_CAP}]
    status, body = call(trusting.url, "/v1/chat/completions", chat(messages=long))
    assert_error(status, body, 413, "messages")
    assert body["error"]["code"] == "prompt_too_large"
    assert f"at most {PROMPT_CAP} bytes" in body["error"]["message"]
    assert counting.calls == 0
    assert call(trusting.url, "/v1/chat/completions", chat())[0] == 200
    assert counting.calls == 1


def test_a_trusted_request_template_renders_as_transformers_would(trusting: Server) -> None:
    tokenizer = trusting.engine.engine.tokenizer.hf
    status, body = call(trusting.url, "/v1/chat/completions", with_template(OWN_TEMPLATE))
    assert status == 200, body
    ids = tokenizer.apply_chat_template(MESSAGES, chat_template=OWN_TEMPLATE, tokenize=True,
                                        add_generation_prompt=True, return_dict=False)  # fmt: skip
    assert body["choices"][0]["prompt_token_ids"] == list(ids)


@pytest.mark.parametrize(("template", "status", "code"), [
    (BOMB, 413, "prompt_too_large"),
    (MEMORY_BOMB, 413, "template_memory_exceeded"),
    ("{{ raise_exception('no') }}", 400, None),
    ("{% for %}", 400, None),
    ("{{ ''.__class__.__mro__ }}", 400, None),
], ids=["size", "memory", "raises", "syntax", "sandbox"])  # fmt: skip
def test_a_trusted_template_past_its_caps_is_a_4xx(
    trusting: Server, template: str, status: int, code: str | None
) -> None:
    reply_status, body = call(trusting.url, "/v1/chat/completions", with_template(template))
    param = "messages" if code == "prompt_too_large" else "chat_template_kwargs.chat_template"
    assert_error(reply_status, body, status, param)
    assert body["error"]["code"] == code
    assert call(trusting.url, "/v1/chat/completions", chat())[0] == 200


def test_a_template_over_its_time_is_stopped_and_its_worker_replaced(trusting: Server) -> None:
    before = ready(trusting)
    status, body = call(trusting.url, "/v1/chat/completions", with_template(CPU_BOMB))
    assert_error(status, body, 400, "chat_template_kwargs.chat_template")
    assert body["error"]["code"] == "template_timeout"
    assert len(before - ready(trusting)) == 1
    assert call(trusting.url, "/v1/chat/completions", with_template(OWN_TEMPLATE))[0] == 200


def send_raw(url: str, body: dict[str, Any]) -> socket.socket:
    """A socket that has sent one POST /v1/chat/completions and not read the answer."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def test_a_client_that_leaves_stops_its_template(
    trusting: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a minute to render, the worker is killed because the client left, not by time."""
    before = ready(trusting)
    monkeypatch.setattr(workers(trusting), "timeout_s", 60.0)
    sock = send_raw(trusting.url, with_template(CPU_BOMB))
    wait_until(lambda: workers(trusting).num_idle == 1)
    sock.close()
    wait_until(lambda: len(before - pids(trusting)) == 1, timeout=20)
    ready(trusting)


def test_a_client_that_leaves_during_the_model_template_is_not_tokenized(
    trusting: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's template renders in a thread, which runs on; once it is done, the text of a
    client that left is not tokenized."""
    real = prompts._own_template_prompt
    entered = threading.Event()
    outcome: list[tuple[bool, Any]] = []

    def slow(state: Any, conversation: Any, kwargs: Any, cap: int, gone: Any, *rest: Any) -> Any:
        entered.set()
        noticed = gone.wait(30)
        try:
            outcome.append((noticed, real(state, conversation, kwargs, cap, gone, *rest)))
        except APIError as e:
            outcome.append((noticed, e.message))

    monkeypatch.setattr(prompts, "_own_template_prompt", slow)
    sock = send_raw(trusting.url, chat())
    assert entered.wait(30)
    sock.close()
    wait_until(lambda: bool(outcome), timeout=40)
    assert outcome == [(True, "the client disconnected before its prompt was tokenized")]


def test_six_slow_templates_do_not_hold_up_a_plain_chat(
    trusting: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six CPU-bound templates of other clients (two render, four queue) and a chat with the
    model's template: the chat is answered while all six are still unanswered."""
    ready(trusting)
    monkeypatch.setattr(workers(trusting), "timeout_s", 60.0)
    socks = [send_raw(trusting.url, with_template(CPU_BOMB)) for _ in range(6)]
    try:
        wait_until(lambda: workers(trusting).num_idle == 0)
        status, body = call(trusting.url, "/v1/chat/completions", chat())
        assert status == 200, body
        for sock in socks:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)  # no answer yet
    finally:
        for sock in socks:
            sock.close()
    ready(trusting)


def test_workers_stop_with_the_server(chat_pair: tuple[Path, Path]) -> None:
    limits = ServerLimits(trust_request_chat_template=True, template_workers=1)
    with Server(LLM(model=str(chat_pair[0])).engine, port=0, limits=limits) as s:
        (worker,) = workers(s).workers
        assert worker.process.returncode is None
    assert worker.process.returncode is not None
