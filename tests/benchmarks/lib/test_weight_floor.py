"""The floor benchmark's byte counts: what each kernel reads and what the values need."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.lib.weight_floor import (
    FloorRow,
    WeightBytes,
    interleaved_decode_ms,
    interleaved_greedy_step_ms,
    linear_bytes,
    read_bandwidth,
)
from verispec.models.kernels.affine import AffineCodes, Q6Scales
from verispec.models.kernels.backends import fp16_kernel_available, native_usable
from verispec.models.kernels.linear import Linear
from verispec.models.weights.loader import load_model


def weight(fp16_values: bool) -> torch.Tensor:
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    return w.half().float() if fp16_values else w + 1e-4  # 1e-4 offsets leave float16's grid


def test_float32_weights_need_their_four_bytes() -> None:
    assert linear_bytes(Linear(weight(False), None, "torch")) == WeightBytes(128, 128)


def test_float16_exact_values_read_as_float32_count_two_bytes_at_the_floor() -> None:
    bias = torch.zeros(8)
    assert linear_bytes(Linear(weight(True), bias, "torch")) == WeightBytes(128 + 32, 64 + 32)


def test_int8_counts_values_and_scales() -> None:
    assert linear_bytes(Linear(weight(False), None, "auto", quantization="int8")) == WeightBytes(
        32 + 32, 32 + 32
    )


@pytest.mark.skipif(not fp16_kernel_available(), reason="this torch build has no FBGEMM")
def test_the_fp16_kernel_reads_two_bytes() -> None:
    assert linear_bytes(Linear(weight(True), None, "fp16")) == WeightBytes(64, 64)


def test_ratios_follow_from_bytes_and_bandwidth() -> None:
    row = FloorRow("m", "eager", WeightBytes(200, 100), bandwidth=200.0, dram_bandwidth=100.0,
                   decode_ms=3000.0, verify_ms={1: 3000.0})  # fmt: skip
    assert row.floor_ms == 1000.0 and row.ratio == 3.0
    assert row.cached_floor_ms == 500.0  # the faster (cache-served) read gives the lower floor
    assert read_bandwidth(1 << 20, repeats=2) > 0


def test_interleaved_steps_time_every_model(
    spec_pair: tuple[Path, Path],
) -> None:
    target, draft = (load_model(p, torch.float32, torch.device("cpu")) for p in spec_pair)
    ms = interleaved_decode_ms({"target": target, "draft": draft}, repeats=3, context=20)
    assert set(ms) == {"target", "draft"} and all(v > 0 for v in ms.values())


def test_interleaved_greedy_steps_time_both_models(spec_pair: tuple[Path, Path]) -> None:
    target, draft = (load_model(p, torch.float32, torch.device("cpu")) for p in spec_pair)
    t_ms, d_ms = interleaved_greedy_step_ms(target, draft, steps=3, repeats=3, context=20)
    assert t_ms > 0 and d_ms > 0


@pytest.mark.skipif(not native_usable(), reason="the native kernel cannot run here")
def test_q6_k_codes_count_their_bytes_as_stored() -> None:
    """Q6_K codes with their factors (Q6_SUPER_D) read 0.8203 bytes a weight, as the file holds
    them; without the factors (Q8_F32_D_HALVES) 1.25."""
    g = torch.Generator().manual_seed(1)
    d16 = torch.rand(32, 1, generator=g).half()
    sc = torch.randint(-128, 128, (32, 16), generator=g, dtype=torch.int8)
    d = d16.float().repeat_interleave(16, 1) * sc.float()
    q = torch.randint(-32, 32, (32, 256), generator=g, dtype=torch.int8)
    stored = AffineCodes(q, d, torch.zeros_like(d), 16, Q6Scales(d16, sc))
    plain = AffineCodes(q, d, torch.zeros_like(d), 16)
    assert linear_bytes(Linear(stored, None, "auto")) == WeightBytes(6720, 6720)  # 0.8203 x 8192
    assert linear_bytes(Linear(plain, None, "auto")) == WeightBytes(10240, 10240)  # 1.25 x 8192
