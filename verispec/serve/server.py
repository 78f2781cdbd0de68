"""Server: the API on uvicorn, in the foreground (`verispec serve`) or in a thread of its own
(tests, notebooks: `with Server(engine) as server: ... server.url`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import uvicorn

from verispec.engine.engine import Engine
from verispec.models.catalog.hub import DEFAULT_MODEL
from verispec.serve.api import create_app
from verispec.serve.async_engine import AsyncEngine
from verispec.serve.limits import ServerLimits
from verispec.serve.metrics import ServerMetrics

STARTUP_TIMEOUT_S = 30.0


def served_name(engine: Engine) -> str:
    """The name clients use for the model: what --model said, or the default model's name."""
    return engine.config.model or DEFAULT_MODEL


class Server:
    """One engine behind the OpenAI-compatible API on host:port (port 0: a free one); browsers
    on `allowed_origins` may call it (CORS; none by default)."""

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        model_name: str | None = None,
        log_level: str = "warning",
        limits: ServerLimits | None = None,
        allowed_origins: Sequence[str] = (),
    ) -> None:
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key must not be empty (omit it to serve without a key)")
        if not 0 <= port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        self.model_name = model_name or served_name(engine)
        self.metrics = ServerMetrics(self.model_name)
        self.engine = AsyncEngine(engine, self.metrics)
        self.limits = limits or ServerLimits()
        self.app = create_app(self.engine, self.model_name, api_key, self.limits,
                              allowed_origins)  # fmt: skip
        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=1)  # fmt: skip
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """http://host:port of the listening socket (the real port when 0 was asked)."""
        host, port = self._uvicorn.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def run(self) -> None:
        """Serve in the foreground until interrupted (Ctrl-C)."""
        self.engine.start()
        try:
            self._uvicorn.run()
        finally:
            self.engine.stop()

    def start(self) -> Server:
        """Serve from a background thread; returns once the socket listens."""
        self.engine.start()
        self._thread = threading.Thread(target=self._uvicorn.run, name="verispec-http",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the HTTP server did not start (is the port in use?)")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop listening, end open streams, and stop the engine thread."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self.engine.stop()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
