"""Self-distillation data on tiny local targets: response shards (greedy = LLM.generate, resume),
feature shards (= single-sequence forwards and transformers' hidden states, top-1 = argmax,
resume), token frequencies, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.checkpoints import make_checkpoint
from verispec import LLM, SamplingParams
from verispec.models.paged import PagedModel, append_chunk
from verispec.models.weights.loader import load_model
from verispec.train.distill import (
    extract_features,
    generate_responses,
    load_features,
    read_responses,
    token_frequencies,
)

pytestmark = pytest.mark.usefixtures("one_thread")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
LAYERS = (0, 1, 2)
PROMPTS = [[0, 5 + i, 40 + 3 * i, 100 + i] for i in range(5)]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request: pytest.FixtureRequest, tmp_path_factory, tokenizer) -> tuple[Path, Any]:
    """(checkpoint dir, transformers model) of a sharp tiny target."""
    path = tmp_path_factory.mktemp(f"{request.param}-distill")
    return path, make_checkpoint(path, request.param, tokenizer, layer_scale=8.0)


@pytest.fixture(scope="module")
def llm(target: tuple[Path, Any]) -> LLM:
    return LLM(model=str(target[0]), speculative=None, max_num_seqs=4)


def paged(path: Path, num_blocks: int = 64) -> PagedModel:
    return PagedModel(load_model(path, torch.float32, torch.device("cpu")), num_blocks, 4)


def counting(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str) -> list[Any]:
    """Record the first argument of every call of obj.name (still calling through)."""
    calls: list[Any] = []
    real = getattr(obj, name)

    def wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(first)
        return real(first, *args, **kwargs)

    monkeypatch.setattr(obj, name, wrapper)
    return calls


def sequences() -> list[tuple[list[int], list[int]]]:
    return [(p, [7 + i] * (3 + 4 * i)) for i, p in enumerate(PROMPTS)]


# responses


def test_greedy_response_shards_equal_generate(llm: LLM, tmp_path: Path) -> None:
    paths = generate_responses(llm, PROMPTS, tmp_path, GREEDY, shard_size=2, progress=False)
    assert [p.name for p in paths] == [f"responses-0000{i}.jsonl" for i in range(3)]
    assert not list(tmp_path.glob("*.tmp"))
    want = [(p, o.token_ids) for p, o in zip(PROMPTS, llm.generate(PROMPTS, GREEDY), strict=True)]
    assert read_responses(paths) == want
    assert [len(p.read_text().splitlines()) for p in paths] == [2, 2, 1]
    assert json.loads(paths[0].read_text().splitlines()[0]) == {
        "prompt_ids": want[0][0], "response_ids": want[0][1]
    }  # fmt: skip


def test_resume_skips_finished_shards_and_completes_a_short_one(
    llm: LLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = generate_responses(llm, PROMPTS[:3], tmp_path, GREEDY, shard_size=2, progress=False)
    stamp = first[0].stat().st_mtime_ns
    calls = counting(monkeypatch, llm, "generate")
    paths = generate_responses(llm, PROMPTS, tmp_path, GREEDY, shard_size=2, progress=False)
    assert calls == [[PROMPTS[3]], [PROMPTS[4]]]  # shard 0 untouched, shard 1 completed
    assert paths[0].stat().st_mtime_ns == stamp
    fresh = generate_responses(llm, PROMPTS, tmp_path / "fresh", GREEDY, 2, progress=False)
    assert read_responses(paths) == read_responses(fresh)
    generate_responses(llm, PROMPTS, tmp_path, GREEDY, shard_size=2, progress=False)
    assert len(calls) == 2 + 3  # the fresh run's three; nothing more for the finished dir


def test_response_shard_of_other_prompts_is_refused(llm: LLM, tmp_path: Path) -> None:
    generate_responses(llm, PROMPTS[:2], tmp_path, GREEDY, shard_size=2, progress=False)
    with pytest.raises(ValueError, match="holds data for other inputs"):
        generate_responses(llm, PROMPTS[2:], tmp_path, GREEDY, shard_size=2, progress=False)


@pytest.mark.parametrize(
    ("prompts", "shard_size", "message"),
    [([], 2, "no prompts"), ([[0, 5], []], 2, "prompt 1 is empty"),
     ([[0, 5]], 0, "shard_size must be an int >= 1"), (["hi"], 2, "must be a list of token")],
)  # fmt: skip
def test_generate_bad_input(
    llm: LLM, tmp_path: Path, prompts: Any, shard_size: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        generate_responses(llm, prompts, tmp_path, GREEDY, shard_size, progress=False)


def test_read_responses_names_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "responses-00000.jsonl"
    path.write_text('{"prompt_ids": [1], "response_ids": [2]}\n{"prompt_ids": [1]}\n')
    with pytest.raises(ValueError, match=r"responses-00000.jsonl:2 is not a response line"):
        read_responses([path])


# features


def test_features_equal_single_sequence_forwards(target, tmp_path: Path) -> None:
    path, hf = target
    model = paged(path)
    seqs = sequences()
    shards = extract_features(model, seqs, LAYERS, 4, tmp_path, shard_size=3, progress=False)
    assert [p.name for p in shards] == ["features-00000.pt", "features-00001.pt"]
    assert model.allocator.num_free == 64  # every table freed
    records = list(load_features(shards))
    assert len(records) == len(seqs)
    for (prompt, response), rec in zip(seqs, records, strict=True):
        ids = prompt + response
        table = model.new_table()
        chunk = append_chunk(table, ids, num_logits=len(ids))
        logits, features = model.forward_with_features([chunk], LAYERS)  # [T, V], [T, 3 * 64]
        table.free()
        assert rec["token_ids"].dtype == torch.int32 and rec["token_ids"].tolist() == ids
        assert rec["prompt_len"] == len(prompt)
        assert rec["features"].dtype == torch.float16 and rec["features"].shape == (len(ids), 192)
        torch.testing.assert_close(rec["features"].float(), features, atol=2e-3, rtol=2e-3)
        assert rec["top_ids"].dtype == torch.int32 and rec["top_ids"].shape == (len(ids), 4)
        assert rec["top_ids"][:, 0].tolist() == logits.argmax(-1).tolist()
        probs = torch.softmax(logits, -1).gather(1, rec["top_ids"].long())
        torch.testing.assert_close(rec["top_probs"].float(), probs, atol=1e-3, rtol=1e-3)
        assert bool((rec["top_probs"][:, :-1] >= rec["top_probs"][:, 1:]).all())
        with torch.no_grad():
            hidden = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        for slot, layer in enumerate(LAYERS[:2]):  # transformers: the input of layer i
            got = rec["features"][:, 64 * slot : 64 * (slot + 1)].float()
            torch.testing.assert_close(got, hidden[layer][0], atol=2e-3, rtol=2e-3)


def test_packing_does_not_change_features(target, tmp_path: Path) -> None:
    model = paged(target[0])
    one = extract_features(model, sequences(), LAYERS, 2, tmp_path / "a", max_batch_tokens=1,
                           progress=False)  # fmt: skip
    all_ = extract_features(model, sequences(), LAYERS, 2, tmp_path / "b", progress=False)
    for a, b in zip(load_features(one), load_features(all_), strict=True):
        torch.testing.assert_close(a["features"], b["features"], atol=2e-3, rtol=2e-3)
        assert a["top_ids"][:, 0].tolist() == b["top_ids"][:, 0].tolist()


def test_feature_resume_skips_existing_shards(
    target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = paged(target[0])
    seqs = sequences()
    first = extract_features(model, seqs[:3], LAYERS, 2, tmp_path, shard_size=2, progress=False)
    before = list(load_features(first))
    stamp = first[0].stat().st_mtime_ns
    calls = counting(monkeypatch, model, "forward_with_features")
    paths = extract_features(model, seqs, LAYERS, 2, tmp_path, shard_size=2, progress=False)
    assert sorted(len(c.token_ids) for batch in calls for c in batch) == [19, 23]  # seqs 3, 4
    assert paths[0].stat().st_mtime_ns == stamp and len(paths) == 3
    after = list(load_features(paths))
    assert [r["token_ids"].tolist() for r in after] == [p + r for p, r in seqs]
    for a, b in zip(before, after, strict=False):
        assert torch.equal(a["features"], b["features"])
    with pytest.raises(ValueError, match="width/top_k"):
        extract_features(model, seqs, LAYERS, 3, tmp_path, shard_size=2, progress=False)
    with pytest.raises(ValueError, match="holds data for other inputs"):
        extract_features(model, seqs[1:], LAYERS, 2, tmp_path, shard_size=2, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"top_k": 0}, r"top_k must be an int in \[1, 320\]"),
     ({"top_k": 321}, r"top_k must be an int in \[1, 320\]"),
     ({"sequences": []}, "no sequences given"),
     ({"sequences": [([], [5])]}, "sequence 0's prompt is empty"),
     ({"sequences": [([0], [320])]}, r"outside \[0, 320\)"),
     ({"feature_layers": (0, 3)}, r"feature layers \[3\] are outside 0..2"),
     ({"feature_layers": ()}, "feature_layers is empty"),
     ({"sequences": [([0] * 300, [])]}, "needs 75 KV blocks but only 64 are free"),
     ({"shard_size": 0}, "shard_size must be an int >= 1")],
)  # fmt: skip
def test_extract_bad_input(target, tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    args = {"sequences": sequences(), "feature_layers": LAYERS, "top_k": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        extract_features(paged(target[0]), out_dir=tmp_path, progress=False, **args)
    assert not list(tmp_path.glob("*.pt"))


def test_features_beyond_float16_are_refused(
    target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = paged(target[0])
    real = model.forward_with_features

    def huge(chunks: Any, layers: Any) -> tuple[torch.Tensor, torch.Tensor]:
        logits, features = real(chunks, layers)
        return logits, features * 1e6

    monkeypatch.setattr(model, "forward_with_features", huge)
    with pytest.raises(ValueError, match="exceed float16's range"):
        extract_features(model, sequences(), LAYERS, 2, tmp_path, progress=False)
    assert not list(tmp_path.glob("*"))


def test_token_frequencies() -> None:
    seqs = [([0, 1, 1], [2, 3, 3]), ([1], [3, 4])]
    assert token_frequencies(seqs, 6).tolist() == [0, 0, 1, 3, 1, 0]
    assert token_frequencies(seqs, 6, responses_only=False).tolist() == [1, 3, 1, 3, 1, 0]
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 4\), got 2..4"):
        token_frequencies(seqs, 4)
