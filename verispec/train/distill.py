"""Self-distillation data for a feature-level drafter head (EAGLE-3, Medusa): the target's own
responses to a prompt set (generate_responses), then the target's features and next-token
distribution at every position of prompt + response (extract_features). Both write numbered
shards atomically and resume: a shard already on disk is not computed again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from verispec.api.llm import LLM
from verispec.models.paged import PagedModel, append_chunk
from verispec.types.sampling_params import SamplingParams

Example = tuple[list[int], list[int]]
"""(prompt token ids, response token ids) of one conversation."""


def generate_responses(
    llm: LLM,
    prompts: Sequence[Sequence[int]],
    out_dir: Path,
    params: SamplingParams,
    shard_size: int = 64,
    progress: bool = True,
) -> list[Path]:
    """The target's responses to token-id prompts, shard_size per `responses-{i:05d}.jsonl`
    (one {"prompt_ids", "response_ids"} line per prompt, in order); one llm.generate per shard.

    A shard on disk is kept; one that holds only the first prompts of its share (an earlier
    run had fewer prompts) is completed. Sampled responses come from the engine's generator, so
    a resumed run differs from an uninterrupted one unless params.seed is set. Returns every
    shard's path, in order.
    """
    _check_positive("shard_size", shard_size)
    wanted = [_checked_ids(p, f"prompt {i}") for i, p in enumerate(prompts)]
    if not wanted:
        raise ValueError("no prompts given; pass at least one list of token ids")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    starts = range(0, len(wanted), shard_size)
    for index, start in enumerate(tqdm(starts, desc="responses", disable=not progress)):
        path = out_dir / f"responses-{index:05d}.jsonl"
        _complete_response_shard(llm, wanted[start : start + shard_size], path, params)
        paths.append(path)
    return paths


def _complete_response_shard(
    llm: LLM, prompts: list[list[int]], path: Path, params: SamplingParams
) -> None:
    """Generate the responses `path` lacks (all, none, or those after an earlier shorter run)."""
    done = read_responses([path]) if path.exists() else []
    _check_prefix([p for p, _ in done], prompts, path)
    todo = prompts[len(done) :]
    if not todo:
        return
    outputs = llm.generate(todo, params)
    done += [(p, list(o.token_ids)) for p, o in zip(todo, outputs, strict=True)]
    lines = "".join(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n" for p, r in done)
    _write_atomic(path, lambda tmp: tmp.write_text(lines))


def read_responses(paths: Sequence[Path]) -> list[Example]:
    """(prompt ids, response ids) of every line of the given response shards, in order."""
    examples = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
            try:
                row = json.loads(line)
                examples.append((list(row["prompt_ids"]), list(row["response_ids"])))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}:{n} is not a response line "
                    f'{{"prompt_ids": [...], "response_ids": [...]}}: {e}'
                ) from None
    return examples


def extract_features(
    model: PagedModel,
    sequences: Sequence[Example],
    feature_layers: Sequence[int],
    top_k: int,
    out_dir: Path,
    shard_size: int = 64,
    progress: bool = True,
    max_batch_tokens: int = 2048,
) -> list[Path]:
    """The target's view of each prompt + response, shard_size per `features-{i:05d}.pt`.

    Each sequence is one record (a list per shard, torch.save): token_ids int32 [T], prompt_len,
    features float16 [T, len(feature_layers) * hidden] (the residual stream entering each listed
    layer: LlamaModel.hidden_states), top_ids int32 [T, top_k] and top_probs float16 [T, top_k],
    the target's softmax (temperature 1) top-k where row t predicts token t + 1. Sequences are
    packed in order into forwards of up to max_batch_tokens tokens that fit the free KV cache.
    Shards on disk are kept (one holding the first sequences of its share is completed).
    """
    _check_extraction(model, sequences, feature_layers, top_k)
    _check_positive("shard_size", shard_size)
    _check_positive("max_batch_tokens", max_batch_tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    starts = range(0, len(sequences), shard_size)
    for index, start in enumerate(tqdm(starts, desc="features", disable=not progress)):
        path = out_dir / f"features-{index:05d}.pt"
        share = [(list(p), list(r)) for p, r in sequences[start : start + shard_size]]
        done = _existing_records(path, share, len(feature_layers) * model.model.config.hidden_size,
                                 top_k)  # fmt: skip
        if len(done) < len(share):
            records = done + _records(model, share[len(done) :], feature_layers, top_k,
                                      max_batch_tokens)  # fmt: skip
            _write_atomic(path, lambda tmp, records=records: torch.save(records, tmp))
        paths.append(path)
    return paths


def _existing_records(
    path: Path, share: list[Example], width: int, top_k: int
) -> list[dict[str, Any]]:
    """The records already in path (none if absent): they must be the first of this share,
    with features of this width and top_k columns, or a ValueError says to start afresh."""
    if not path.exists():
        return []
    done = torch.load(path, mmap=True, weights_only=True)
    _check_prefix([(r["token_ids"].tolist(), r["prompt_len"]) for r in done],
                  [(p + r, len(p)) for p, r in share], path)  # fmt: skip
    shapes = {(r["features"].shape[-1], r["top_ids"].shape[-1]) for r in done}
    if shapes - {(width, top_k)}:
        raise ValueError(
            f"{path} holds features of width/top_k {sorted(shapes)}, not ({width}, {top_k}); "
            "use a fresh out_dir for other feature layers or top_k"
        )
    return done


def _records(
    model: PagedModel,
    examples: list[Example],
    feature_layers: Sequence[int],
    top_k: int,
    max_batch_tokens: int,
) -> list[dict[str, Any]]:
    """One record per example (see extract_features), from packed forwards."""
    tokens = [p + r for p, r in examples]
    max_blocks = model.allocator.num_free
    batches = pack([len(t) for t in tokens], max_batch_tokens, max_blocks, model.block_size)
    records = []
    for batch in batches:
        outputs = sequence_features(model, [tokens[i] for i in batch], feature_layers, top_k)
        for i, (features, top_ids, top_probs) in zip(batch, outputs, strict=True):
            records.append({
                "token_ids": torch.tensor(tokens[i], dtype=torch.int32),
                "prompt_len": len(examples[i][0]),
                "features": features, "top_ids": top_ids, "top_probs": top_probs,
            })  # fmt: skip
    return records


def sequence_features(
    model: PagedModel, token_lists: list[list[int]], feature_layers: Sequence[int], top_k: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(features float16 [T, F], top ids int32 [T, k], top probs float16 [T, k]) on the CPU of
    each token list, from one forward of all of them as fresh sequences (the KV freed after)."""
    tables = [model.new_table() for _ in token_lists]
    try:
        chunks = [
            append_chunk(t, ids, num_logits=len(ids))
            for t, ids in zip(tables, token_lists, strict=True)
        ]
        logits, features = model.forward_with_features(chunks, feature_layers)  # [T, V], [T, F]
    finally:
        for table in tables:
            table.free()
    top_ids, top_probs = top_k_probs(logits, top_k)  # [T, k] each
    half = features.to(torch.float16)
    if not bool(torch.isfinite(half).all()):
        raise ValueError(
            f"features of layers {list(feature_layers)} exceed float16's range (largest "
            f"|x| = {features.abs().max().item():.3g} > 65504); choose other feature layers"
        )
    lengths = [len(t) for t in token_lists]
    parts = (half, top_ids.to(torch.int32), top_probs.to(torch.float16))
    split = [torch.split(x.cpu(), lengths) for x in parts]
    return [(f.clone(), i.clone(), p.clone()) for f, i, p in zip(*split, strict=True)]


