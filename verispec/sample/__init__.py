"""Logits warping and sampling: raw logits -> warped distribution p -> token ids."""

from verispec.sample.logits import SamplingTensors, apply_penalties, warp
from verispec.sample.sampler import argmax_rows, sample

__all__ = ["SamplingTensors", "apply_penalties", "argmax_rows", "sample", "warp"]
