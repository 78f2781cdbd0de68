"""`verispec serve`: the OpenAI-compatible server (docs/serving.md)."""

from verispec.serve.api import create_app
from verispec.serve.async_engine import AsyncEngine
from verispec.serve.metrics import ServerMetrics
from verispec.serve.server import Server

__all__ = ["AsyncEngine", "Server", "ServerMetrics", "create_app"]
