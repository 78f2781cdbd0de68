"""Shared by the sampling-distribution tests: a 12-word vocabulary, the exact joint distribution
of a target's first TOKENS outputs, and the counts n requests produce, to compare."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from verispec import LLM, SamplingParams, SpecConfig
from verispec.sample.grammar import GrammarMatcher
from verispec.sample.logits import SamplingTensors, warp

VOCAB = 12
TOKENS = 3  # the first TOKENS generated tokens form one cell
ALPHA = 1e-3
DRAFT_PROMPT = [0, 5, 9]


def word_tokenizer() -> PreTrainedTokenizerFast:
    """The 12-word vocabulary's tokenizer: <s>, </s>, <pad>, w0 .. w8, split on whitespace."""
    words = ["<s>", "</s>", "<pad>", *(f"w{i}" for i in range(VOCAB - 3))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def char_tokenizer() -> PreTrainedTokenizerFast:
    """The same 12 ids as `word_tokenizer` spelled as one letter each (w0 .. w8 are a .. i), so
    any text of those letters has exactly one tokenization, as a grammar library expects."""
    chars = ["<s>", "</s>", "<pad>", *"abcdefghi"]
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def merged_tokenizer() -> PreTrainedTokenizerFast:
    """12 ids, single letters a .. g and the merges "ab" (id 6) and "bc" (id 11): the text "abc"
    is then both ab|c and a|bc, and "ab" both ab and a|b."""
    chars = ["<s>", "</s>", "<pad>", "a", "b", "c", "ab", "d", "e", "f", "g", "bc"]
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(chars)},
                               merges=[("a", "b"), ("b", "c")]))  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def exact_joint(
    model: PreTrainedModel,
    prompt: list[int],
    params: SamplingParams,
    grammar: GrammarMatcher | None = None,
) -> list[float]:
    """P(first TOKENS outputs = cell) for every cell a * V^2 + b * V + c, from the target's
    logits on every prefix, each row warped as the engine warps it (its outputs as history,
    and the grammar's mask after them when the request is constrained)."""
    prefixes = torch.cartesian_prod(*[torch.arange(VOCAB)] * (TOKENS - 1))  # [M, TOKENS - 1]
    m = len(prefixes)
    ids = torch.cat([torch.tensor(prompt).expand(m, -1), prefixes], dim=1)
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1 :]  # [M, TOKENS, V]: row j scores t_{j+1}
    joint = torch.ones(m, dtype=torch.float64)  # [M] P(t_1..t_j = prefix[:j])
    for j in range(TOKENS):
        history = prefixes[:, :j].tolist()
        allowed = None if grammar is None else grammar.masks(history)  # [M, V]
        t = SamplingTensors.build([params] * m, [prompt] * m, history, VOCAB, allowed=allowed)
        p = warp(logits[:, j], t).double()  # [M, V]
        if j < TOKENS - 1:
            joint *= p.gather(1, prefixes[:, j : j + 1])[:, 0]
    return (joint[:, None] * p).flatten().tolist()


def run_case(
    target: Path,
    prompt: list[int],
    params: SamplingParams,
    spec: SpecConfig | None,
    n: int,
    first_seed: int = 0,
    seeded: bool = False,
) -> tuple[Counter[int], float | None, int]:
    """Counts of the first-TOKENS cell over n requests, all in one batch: unseeded requests
    drawing from the engine's generator seeded with first_seed (rejection sampling), or
    (seeded) requests with seeds first_seed .. first_seed + n - 1 (coupled verification)."""
    llm = LLM(
        model=str(target), speculative=spec, max_num_seqs=n, max_num_batched_tokens=32 * n,
        max_model_len=32, seed=first_seed,
    )  # fmt: skip
    seeds = range(first_seed, first_seed + n) if seeded else [None] * n
    outs = llm.generate([prompt] * n, [dataclasses.replace(params, seed=i) for i in seeds])
    cells: Counter[int] = Counter()
    for out in outs:
        assert len(out.token_ids) == params.max_tokens
        cell = 0
        for token in out.token_ids[:TOKENS]:
            cell = cell * VOCAB + token
        cells[cell] += 1
    stats = llm.engine.spec_stats
    return cells, stats.acceptance_rate, stats.num_draft_tokens
