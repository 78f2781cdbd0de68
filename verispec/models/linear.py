"""Linear: y = x W^T + b with the fastest kernel this device has for decode and verify shapes."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

LinearBackend = Literal["auto", "torch", "blas"]


def choose_backend(backend: LinearBackend, device: torch.device, dtype: torch.dtype) -> str:
    """Resolve "auto": numpy's OpenBLAS for fp32 on CPU, torch everywhere else.

    Why: the MKL inside the CPU wheel of torch takes a slow path on AMD CPUs for products of
    1-16 rows (the decode and verify shapes); OpenBLAS is 2-3x faster there (docs/performance.md).
    """
    if backend not in ("auto", "torch", "blas"):
        raise ValueError(f"linear backend must be one of auto, torch, blas; got {backend!r}")
    blas_ok = device.type == "cpu" and dtype == torch.float32
    if backend == "blas" and not blas_ok:
        raise ValueError("the blas linear backend needs float32 weights on the CPU")
    if backend == "auto":
        return "blas" if blas_ok else "torch"
    return backend


class Linear:
    """A frozen linear layer; weight [out, in] as stored by Hugging Face, bias [out] or None."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, backend: str) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.backend = backend
        if backend == "blas":
            # [in, out] row-major: the layout OpenBLAS reads fastest for few-row products.
            self._wt = np.ascontiguousarray(weight.detach().numpy().T)
            self.weight = None
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        if self.backend == "blas":
            y = torch.from_numpy(np.matmul(x.contiguous().numpy(), self._wt))
            return y if self.bias is None else y.add_(self.bias)
        return torch.nn.functional.linear(x, self.weight, self.bias)
