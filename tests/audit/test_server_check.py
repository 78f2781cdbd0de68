"""The per-request speculation switch of `verispec serve` ("speculative": false) and `verispec
verify --server` against a real server on 127.0.0.1: exact when the verifier is, caught when it
accepts every draft, inconclusive when the server drafts nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.audit import (
    accept_every_greedy_draft,
    keep_every_draft,
    make_sharp_pair,
    write_jsonl,
)
from tests.helpers.chat import with_chat_template
from verispec import LLM, SpecConfig
from verispec.audit.client import ServerClient, ServerError
from verispec.cli.main import main
from verispec.engine import runner
from verispec.sample import rejection
from verispec.serve import Server

pytestmark = pytest.mark.usefixtures("one_thread")

MESSAGES = [[{"role": "user", "content": "def add(a, b):"}],
            [{"role": "user", "content": "for i in range(10):"}]]  # fmt: skip


@pytest.fixture(scope="module")
def sharp_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """(target, draft): a tiny chat Llama with about 2 nats of next-token entropy (its output
    layer scaled by tests.helpers.audit.HEAD_SCALE) and a copy with 0.2 std of noise per
    matrix: q so far from p that 320 samples a side tell a verifier emitting q apart (measured
    p ~ 1e-51)."""
    return make_sharp_pair(tmp_path_factory, "verify-serve", with_chat_template(tokenizer), 0.2)


@pytest.fixture(scope="module")
def server(sharp_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The target with its draft (k = 3, batch-invariant) on 127.0.0.1 at a free port; 64
    sequences at once, so the sampling requests (16 choices each, 4 in flight) share steps."""
    spec = SpecConfig(method="draft_model", model=str(sharp_pair[1]), num_speculative_tokens=3)
    llm = LLM(model=str(sharp_pair[0]), speculative=spec, batch_invariant=True, max_num_seqs=64)
    with Server(llm.engine, port=0, model_name="tiny-sharp") as s:
        yield s


@pytest.fixture(scope="module")
def chat_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify-serve-prompts") / "chat.jsonl"
    return write_jsonl(path, ({"id": f"chat{i}", "messages": m} for i, m in enumerate(MESSAGES)))


@pytest.fixture(scope="module")
def text_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify-serve-prompts") / "text.jsonl"
    return write_jsonl(path, [{"prompt": "class Point:"}])


def audit(server: Server, prompts: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = main(["verify", "--server", server.url, "--prompts", str(prompts),
                 "--json", str(out), *extra])  # fmt: skip
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_speculative_false_drafts_nothing(server: Server, route: str) -> None:
    client = ServerClient(server.url)
    body = {"prompt": "def add(a, b):"} if route == "/v1/completions" else {"messages": MESSAGES[0]}
    body |= {"max_tokens": 16, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    on = client.post(route, body)
    off = client.post(route, body | {"speculative": False})
    assert on["speculation"]["num_draft_tokens"] > 0
    assert off["speculation"]["num_draft_tokens"] == 0
    assert on["choices"][0]["token_ids"] == off["choices"][0]["token_ids"]  # batch-invariant


@pytest.mark.parametrize("value", ["no", 0, None])
def test_speculative_must_be_a_json_bool(server: Server, value: object) -> None:
    client = ServerClient(server.url)
    with pytest.raises(ServerError, match="speculative") as e:
        client.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "speculative": value})
    assert e.value.status == 400


@pytest.mark.parametrize("prompts", ["chat_prompts", "text_prompts"])
def test_greedy_exact_through_the_server(server, prompts, tmp_path, request, capsys) -> None:
    code, report = audit(server, request.getfixturevalue(prompts), tmp_path, "--batch-invariant",
                          "--max-tokens", "24")  # fmt: skip
    assert code == 0, capsys.readouterr().out
    assert report["verdict"] == "exact" and report["draft_tokens"] > 0
    assert all(p["result"] == "identical" and p["tokens"] == 24 for p in report["greedy"])


def _accept_all(ok: torch.Tensor, counts: list[int]) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int64, device=ok.device)


def test_greedy_through_the_server_catches_a_broken_verifier(
    server, chat_prompts, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(runner, "verify_greedy", accept_every_greedy_draft)  # the server's too
    code, report = audit(server, chat_prompts, tmp_path, "--max-tokens", "24")
    assert code == 1 and report["verdict"] == "not exact"
    assert any(p["result"] == "differs" for p in report["greedy"])


def test_sampling_through_the_server(server, chat_prompts, tmp_path, capsys) -> None:
    """Speculative samples against samples with speculation off (two-sample chi-square)."""
    code, report = audit(server, chat_prompts, tmp_path, "--temperature", "1.0",
                          "--samples", "320", "--num-prompts", "1")  # fmt: skip
    assert code == 0, capsys.readouterr().out
    (p,) = report["sampling"]
    assert p["passed"] and p["samples"] == 320 and p["dof"] >= 5
    assert p["verified"] == 320  # every speculative second token came from a verify step
    assert p["threshold"] == pytest.approx(0.01)  # alpha / 1 prompt


def test_sampling_through_the_server_catches_a_broken_verifier(
    server, chat_prompts, tmp_path, monkeypatch
) -> None:
    """Both verifiers broken: the audit's requests are seeded, so they verify by coupling."""
    monkeypatch.setattr(rejection, "_accepted_prefix", _accept_all)
    monkeypatch.setattr(rejection, "_keep_matching", keep_every_draft)
    code, report = audit(server, chat_prompts, tmp_path, "--temperature", "1.0",
                          "--samples", "320", "--num-prompts", "1")  # fmt: skip
    assert code == 1
    assert report["sampling"][0]["p_value"] < 1e-6


def test_a_server_without_speculation_is_inconclusive(sharp_pair, chat_prompts, tmp_path) -> None:
    llm = LLM(model=str(sharp_pair[0]), speculative=None)
    with Server(llm.engine, port=0) as plain:
        code, report = audit(plain, chat_prompts, tmp_path, "--max-tokens", "8")
    assert code == 1 and report["verdict"] == "inconclusive" and report["draft_tokens"] == 0


def test_model_options_are_refused_with_a_server(server, capsys) -> None:
    assert main(["verify", "--server", server.url, "--draft", "x"]) == 2
    assert "drop --draft" in capsys.readouterr().err
