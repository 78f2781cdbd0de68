"""`verispec pull`: fetch a named model into verispec's cache and print its local path."""

from __future__ import annotations

import argparse

from verispec.models.catalog.hub import model_names, pull


def add_pull_parser(sub: argparse._SubParsersAction) -> None:
    """The `pull` subcommand's argument: one of the named models."""
    parser = sub.add_parser(
        "pull", help="fetch a named model into verispec's cache (done on first use otherwise)",
        description=f"Named models: {', '.join(model_names())}. Prints the local path.",
    )  # fmt: skip
    parser.add_argument("name", choices=model_names(), help="model name")


def run_pull(args: argparse.Namespace) -> int:
    """Fetch the model (once) and print where it lies."""
    print(pull(args.name))
    return 0
