"""`verispec serve`: the OpenAI-compatible server (docs/serving.md)."""

from verispec.serve.api import create_app
from verispec.serve.async_engine import AsyncEngine
from verispec.serve.limits import ServerLimits
from verispec.serve.metrics import ServerMetrics
from verispec.serve.server import Server

__all__ = ["AsyncEngine", "Server", "ServerLimits", "ServerMetrics", "create_app"]
