"""comma_list: the argparse type of options that take comma-separated values (bench's and
serve's lists), one spelling and one error message for all of them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def comma_list(kind: type) -> Callable[[str], tuple[Any, ...]]:
    """An argparse type for comma-separated values: '2,4,8' -> (2, 4, 8)."""

    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__}s, got {text!r}"
            ) from None

    return parse
