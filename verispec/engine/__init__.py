"""The serving loop: requests, scheduler, model runner and engine."""

from verispec.engine.engine import Engine
from verispec.request import Request

__all__ = ["Engine", "Request"]