def top_k_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most probable ids of each row of logits [T, V] and their softmax probabilities
    (temperature 1, nothing filtered), without materialising the full softmax.

    >>> ids, probs = top_k_probs(torch.tensor([[0.0, 2.0, 1.0]]), 2)
    >>> ids.tolist(), [round(p, 3) for p in probs[0].tolist()]
    ([[1, 2]], [0.665, 0.245])
    """
    logits = logits.float()
    values, ids = logits.topk(k, dim=-1)  # [T, k] each
    return ids, (values - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()


def pack(
    lengths: Sequence[int], max_tokens: int, max_blocks: int, block_size: int
) -> list[list[int]]:
    """Indices of sequences grouped in order into forwards of at most max_tokens tokens and
    max_blocks KV blocks (a sequence longer than max_tokens goes alone).

    >>> pack([5, 3, 4, 9], max_tokens=8, max_blocks=100, block_size=4)
    [[0, 1], [2], [3]]
    """
    batches: list[list[int]] = []
    tokens = blocks = 0
    for i, n in enumerate(lengths):
        need = -(-n // block_size)
        if need > max_blocks:
            raise ValueError(
                f"sequence of {n} tokens needs {need} KV blocks but only {max_blocks} are free; "
                "give the PagedModel more blocks"
            )
        if batches and tokens + n <= max_tokens and blocks + need <= max_blocks:
            batches[-1].append(i)
            tokens, blocks = tokens + n, blocks + need
        else:
            batches.append([i])
            tokens, blocks = n, need
    return batches


def load_features(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    """The records of the given feature shards, in order, one shard in memory at a time."""
    for path in paths:
        yield from torch.load(path, mmap=True, weights_only=True)


def token_frequencies(
    sequences: Sequence[Example], vocab_size: int, responses_only: bool = True
) -> torch.Tensor:
    """How often each id occurs: counts int64 [vocab_size] over the responses (or whole
    sequences), e.g. to pick a drafter's reduced vocabulary of the most frequent tokens.

    >>> token_frequencies([([0, 1], [2, 2, 3])], vocab_size=5).tolist()
    [0, 0, 2, 1, 0]
    """
    _check_positive("vocab_size", vocab_size)
    ids = [t for p, r in sequences for t in (r if responses_only else [*p, *r])]
    if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
        raise ValueError(f"token ids must be in [0, {vocab_size}), got {min(ids)}..{max(ids)}")
    return torch.bincount(torch.tensor(ids, dtype=torch.int64), minlength=vocab_size)


def _check_extraction(
    model: PagedModel, sequences: Sequence[Example], feature_layers: Sequence[int], top_k: int
) -> None:
    """ValueError for anything extract_features cannot honour, before any forward runs."""
    vocab = model.model.config.vocab_size
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab:
        raise ValueError(f"top_k must be an int in [1, {vocab}] (the vocabulary), got {top_k!r}")
    if not feature_layers:
        raise ValueError("feature_layers is empty; give the layer ids whose inputs to save")
    model.model.check_feature_layers(feature_layers)
    if not sequences:
        raise ValueError("no sequences given; pass (prompt_ids, response_ids) pairs")
    for i, (prompt, response) in enumerate(sequences):
        _checked_ids(prompt, f"sequence {i}'s prompt")
        ids = [*prompt, *response]
        if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
            raise ValueError(f"sequence {i} has token ids outside [0, {vocab}) (the vocabulary)")


def _checked_ids(ids: Sequence[int], what: str) -> list[int]:
    """ids as a list, or a ValueError unless they are a non-empty sequence of ints."""
    if isinstance(ids, str | bytes) or not all(isinstance(t, int) for t in ids):
        raise ValueError(f"{what} must be a list of token ids (ints)")
    if not ids:
        raise ValueError(f"{what} is empty; every prompt needs at least one token")
    return list(ids)


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_prefix(have: list[Any], want: list[Any], path: Path) -> None:
    """A shard on disk must hold the first entries of its share, or it is someone else's."""
    if have != want[: len(have)]:
        raise ValueError(
            f"{path} holds data for other inputs than this shard's; use a fresh out_dir, or "
            "delete the shards there to recompute them"
        )


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp) next to path, then rename: a reader never sees a half-written shard."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
