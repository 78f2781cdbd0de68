"""Linear: y = x W^T + b with the fastest kernel this device has for decode and verify shapes."""

from __future__ import annotations

from typing import Literal

import torch

LinearBackend = Literal["auto", "torch", "onednn"]
BACKENDS = ("auto", "torch", "onednn")


def onednn_available() -> bool:
    """True when this torch build has oneDNN and its prepacked-linear operators."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    )


def choose_backend(backend: LinearBackend, device: torch.device, dtype: torch.dtype) -> str:
    """Resolve "auto": prepacked oneDNN for float32 on the CPU, torch's F.linear elsewhere.

    Why: for products of 1-16 rows (decode and verify) the MKL behind F.linear takes a slow
    path on AMD CPUs; oneDNN's prepacked inner product runs 1.3-4x faster there and shares
    torch's thread pool (benchmarks/README.md).
    """
    if backend not in BACKENDS:
        raise ValueError(f"linear backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    onednn_ok = device.type == "cpu" and dtype == torch.float32 and onednn_available()
    if backend == "onednn" and not onednn_ok:
        raise ValueError(
            "the onednn linear backend needs float32 weights on the CPU and a torch build with "
            "oneDNN; use linear_backend='torch' or 'auto'"
        )
    if backend == "auto":
        return "onednn" if onednn_ok else "torch"
    return backend


class Linear:
    """A frozen linear layer; weight [out, in] as stored by Hugging Face, bias [out] or None."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        backend: str,
        row_wise: bool = False,
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.backend = backend
        self.row_wise = row_wise
        """Batch-invariant mode: each row is its own 1-row product, so its result is bit-for-bit
        what a lone decode step computes (kernels may round an n-row product differently)."""
        if backend == "onednn":
            # Reordered once into oneDNN's blocked layout; the original weight is not kept.
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        if self.row_wise and x.shape[0] > 1:
            return torch.cat([self._product(x[i : i + 1]) for i in range(x.shape[0])])
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return torch.nn.functional.linear(x, self.weight, self.bias)
