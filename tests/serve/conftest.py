"""Fixtures of the server's tests: a tiny chat model with a perturbed copy as its draft, served
on a free local port by a real uvicorn in a thread; an in-process LLM of the same target as the
reference the answers are compared with; the same kind of pair whose chat template takes tools
(Qwen2.5's format), with a longer context for the tools' text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers.chat import with_chat_template, with_tools_template
from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from tests.helpers.serving import speculative_llm
from verispec import LLM
from verispec.serve import Server

DRAFT_NOISE = 0.03  # greedy acceptance about 0.6 at k = 4 (helpers/checkpoints.py SPEC_PAIRS)
TOOLS_CONTEXT = 2048  # the tools' JSON in the system turn is a few hundred tokens of this BPE


def make_pair(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, name: str, **config: Any
) -> tuple[Path, Path]:
    """(target dir, draft dir): a sharp tiny Llama with `tokenizer` (and config overrides), and
    a perturbed copy as its draft."""
    target = tmp_path_factory.mktemp(f"{name}-target")
    draft = tmp_path_factory.mktemp(f"{name}-draft")
    model = make_checkpoint(target, "llama", tokenizer, layer_scale=8.0, **config)
    make_perturbed_copy(draft, model, tokenizer, DRAFT_NOISE)
    return target, draft


def serve(pair: tuple[Path, Path], model_name: str) -> Iterator[Server]:
    """The pair's speculative target served on 127.0.0.1 at a free port, no API key."""
    llm = speculative_llm(pair)
    with Server(llm.engine, port=0, model_name=model_name) as s:
        yield s


@pytest.fixture(scope="session")
def chat_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """(target dir, draft dir): a sharp tiny Llama with a chat template and its draft."""
    return make_pair(tmp_path_factory, with_chat_template(tokenizer), "serve")


@pytest.fixture(scope="session")
def reference(chat_pair: tuple[Path, Path]) -> LLM:
    """Plain decoding of the same target, batch-invariant: what every answer must equal."""
    return LLM(model=str(chat_pair[0]), speculative=None, batch_invariant=True)


@pytest.fixture(scope="module")
def server(chat_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The speculative target served on 127.0.0.1 at a free port, no API key."""
    yield from serve(chat_pair, "tiny-chat")


@pytest.fixture(scope="session")
def tools_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """(target dir, draft dir) as chat_pair's, with TOOLS_TEMPLATE and a 2048-token context."""
    return make_pair(tmp_path_factory, with_tools_template(tokenizer), "tools",
                     max_position_embeddings=TOOLS_CONTEXT)  # fmt: skip


@pytest.fixture(scope="module")
def tools_server(tools_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The tools pair's speculative target served as "tiny-tools", no API key."""
    yield from serve(tools_pair, "tiny-tools")


@pytest.fixture(scope="module")
def client(tools_server: Server) -> openai.OpenAI:
    """The openai client of `tools_server` (a module's own `client` fixture overrides it)."""
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def generic_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """A chat pair whose template takes no tools (the generic tool format's case) and a context
    that holds the tools' text (agent SDKs' tools, described at length, in a BPE of a few
    hundred tokens)."""
    return make_pair(tmp_path_factory, with_chat_template(tokenizer), "generic",
                     max_position_embeddings=4096)  # fmt: skip


@pytest.fixture(scope="module")
def generic_server(generic_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The generic pair's speculative target served as "tiny-generic", no API key."""
    yield from serve(generic_pair, "tiny-generic")
