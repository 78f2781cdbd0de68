"""Command line: `verispec generate|chat|pull|bench|train|serve|verify ...`; bad input exits 2
with one line. This is the dispatcher: each command's options and run live in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from verispec.cli.bench import add_bench_parser, run_benchmark
from verispec.cli.chat import add_chat_parser, run_chat
from verispec.cli.generate import add_generate_parser, run_generate
from verispec.cli.pull import add_pull_parser, run_pull
from verispec.cli.serve import add_serve_parser, run_serve
from verispec.cli.train import add_train_parser, run_train
from verispec.cli.verify import add_audit_parser, run_audit

EXIT_BAD_INPUT = 2

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": run_train, "bench": run_benchmark, "generate": run_generate, "chat": run_chat,
    "pull": run_pull, "serve": run_serve, "verify": run_audit,
}  # fmt: skip
"""Each subcommand's run: its parsed options -> the exit status."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="verispec", description="Lossless speculative decoding for large language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    add_chat_parser(sub)
    add_pull_parser(sub)
    add_serve_parser(sub)
    add_train_parser(sub)
    add_bench_parser(sub)
    add_audit_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `verispec` command; bad input exits 2 with a one-line message."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ValueError as e:
        print(f"verispec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
