"""CompiledStack: a model's decoder stack under torch.compile, with an eager fallback.

Eager PyTorch runs a decode step as some fifteen small operators per layer, each dispatched
from Python and each waking the thread pool; on a 30-layer model that overhead is as large as
reading the weights (docs/design.md, 6). torch.compile (inductor) traces the whole stack, the
paged-KV writes included, into one graph: elementwise work (norms, rotary, SiLU, residuals)
fuses into a few generated C++ loops and the matrix products run as library calls, so a step
costs little more than reading its weights once.

Shapes: the per-step tensors are marked dynamic (mark_dynamic), so graphs are traced with
symbolic token count, sequence count and context length; sizes 0 and 1 and absent tensors
(masks, gather indices) make a handful of variants (decode, verify, prefill, one or several
sequences) rather than one graph per step. `num_compilations` counts them. If compilation
fails (no C++ compiler, an operator the compiler cannot trace), the stack says why once and
runs eagerly from then on.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit

from verispec.models.attention import AttentionLayout

log = logging.getLogger("verispec")

RECOMPILE_LIMIT = 64
"""Graphs one stack may compile before dynamo stops compiling it (its default is 8: chains,
trees, prefill chunks and batches of one or several sequences each need variants)."""


def own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """The same function (or bound method) with a code object of its own. dynamo keeps compiled
    graphs, and its memory of which sizes changed, per code object: with a shared one, a draft
    model's different head count would turn the target's static sizes symbolic."""
    bound = getattr(function, "__self__", None)
    plain = getattr(function, "__func__", function)
    # dynamo also remembers sizes by (file, line, name): a name of its own separates those too
    name = f"{plain.__name__}_{id(bound if bound is not None else plain):x}"
    code = plain.__code__.replace(co_name=name, co_qualname=name)
    copy = types.FunctionType(code, plain.__globals__, name, plain.__defaults__,
                              plain.__closure__)  # fmt: skip
    return copy if bound is None else types.MethodType(copy, bound)


def mark_dynamic(args: Sequence[Any]) -> None:
    """Trace every dimension of the per-step tensors among args (tensor arguments and an
    AttentionLayout's tensors; never a KV cache's, whose sizes are fixed) with a symbolic size
    from the first compilation on (sizes 0 and 1 still get graphs of their own), so that a new
    token count, batch size or context length reuses a graph instead of tracing another."""
    for arg in args:
        tensors = arg.tensors() if isinstance(arg, AttentionLayout) else [arg]
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                for dim in range(tensor.dim()):
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)


class CompiledStack:
    """Calls `eager` through torch.compile; falls back to `eager` for good if compiling fails."""

    def __init__(self, eager: Callable[..., Any], backend: str | Callable = "inductor") -> None:
        self.eager = eager
        self.backend = backend
        self.num_compilations = 0
        """Graphs compiled so far (each trace that reached the backend)."""
        self.failure: str | None = None
        """Why compilation failed, once it has (the stack then runs eagerly)."""
        self.compiled = torch.compile(
            own_code(eager), backend=self._count, fullgraph=True, dynamic=None
        )

    def _count(self, graph: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        """The backend dynamo calls once per traced graph: count it, hand it to the real one."""
        self.num_compilations += 1
        if callable(self.backend):
            return self.backend(graph, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.backend)(graph, example_inputs)

    def __call__(self, *args: Any) -> Any:
        if self.failure is not None:
            return self.eager(*args)
        mark_dynamic(args)
        try:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return self.compiled(*args)
        except (torch._dynamo.exc.TorchDynamoException, FailOnRecompileLimitHit) as error:
            # Raised while tracing or compiling, before the graph runs: nothing was written.
            cause = getattr(error, "inner_exception", None) or error  # the backend's own error
            lines = str(cause).strip().splitlines()
            self.failure = f"{type(cause).__name__}: {lines[0] if lines else ''}"
            log.warning("verispec: torch.compile failed (%s); running eagerly", self.failure)
            return self.eager(*args)
