"""Fixtures of the server's tests: a tiny chat model with a perturbed copy as its draft, served
on a free local port by a real uvicorn in a thread; an in-process LLM of the same target as the
reference the answers are compared with."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.api.test_chat import with_chat_template
from tests.helpers.checkpoints import make_checkpoint, make_perturbed_copy
from verispec import LLM, SpecConfig
from verispec.serve import Server

DRAFT_NOISE = 0.03  # greedy acceptance about 0.6 at k = 4 (conftest.SPEC_PAIRS)


@pytest.fixture(scope="session")
def chat_pair(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> tuple[Path, Path]:
    """(target dir, draft dir): a sharp tiny Llama with a chat template and its draft."""
    chat_tokenizer = with_chat_template(tokenizer)
    target = tmp_path_factory.mktemp("serve-target")
    draft = tmp_path_factory.mktemp("serve-draft")
    model = make_checkpoint(target, "llama", chat_tokenizer, layer_scale=8.0)
    make_perturbed_copy(draft, model, chat_tokenizer, DRAFT_NOISE)
    return target, draft


def speculative_llm(chat_pair: tuple[Path, Path], adaptive: bool = False, **options) -> LLM:
    """The target with its draft model, k = 4 (up to 4 when adaptive), batch-invariant (greedy
    output equals plain)."""
    target, draft = chat_pair
    spec = SpecConfig(method="draft_model", model=str(draft), num_speculative_tokens=4,
                      adaptive=adaptive)  # fmt: skip
    return LLM(model=str(target), speculative=spec, batch_invariant=True, **options)


@pytest.fixture(scope="session")
def reference(chat_pair: tuple[Path, Path]) -> LLM:
    """Plain decoding of the same target, batch-invariant: what every answer must equal."""
    return LLM(model=str(chat_pair[0]), speculative=None, batch_invariant=True)


@pytest.fixture(scope="module")
def server(chat_pair: tuple[Path, Path]) -> Iterator[Server]:
    """The speculative target served on 127.0.0.1 at a free port, no API key."""
    llm = speculative_llm(chat_pair)
    with Server(llm.engine, port=0, model_name="tiny-chat") as s:
        yield s


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
