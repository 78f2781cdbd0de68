"""The options of the drafters that are heads over the target's features (EAGLE, Medusa):
the head's directory, and the shape of the trees it drafts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from verispec.config import SpecConfig, SpecError, SpecField


@dataclass(frozen=True, slots=True)
class HeadConfig:
    """A drafter head's options: its directory (or shipped name) and its rounding."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {"model": "model", "quantization": "quantization"}
    model: str | None = None
    quantization: str | None = None
    """As stored unless given ("auto" resolves to as stored for heads)."""

    @classmethod
    def of(cls, spec: SpecConfig) -> HeadConfig:
        return spec.options(cls)


@dataclass(frozen=True, slots=True)
class TreeConfig:
    """A drafted tree's shape: children per node (topk) and levels (depth); topk None or 1 is a
    chain of num_speculative_tokens, which has no depth of its own."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {"topk": "tree_topk", "depth": "tree_depth"}
    DEFAULT_DEPTH: ClassVar[int] = 6
    """A tree's levels when only topk is given (EAGLE-2's default)."""
    topk: int | None = None
    depth: int | None = None

    def __post_init__(self) -> None:
        for name in ("topk", "depth"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise SpecError(SpecField(f"tree_{name}"), f" must be an integer >= 1, got "
                                f"{value!r}")  # fmt: skip
        if self.is_tree and self.depth is None:
            object.__setattr__(self, "depth", self.DEFAULT_DEPTH)
        if self.depth is not None and not self.is_tree:
            raise SpecError(SpecField("tree_depth"), " needs ", SpecField("tree_topk"), " >= 2 (a "
                            "chain's depth is ", SpecField("num_speculative_tokens"),
                            ")")  # fmt: skip

    @property
    def is_tree(self) -> bool:
        """Whether this shape is a tree (topk >= 2), not a chain."""
        return (self.topk or 1) > 1

    @classmethod
    def of(cls, spec: SpecConfig) -> TreeConfig:
        return spec.options(cls)
