"""The numerics' names configs carry: a clear ValueError for a name that is none of them."""

from __future__ import annotations

import pytest

from verispec.types.numerics import AUTO_DRAFT, check_compile, check_quantization


@pytest.mark.parametrize("name", ["int4", "FP16", "", 8])
def test_unknown_quantization_lists_the_allowed_ones(name: object) -> None:
    with pytest.raises(ValueError, match="fp16, int8, q8_0, a8, w8a8, w4a8 or None"):
        check_quantization(name)  # type: ignore[arg-type]


def test_extra_names_are_allowed_and_listed() -> None:
    check_quantization(None)
    check_quantization(AUTO_DRAFT, "speculative quantization", (AUTO_DRAFT,))
    with pytest.raises(ValueError, match=r"speculative quantization must be one of .*, auto or"):
        check_quantization("q4", "speculative quantization", (AUTO_DRAFT,))


def test_compile_is_refused_in_batch_invariant_mode() -> None:
    check_compile(True, False)
    check_compile(False, True)
    with pytest.raises(ValueError, match="cannot be combined with batch_invariant"):
        check_compile(True, True)
