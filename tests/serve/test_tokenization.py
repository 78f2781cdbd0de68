"""POST /tokenize, POST /detokenize and GET /v1/models/{id} (serve/tokenization.py, serve/api.py)
through a real server: a prompt's ids give it back, a chat's ids are its chat template's (the ones
a chat request runs), bad input is a 400 naming what is wrong, and the new routes keep the API
key, the body limit and a request's own template's worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.serving import assert_error
from verispec import LLM
from verispec.serve import Server, ServerLimits

pytestmark = pytest.mark.usefixtures("one_thread")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
TEXTS = ["def f(x):\n    return x + 1", "  two  spaces, a tab\there\n\n", "héllo wörld — ünïcode ✓"]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
KEY = "s3cret"
BODY_LIMIT = 4096
OWN_TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"


def post(server: Server, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    """(status, parsed JSON) of one POST through httpx (the body as Python's json writes it,
    which escapes a lone surrogate as JSON may)."""
    response = httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=60,
                          headers={"Content-Type": "application/json", **headers})  # fmt: skip
    return response.status_code, response.json()


def tokenize(server: Server, **body: Any) -> dict[str, Any]:
    status, answer = post(server, "/tokenize", body)
    assert status == 200, answer
    return answer


def hf(server: Server) -> Any:
    return server.engine.engine.tokenizer.hf


@pytest.mark.parametrize("text", TEXTS)
def test_a_prompt_round_trips(server: Server, text: str) -> None:
    plain = tokenize(server, prompt=text, add_special_tokens=False)
    assert plain["tokens"] == hf(server).encode(text, add_special_tokens=False)
    assert plain["count"] == len(plain["tokens"]) > 0 and plain["token_strs"] is None
    status, answer = post(server, "/detokenize", {"tokens": plain["tokens"]})
    assert (status, answer) == (200, {"prompt": text})


def test_a_prompt_gets_the_special_tokens_by_default(server: Server) -> None:
    """As /v1/completions tokenizes it: this tokenizer prepends its BOS."""
    answer = tokenize(server, prompt=TEXTS[0], model="tiny-chat")
    plain = hf(server).encode(TEXTS[0], add_special_tokens=False)
    assert answer["tokens"] == [hf(server).bos_token_id, *plain]
    models = httpx.get(server.url + "/v1/models", timeout=60).json()
    assert answer["max_model_len"] == models["data"][0]["max_model_len"]
    text = post(server, "/detokenize", {"tokens": answer["tokens"]})[1]["prompt"]
    assert text == hf(server).bos_token + TEXTS[0]  # special tokens are written out


def test_token_strs_are_the_vocabulary_entries(server: Server) -> None:
    answer = tokenize(server, prompt=TEXTS[2], return_token_strs=True)
    assert answer["token_strs"] == hf(server).convert_ids_to_tokens(answer["tokens"])
    assert len(answer["token_strs"]) == answer["count"]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_messages_give_the_chat_templates_ids(server: Server, add_generation_prompt: bool) -> None:
    answer = tokenize(server, messages=MESSAGES, add_generation_prompt=add_generation_prompt)
    expected = hf(server).apply_chat_template(MESSAGES, tokenize=True, return_dict=False,
                                              add_generation_prompt=add_generation_prompt)
    assert answer["tokens"] == list(expected) and answer["count"] == len(expected)
    text = hf(server).apply_chat_template(MESSAGES, tokenize=False,
                                          add_generation_prompt=add_generation_prompt)
    assert post(server, "/detokenize", {"tokens": answer["tokens"]})[1] == {"prompt": text}


def test_messages_give_the_ids_a_chat_request_runs(server: Server) -> None:
    chat = {"messages": MESSAGES, "max_tokens": 2, "return_token_ids": True}
    status, answer = post(server, "/v1/chat/completions", chat)
    assert status == 200, answer
    assert tokenize(server, messages=MESSAGES)["tokens"] == answer["choices"][0]["prompt_token_ids"]


def test_special_tokens_on_request_are_added_to_the_rendered_chat(server: Server) -> None:
    """The template writes its BOS; the tokenizer, asked, adds another (vLLM's meaning)."""
    text = hf(server).apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    answer = tokenize(server, messages=MESSAGES, add_special_tokens=True)
    assert answer["tokens"] == hf(server).encode(text, add_special_tokens=True)
    assert answer["tokens"][:2] == [hf(server).bos_token_id] * 2


def test_tools_are_rendered_as_the_template_renders_them(tools_server: Server) -> None:
    answer = tokenize(tools_server, messages=MESSAGES, tools=[TOOL])
    expected = hf(tools_server).apply_chat_template(MESSAGES, tools=[TOOL], tokenize=True,
                                                    return_dict=False,
                                                    add_generation_prompt=True)  # fmt: skip
    assert answer["tokens"] == list(expected)
    assert answer["count"] > tokenize(tools_server, messages=MESSAGES)["count"]


def test_tools_on_a_template_without_them_give_the_ids_a_chat_request_runs(
    generic_server: Server,
) -> None:
    """The generic tool format (tools in the system turn) is rendered for /tokenize too."""
    chat = {"messages": MESSAGES, "tools": [TOOL], "max_tokens": 2, "return_token_ids": True}
    status, answer = post(generic_server, "/v1/chat/completions", chat)
    assert status == 200, answer
    ids = tokenize(generic_server, messages=MESSAGES, tools=[TOOL])["tokens"]
    assert ids == answer["choices"][0]["prompt_token_ids"]
    assert len(ids) > len(tokenize(generic_server, messages=MESSAGES)["tokens"])


BAD_TOKENIZE = [
    ({}, None, "prompt (text) or messages"),
    ({"prompt": "a", "messages": MESSAGES}, "prompt", "got both"),
    ({"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt", "messages only"),
    ({"prompt": "a", "tools": [TOOL]}, "tools", "messages only"),
    ({"prompt": "a", "model": "gpt-4"}, "model", "'tiny-chat'"),
    ({"prompt": "a", "return_token_strs": "yes"}, "return_token_strs", None),
    ({"prompt": "a", "truncate": 5}, "truncate", "unknown field"),
    ({"prompt": 5}, "prompt", None),
    ({"messages": []}, "messages", None),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role", None),
    ({"messages": MESSAGES, "chat_template_kwargs": {"tokenize": True}},
     "chat_template_kwargs.tokenize", "must not set"),
    ({"prompt": "x\ud800"}, "prompt", "lone surrogate"),
    ({"prompt": "hello " * 5000}, "prompt", "this model's context is"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "words"), BAD_TOKENIZE)
def test_bad_tokenize_requests_are_400s_naming_the_field(
    server: Server, body: dict[str, Any], param: str | None, words: str | None
) -> None:
    status, answer = post(server, "/tokenize", body)
    assert_error(status, answer, 400, param)
    assert words is None or words in answer["error"]["message"], answer


def test_an_empty_body_is_a_400(server: Server) -> None:
    response = httpx.post(server.url + "/tokenize", content=b"", timeout=60,
                          headers={"Content-Type": "application/json"})  # fmt: skip
    assert_error(response.status_code, response.json(), 400)
    assert "the body is empty" in response.json()["error"]["message"]


@pytest.mark.parametrize(("tokens", "index"), [([5, -1], 1), ([320], 0), ([1, 2, 10**12], 2)])
def test_ids_outside_the_vocabulary_are_400s_naming_them(
    server: Server, tokens: list[int], index: int
) -> None:
    status, answer = post(server, "/detokenize", {"tokens": tokens})
    assert_error(status, answer, 400, f"tokens.{index}")
    size = len(hf(server))
    assert f"token id {tokens[index]} " in answer["error"]["message"]
    assert f"ids are 0 to {size - 1}" in answer["error"]["message"]


@pytest.mark.parametrize(("body", "param"), [({}, "tokens"), ({"tokens": ["a"]}, "tokens.0"),
                                             ({"tokens": [1], "model": "x"}, "model"),
                                             ({"tokens": [1.5]}, "tokens.0")])  # fmt: skip
def test_bad_detokenize_requests_are_400s(server: Server, body: Any, param: str) -> None:
    assert_error(*post(server, "/detokenize", body), 400, param)


def test_no_ids_are_no_text(server: Server) -> None:
    answer = post(server, "/detokenize", {"tokens": [], "model": "tiny-chat"})
    assert answer == (200, {"prompt": ""})


def test_a_model_is_found_by_its_id(server: Server) -> None:
    listed = httpx.get(server.url + "/v1/models", timeout=60).json()["data"][0]
    response = httpx.get(server.url + "/v1/models/tiny-chat", timeout=60)
    assert response.status_code == 200 and response.json() == listed


@pytest.mark.parametrize("name", ["gpt-4", "tiny-chat-2", "org/tiny-chat"])
def test_an_unknown_model_id_is_a_404_naming_the_served_one(server: Server, name: str) -> None:
    response = httpx.get(f"{server.url}/v1/models/{name}", timeout=60)
    assert_error(response.status_code, response.json(), 404, "model")
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert repr(name) in error["message"] and "'tiny-chat'" in error["message"]


@pytest.fixture(scope="module")
def guarded(chat_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The target alone with an API key, a small body limit, and requests' own templates
    trusted (one worker)."""
    limits = ServerLimits(max_request_bytes=BODY_LIMIT, trust_request_chat_template=True,
                          template_workers=1)  # fmt: skip
    with Server(LLM(model=str(chat_pair[0])).engine, port=0, api_key=KEY, limits=limits) as s:
        yield s


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_the_api_key_and_the_body_limit_guard_the_new_routes(guarded: Server, path: str) -> None:
    body = {"prompt": "hi"} if path == "/tokenize" else {"tokens": [5]}
    status, answer = post(guarded, path, body)
    assert_error(status, answer, 401)
    assert answer["error"]["code"] == "invalid_api_key"
    auth = {"Authorization": f"Bearer {KEY}"}
    assert post(guarded, path, body, **auth)[0] == 200
    big = {"prompt": "x" * BODY_LIMIT} if path == "/tokenize" else {"tokens": [5] * BODY_LIMIT}
    status, answer = post(guarded, path, big, **auth)
    assert_error(status, answer, 413)
    assert answer["error"]["code"] == "request_too_large"
    response = httpx.get(guarded.url + "/v1/models/x", timeout=60)
    assert_error(response.status_code, response.json(), 401)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_requests_own_template_renders_in_the_worker(
    guarded: Server, add_generation_prompt: bool
) -> None:
    """The worker honours add_generation_prompt as the model's template does."""
    template = OWN_TEMPLATE + "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    body = {"messages": MESSAGES, "chat_template_kwargs": {"chat_template": template},
            "add_generation_prompt": add_generation_prompt}  # fmt: skip
    status, answer = post(guarded, "/tokenize", body, Authorization=f"Bearer {KEY}")
    assert status == 200, answer
    text = "<s>[Be brief.][hi there]" + ("<|assistant|>" if add_generation_prompt else "")
    assert answer["tokens"] == hf(guarded).encode(text, add_special_tokens=False)
