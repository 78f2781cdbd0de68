"""The decoder stack in native code (native/layer.c): every layer of a forward in one call.

Why: in eager torch a SmolLM2 decode step runs some 20 small operators per layer (norms, rotary
arithmetic, the cache write, attention, SiLU, residual adds) between its four products. Each
costs a Python dispatch, an allocation and often a wake of the thread pool; together they cost
about as much as streaming the weights. Here Python hands over the batch's block tables and
offsets (KeyPlan: which cached keys each new row sees), and one C call runs every layer: the
products on the native linear kernel, the rest over plain float32 arrays.

It runs where every product of the model runs the native kernel with no padded columns
(float32 on the CPU), in eager mode; llama.py's torch operators stay the reference it is tested
against (within float32 rounding, tests/models/kernels/test_native_layer.py). Like the kernel,
every row is computed alone by a fixed sequence of operations, so a verify or prefill row is
bit-for-bit the decode step of the same token, with or without the batch-invariant mode.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch

from verispec.models.attention import AttentionLayout
from verispec.models.batch import ForwardBatch
from verispec.models.config import ModelConfig
from verispec.models.kernels.build import loaded
from verispec.models.kernels.ffi import CKeys, CLayer, CLinear
from verispec.models.kernels.linear import Linear
from verispec.models.kernels.packing import PackedWeight

if TYPE_CHECKING:
    from verispec.kv.cache import KVCache


class LayerWeights(Protocol):
    """What the stack reads of a decoder layer (llama.DecoderLayer): named here, not imported,
    so kernels stay below the model that runs them."""

    @property
    def input_norm(self) -> torch.Tensor: ...
    @property
    def post_norm(self) -> torch.Tensor: ...
    @property
    def q_norm(self) -> torch.Tensor | None: ...
    @property
    def k_norm(self) -> torch.Tensor | None: ...
    @property
    def qkv(self) -> Linear: ...
    @property
    def o(self) -> Linear: ...
    @property
    def gate_up(self) -> Linear: ...
    @property
    def down(self) -> Linear: ...
    @property
    def window(self) -> int | None: ...


class NativeModel(Protocol):
    """What greedy_steps and the can_* checks read of a model (llama.LlamaModel), for the
    same reason."""

    @property
    def config(self) -> ModelConfig: ...
    @property
    def embed(self) -> torch.Tensor: ...
    @property
    def lm_head(self) -> Linear: ...
    @property
    def vocab_ids(self) -> torch.Tensor | None: ...
    @property
    def native(self) -> NativeStack | None: ...
    @property
    def compiled(self) -> object: ...


def supported(layers: Sequence[LayerWeights], config: ModelConfig, embed: torch.Tensor) -> bool:
    """Whether these layers can run this stack: float32 on the CPU, every product on the
    native kernel (so the library is loaded) with no column padding (the stack passes its
    buffers to the kernel as they are), an even head dimension (rotary halves), and a library
    and CPU that run layer.c (NativeKernel.stack: x86-64 with AVX2; elsewhere the layers run
    in torch, their products still on the native kernel)."""
    linears = [lin for layer in layers for lin in (layer.qkv, layer.o, layer.gate_up,
                                                    layer.down)]  # fmt: skip
    return (
        embed.device.type == "cpu"
        and embed.dtype == torch.float32
        and bool(linears)
        and all(lin.kernel == "native" and _columns(lin) == lin.in_features for lin in linears)
        and config.head_dim % 2 == 0
        and loaded().stack
    )


def _columns(lin: Linear) -> int:
    """K', the columns of a native layer's packed weight (in_features padded)."""
    return cast(PackedWeight, lin.packed).columns


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """Which cached keys each new row attends to, for layer.c's attention (built once per
    forward, shared by every layer)."""

    tables: torch.Tensor | None  # [S, max_blocks] int64 block tables; None: kv_start below
    kv_start: int  # one sequence in consecutive slots: key j is slot kv_start + j
    block_size: int
    cu: torch.Tensor  # [S + 1] int64, sequence s owns rows cu[s] .. cu[s + 1] - 1
    ctx: torch.Tensor  # [S] int64, keys of each sequence (its new tokens included)
    masks: dict[int | None, torch.Tensor | None]  # per window: [S, Q, C] bool; None: causal
    max_q: int
    max_ctx: int

    @classmethod
    def build(cls, batch: ForwardBatch, windows: set[int | None]) -> KeyPlan:
        """The batch's own tensors, and masks from attention.py's layout only where causal
        order is not the rule: a draft tree's mask or a sliding window shorter than the
        context. E.g. a decode or chain-verify step of one sequence builds no tensor at all."""
        max_ctx = max(batch.context_lens_host)
        binding = any(w is not None and max_ctx > w for w in windows)
        masks: dict[int | None, torch.Tensor | None] = dict.fromkeys(windows)
        if batch.extra_mask is not None or binding:
            layout = AttentionLayout.build(batch, windows, grouped=False)
            masks = {w: None if m is None else m[:, 0].contiguous()
                     for w, m in layout.masks.items()}  # fmt: skip
        tables = None if batch.kv_start is not None else batch.block_tables.contiguous()
        return cls(tables, batch.kv_start or 0, batch.block_size, batch.cu_query_lens,
                   batch.context_lens, masks, max(batch.query_lens), max_ctx)  # fmt: skip


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _linear(lin: Linear) -> CLinear:
    packed = cast(PackedWeight, lin.packed)
    return CLinear(int(packed.format), packed.codes.data_ptr(), _ptr(packed.scales),
                   _ptr(lin.bias), lin.out_features, packed.columns)  # fmt: skip


class NativeStack:
    """Decoder layers as layer.c reads them (built once; the tensors stay their owner's), and
    the one call that runs them all."""

    def __init__(self, layers: Sequence[LayerWeights], config: ModelConfig,
                 inv_freq: torch.Tensor, final_norm: torch.Tensor) -> None:  # fmt: skip
        self.config = config
        self.inv_freq = inv_freq  # [head_dim / 2]
        self.final_norm = final_norm  # [hidden]
        self.windows = sorted({layer.window for layer in layers},
                              key=lambda w: -1 if w is None else w)  # fmt: skip
        """The mask of window windows[i] is Keys.masks[i]."""
        structs = [
            CLayer(_ptr(layer.input_norm), _ptr(layer.post_norm), _ptr(layer.q_norm),
                   _ptr(layer.k_norm), _linear(layer.qkv), _linear(layer.o),
                   _linear(layer.gate_up), _linear(layer.down), self.windows.index(layer.window))
            for layer in layers
        ]  # fmt: skip
        self.layers = (CLayer * len(structs))(*structs)

    def run(
        self, batch: ForwardBatch, kv: KVCache, x: torch.Tensor,
        feature_layers: Sequence[int] = (), first_input: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """The residual stream x [T, hidden] (updated in place) through every layer; returns
        the final-normed stream [T, hidden] and the stream entering each layer in
        feature_layers (index num_layers: after the last). first_input: layer 0's normed input
        as given (layer.c's verispec_decoder_stack says when)."""
        final, features, _ = self._stack(batch, kv, x, feature_layers, first_input)
        return final, features

    def logits(
        self, batch: ForwardBatch, kv: KVCache, x: torch.Tensor, head: Linear
    ) -> torch.Tensor:  # fmt: skip
        """As run, then the LM head (can_fold_head) on the rows batch.logits_indices in the
        same native call: logits [L, vocab], bit for bit head(final rows)."""
        return cast(torch.Tensor, self._stack(batch, kv, x, (), None, head)[2])

    def _stack(
        self, batch: ForwardBatch, kv: KVCache, x: torch.Tensor, feature_layers: Sequence[int],
        first_input: torch.Tensor | None, head: Linear | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:  # fmt: skip
        kernel, c, num_layers = loaded(), self.config, len(self.layers)
        plan = KeyPlan.build(batch, set(self.windows))
        rows, hidden = x.shape
        final = torch.empty_like(x)  # [T, hidden]
        features = {i: torch.empty_like(x) for i in feature_layers if i < num_layers}
        features[num_layers] = x  # after the last layer: the stream itself
        captured = (ctypes.c_void_p * num_layers)(*[_ptr(features.get(i))
                                                    for i in range(num_layers)])  # fmt: skip
        masks = (ctypes.c_void_p * len(self.windows))(*[_ptr(plan.masks[w])
                                                        for w in self.windows])  # fmt: skip
        max_blocks = 0 if plan.tables is None else plan.tables.shape[1]
        keys = CKeys(_ptr(plan.tables), plan.block_size, max_blocks, plan.kv_start,
                     plan.cu.data_ptr(), plan.ctx.data_ptr(), len(plan.ctx), masks,
                     len(self.windows), plan.max_q, plan.max_ctx)  # fmt: skip
        kc, vc = ((ctypes.c_void_p * num_layers)(*a) for a in kv.addresses)
        slots, positions = batch.slot_mapping.contiguous(), batch.positions.contiguous()
        logits, picks, linear = None, batch.logits_indices.contiguous(), None
        if head is not None:
            logits = torch.empty(len(picks), head.out_features, dtype=torch.float32)  # [L, V]
            linear = ctypes.byref(_linear(head))
        kernel.lib.verispec_decoder_stack(
            kernel.isa_arg, self.layers, num_layers, kc, vc, x.data_ptr(), _ptr(first_input),
            self.final_norm.data_ptr(), final.data_ptr(), captured, positions.data_ptr(),
            self.inv_freq.data_ptr(), slots.data_ptr(), ctypes.byref(keys), rows, hidden,
            c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps,
            torch.get_num_threads(), linear, picks.data_ptr(), len(picks), _ptr(logits),
        )  # fmt: skip
        return final, [features[i] for i in feature_layers], logits


def greedy_steps(
    model: NativeModel, kv: KVCache, first: Sequence[int], positions: Sequence[int],
    slots: Sequence[Sequence[int]], tables: Sequence[Sequence[int]], block_size: int, limit: int,
) -> list[list[int]]:  # fmt: skip
    """Greedy drafting in one native call (layer.c's verispec_greedy_steps): len(slots) steps
    of one token per sequence, fed first[i], then each step's argmax over the first `limit`
    rows of the head's logits, as a token id through model.vocab_ids where the head covers a
    reduced vocabulary, at positions[i] + step and KV slot slots[step][i] (reserved in
    tables[i], sequence i's block table). Returns the token ids [steps][sequences]: those a
    loop of forwards and argmax_rows would draft, bit for bit the same logits, without Python
    between steps. Needs can_step_greedily(model)."""
    stack, head = cast(NativeStack, model.native), model.lm_head
    kernel, c, num_layers, seqs = loaded(), model.config, len(stack.layers), len(first)
    steps = len(slots)
    width = max(len(t) for t in tables)
    table = torch.tensor([list(t) + [0] * (width - len(t)) for t in tables], dtype=torch.int64)
    cu = torch.arange(seqs + 1, dtype=torch.int64)
    ctx = torch.tensor([p + 1 for p in positions], dtype=torch.int64)  # keys of the first step
    masks = (ctypes.c_void_p * len(stack.windows))()  # none: causal order
    keys = CKeys(table.data_ptr(), block_size, width, 0, cu.data_ptr(), ctx.data_ptr(), seqs,
                 masks, len(stack.windows), 1, int(ctx.max()))  # fmt: skip
    first_t = torch.tensor(list(first), dtype=torch.int64)
    positions_t = torch.tensor(list(positions), dtype=torch.int64)
    slots_t = torch.tensor([list(s) for s in slots], dtype=torch.int64)  # [steps, seqs]
    out = torch.empty(steps, seqs, dtype=torch.int64)
    kc, vc = ((ctypes.c_void_p * num_layers)(*a) for a in kv.addresses)
    kernel.lib.verispec_greedy_steps(
        kernel.isa_arg, stack.layers, num_layers, kc, vc, model.embed.data_ptr(),
        ctypes.byref(_linear(head)), limit, _ptr(model.vocab_ids), stack.final_norm.data_ptr(),
        (ctypes.c_void_p * num_layers)(), first_t.data_ptr(), positions_t.data_ptr(),
        stack.inv_freq.data_ptr(), slots_t.data_ptr(), ctypes.byref(keys), ctx.data_ptr(), steps,
        seqs, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
        c.rms_norm_eps, torch.get_num_threads(), out.data_ptr(),
    )  # fmt: skip
    return out.tolist()


def can_fold_head(model: NativeModel) -> bool:
    """Whether the native stack can run the LM head in its own call (NativeStack.logits):
    eager, the head on the native kernel taking the final-normed rows as they are (no padded
    columns)."""
    head = model.lm_head
    return (
        model.native is not None
        and model.compiled is None
        and head.kernel == "native"
        and _columns(head) == head.in_features == model.config.hidden_size
    )


def can_step_greedily(model: NativeModel) -> bool:
    """Whether greedy_steps can run this model: the head folds in (can_fold_head), no
    sliding window (the steps apply causal order only), a contiguous embedding table, and a
    reduced vocabulary's ids (if any) as int64 that C can read."""
    ids = model.vocab_ids
    return (
        can_fold_head(model)
        and cast(NativeStack, model.native).windows == [None]
        and model.embed.is_contiguous()
        and (ids is None or (ids.dtype == torch.int64 and ids.is_contiguous()))
    )
