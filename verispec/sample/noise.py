"""Counter-based noise: a seeded request's Exponential(1) noise as a pure function of (seed,
output position, token id), so its tokens never depend on what else ran or how it was drafted.

A seeded request samples the token at output position t as argmax(p / E_t) (the exponential
race, sample/sampler.py), where E_t[v] = -log(U(seed, t, v)) and U is a hash of its three
integers turned into a uniform in (0, 1). Nothing is drawn from a stream, so no batch mate, no
draft count and no order of evaluation can change which noise a position gets, and any subset
of token ids (a row's support) can be evaluated on its own (docs/design.md, 3).

The hash works on 32-bit words held in int64 tensors (or Python ints: the same code serves
both): each round multiplies a word below 2**32 by an odd constant below 2**31, so every
product stays below 2**63, then masks to 32 bits, with xor-shifts between the products. A row
(seed, t) is keyed by two words (a, b); token v's word is mix(mix(v ^ a) ^ b). Each mix is a
bijection of 32-bit words, so distinct ids of one row never share a value, and two rows are
related only where both of their words coincide.

Worked example: seed 1's noise for token ids 0..3 at output positions 0 and 1, and the
position-0 token of p = [0.1, 0.6, 0.3, 0] (0.1 / 0.0413 beats 0.6 / 4.5961 and 0.3 / 3.7282):
>>> e = exponentials(*row_words(seed=1, position=0), torch.arange(4))  # [4]
>>> [round(x, 4) for x in e.tolist()]
[0.0413, 4.5961, 3.7282, 1.3881]
>>> int((torch.tensor([0.1, 0.6, 0.3, 0.0]) / e).argmax())
0
>>> [round(x, 4) for x in exponentials(*row_words(1, 1), torch.tensor([3, 1])).tolist()]
[0.6404, 0.3798]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch

Word = TypeVar("Word", int, torch.Tensor)
"""A 32-bit word: a Python int or an int64 tensor of them (elementwise)."""

_MASK = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995, 0x27D4EB2F, 0x165667B1)
"""Odd constants below 2**31: a word times one of them stays below 2**63."""
_SALTS = (0x3C6EF372, 0x1B873593)
"""Distinguish the seed's and the second row word's inputs from the other inputs."""
_SCALE = 2.0**-32


def _mix(x: Word, first: int, second: int) -> Word:
    """A bijection of 32-bit words whose every output bit depends on every input bit: two
    multiply-xorshift rounds (each product below 2**63). A tensor is updated in place."""
    x ^= x >> 16
    x *= first
    x &= _MASK
    x ^= x >> 15
    x *= second
    x &= _MASK
    x ^= x >> 16
    return x


@dataclass(frozen=True, slots=True)
class NoiseKey:
    """Which noise row a seeded request's logits row uses: its seed and the output position the
    row samples (len(output_token_ids) + j for verify row j, or a node's depth in a tree)."""

    seed: int
    position: int

    def shifted(self, offset: int) -> NoiseKey:
        """The key `offset` positions later: NoiseKey(7, 3).shifted(2) == NoiseKey(7, 5)."""
        return NoiseKey(self.seed, self.position + offset)

    def words(self) -> tuple[int, int]:
        """row_words(seed, position)."""
        return row_words(self.seed, self.position)


def row_words(seed: int, position: int) -> tuple[int, int]:
    """The two 32-bit words (a, b) that key the noise row of (seed, position); seed in
    [0, 2**64) (SamplingParams' range), position in [0, 2**32)."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if not 0 <= position < 2**32:
        raise ValueError(f"position must be in [0, 2**32), got {position}")
    m0, m1, m2, m3 = _MULTIPLIERS
    s = _mix((seed & _MASK) ^ _SALTS[0], m0, m1)
    s = _mix(s ^ (seed >> 32), m2, m3)
    a = _mix(s ^ position, m0, m1)
    return a, _mix(a ^ _SALTS[1], m2, m3)


def token_words(a: Word, b: Word, token_ids: torch.Tensor) -> torch.Tensor:
    """[...] int64 in [0, 2**32): each token id's word in the row keyed by (a, b) (ints, or int64
    tensors that broadcast with token_ids [...], ids in [0, 2**32))."""
    m0, m1, m2, m3 = _MULTIPLIERS
    x = _mix(token_ids ^ a, m0, m1)  # a new tensor: token_ids stays as it is
    x ^= b
    return _mix(x, m2, m3)


def uniforms(a: Word, b: Word, token_ids: torch.Tensor) -> torch.Tensor:
    """[...] float64 in (0, 1): (word + 1/2) / 2**32 for each token id's word (token_words)."""
    return token_words(a, b, token_ids).double().add_(0.5).mul_(_SCALE)


def exponentials(a: Word, b: Word, token_ids: torch.Tensor) -> torch.Tensor:
    """[...] float32 Exponential(1) noise, -log(uniforms(a, b, token_ids)), in
    [1.2e-10, 22.5]: never 0, so p / E is finite wherever p is."""
    return uniforms(a, b, token_ids).log_().neg_().float()
