"""How far a decode step is from the weight-streaming floor (docs/design.md, 6).

At batch size 1 a decode step reads every weight once, so it takes at least
(bytes of weights) / (memory read bandwidth). This module measures both sides in one run: the
bytes a model's weights need per token, the machine's read bandwidth, a decode step's median
time and the verify curve t(q) / t(1). `benchmarks/floor.py` prints them per model, dtype and
mode (eager or compiled).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import cast

import torch

from verispec.bench.verify_cost import step_ms, verify_cost_curve
from verispec.models.kernels.backends import exactly_fp16
from verispec.models.kernels.linear import Linear
from verispec.models.kernels.native_layer import greedy_steps
from verispec.models.kernels.packing import PackedWeight
from verispec.models.llama import LlamaModel
from verispec.models.paged import PagedModel, append_chunk

GIB = 2**30


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes of linear weights a decode token reads (embedding rows and norms are negligible)."""

    read: int  # what this model's kernels read (a float32 copy of float16 values reads 4 B each)
    floor: int  # what the values need: 2 B for float16-exact values, 1 B + scales for int8, else 4


def linear_bytes(linear: Linear) -> WeightBytes:
    """Bytes of one linear layer's weight and bias, as stored by its kernel and at the least."""
    n = linear.out_features * linear.in_features
    bias = 0 if linear.bias is None else 4 * linear.out_features
    if linear.kernel == "int8":
        size = n + 4 * linear.out_features + bias  # int8 values + float32 scales
        return WeightBytes(size, size)
    if linear.kernel == "fp16":  # FBGEMM's packed float16 copy
        return WeightBytes(2 * n + bias, 2 * n + bias)
    if linear.kernel == "native":  # the fewest bytes that hold the values exactly
        # float16 or float32 (padding aside), or affine codes (padded; a byte each, two a byte
        # when all in 0..15, or Q6_K's 6 bits in two planes) + their scales as stored (per 32
        # or 16 columns, float32 or float16, d alone or d and m, or as a K-quant file stores
        # their factors: uint8): PackedWeight.bytes
        size = cast(PackedWeight, linear.packed).bytes + bias
        return WeightBytes(size, size)
    weight = cast(torch.Tensor, linear.weight)  # the torch and onednn kernels keep tensors
    read = n * weight.element_size() + bias
    least = min(read, 2 * n + bias) if exactly_fp16(weight.float()) else read
    return WeightBytes(read, least)


def model_bytes(model: LlamaModel) -> WeightBytes:
    """Sum over every linear layer a decode token runs, the LM head included."""
    parts = [model.lm_head] + [
        lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    sizes = [linear_bytes(p) for p in parts]
    return WeightBytes(sum(s.read for s in sizes), sum(s.floor for s in sizes))


def read_bandwidth(num_bytes: int = GIB, repeats: int = 9) -> float:
    """Bytes per second of a plain read of num_bytes of float32 with this process's threads: the
    faster median of torch.sum and torch.dot over repeats (each read once before timing)."""
    x = torch.ones(max(num_bytes // 4, 1), dtype=torch.float32)
    best = 0.0
    for read in (lambda: x.sum(), lambda: torch.dot(x, x)):
        read()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            read()
            times.append(time.perf_counter() - started)
        best = max(best, x.numel() * 4 / statistics.median(times))
    return best


@dataclass(frozen=True, slots=True)
class FloorRow:
    """One model in one mode: weight bytes, the floor, and the measured step times."""

    model: str
    mode: str  # "eager" or "compiled", then the kernel of the linear layers: "eager, native"
    weights: WeightBytes
    bandwidth: float  # bytes/s, read_bandwidth of as many bytes as the weights need
    dram_bandwidth: float  # bytes/s, read_bandwidth of 1 GiB (beyond every cache), same run
    decode_ms: float  # median time of one decode step (1 token, warm 256-token cache)
    verify_ms: dict[int, float]  # q -> median time of one forward over q new tokens

    @property
    def floor_ms(self) -> float:
        """The floor from memory: the weights' bytes at the 1 GiB read bandwidth."""
        return 1e3 * self.weights.floor / self.dram_bandwidth

    @property
    def cached_floor_ms(self) -> float:
        """The floor from a read of the weights' own size, which caches may serve in part (a
        large last-level cache holds a small model between steps): the stricter bound."""
        return 1e3 * self.weights.floor / max(self.bandwidth, self.dram_bandwidth)

    @property
    def ratio(self) -> float:
        """Decode time / floor: 1.0 would be a step that only streams its weights."""
        return self.decode_ms / self.floor_ms


def measure(
    model: LlamaModel, label: str, mode: str, qs: tuple[int, ...], repeats: int, dram: float
) -> FloorRow:
    """The floor and step times of one loaded model (already compiled for mode "compiled");
    dram: read_bandwidth() of 1 GiB, measured once for the run."""
    weights = model_bytes(model)
    curve = verify_cost_curve(model, label, qs=qs, repeats=repeats)
    bandwidth = read_bandwidth(weights.floor)
    times = {point.q: point.ms for point in curve}
    return FloorRow(label, mode, weights, bandwidth, dram, times[1], times)


def interleaved_decode_ms(
    models: dict[str, LlamaModel], repeats: int, context: int = 256
) -> dict[str, float]:
    """Median time of one decode step (1 token on a warm `context`-token cache) per model, the
    models taking turns step by step (verify_cost.step_ms): a ratio of two of them (the draft
    cost ratio c) then compares steps taken under the same machine conditions, which separate
    runs on a busy machine do not (their ratio moved by 40% between runs here)."""
    return {name: ms for (name, _), ms in step_ms(models, (1,), context, repeats).items()}


def interleaved_greedy_step_ms(
    target: LlamaModel, draft: LlamaModel, steps: int, repeats: int, context: int = 256
) -> tuple[float, float]:
    """(median ms of one target decode step, median ms of one draft step within a greedy run of
    `steps` steps in one native call, as the draft-model proposer takes every step after a
    chain's first), each on a warm `context`-token cache, the two taking turns as in
    interleaved_decode_ms. Needs native_layer.can_step_greedily(draft)."""
    block_size = 16
    blocks = (context + steps) // block_size + 2
    t_paged, d_paged = PagedModel(target, blocks, block_size), PagedModel(draft, blocks, block_size)
    t_table, d_table = t_paged.new_table(), d_paged.new_table()
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    ids_list = torch.randint(3, vocab, (context + 1,), generator=gen).tolist()
    t_ms: list[float] = []
    d_ms: list[float] = []
    with torch.inference_mode():
        t_paged.forward([append_chunk(t_table, ids_list[:context])])
        d_paged.forward([append_chunk(d_table, ids_list[:context])])
        for round_ in range(repeats + 1):  # round 0 warms up
            started = time.perf_counter()
            t_paged.forward([append_chunk(t_table, ids_list[context:])])
            elapsed = time.perf_counter() - started
            t_table.truncate(context)
            slots = d_table.append_slots(steps)
            started = time.perf_counter()
            greedy_steps(draft, d_paged.kv, [ids_list[context]], [context],
                         [[s] for s in slots], [d_table.blocks], block_size, vocab)  # fmt: skip
            per_step = (time.perf_counter() - started) / steps
            d_table.truncate(context)
            if round_:
                t_ms.append(1e3 * elapsed)
                d_ms.append(1e3 * per_step)
    return statistics.median(t_ms), statistics.median(d_ms)
