"""TemplateWorkers: the processes that render requests' own chat templates
(`--trust-request-chat-template`), each one template at a time (serve/template_worker.py).

A template from a request is code the server did not choose. Jinja's sandbox keeps it from
Python's internals but not from the CPU or from memory: `{{ "x" * 10**10 }}` is one string
operation, and three nested loops are millions of steps with no output to count. So it runs in
a process of its own, whose address space the kernel caps, and which is killed once its time
is up or its client has gone; a new one takes its place. Requests that use the model's own
template never wait for these workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from verispec.serve.template_worker import HEADER

WORKER = Path(__file__).with_name("template_worker.py")
"""The worker's script, run by path (see its docstring)."""
START_TIMEOUT_S = 120.0
"""How long a worker may take to import transformers and say it is ready."""
QUEUE_TIMEOUT_S = 30.0
"""How long a request waits for a free worker before it is answered 429."""

log = logging.getLogger(__name__)


class TemplateTimeout(Exception):
    """A template that did not render within the time limit (its worker was killed)."""


class WorkersBusy(Exception):
    """No worker became free within QUEUE_TIMEOUT_S."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
    ) -> None:
        self.process, self.stdin, self.stdout = process, stdin, stdout

    async def call(self, request: Any) -> Any:
        data = json.dumps(request, ensure_ascii=False).encode("utf-8")
        self.stdin.write(HEADER.pack(len(data)) + data)
        await self.stdin.drain()
        return await self.read()

    async def read(self) -> Any:
        (size,) = HEADER.unpack(await self.stdout.readexactly(HEADER.size))
        return json.loads(await self.stdout.readexactly(size))

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


class TemplateWorkers:
    """`size` worker processes on the serving event loop (start() there); render() hands a
    request to a free one and waits at most `timeout_s` for its answer."""

    def __init__(self, size: int, timeout_s: float, memory_bytes: int) -> None:
        self.size = size
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.workers: set[_Worker] = set()
        """Live workers, idle or rendering."""
        self._idle: asyncio.Queue[_Worker] | None = None
        self._starting: set[asyncio.Task[None]] = set()

    @property
    def num_idle(self) -> int:
        """Workers ready for a request now."""
        return 0 if self._idle is None else self._idle.qsize()

    async def start(self) -> None:
        """Start every worker and wait until they are ready (a worker that cannot start, say
        without transformers, fails the server's start with its error)."""
        self._idle = asyncio.Queue()
        for worker in await asyncio.gather(*(self._spawn() for _ in range(self.size))):
            self.workers.add(worker)
            self._idle.put_nowait(worker)

    async def stop(self) -> None:
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        await asyncio.gather(*(w.kill() for w in list(self.workers)))
        self.workers.clear()

    async def render(self, request: dict[str, Any]) -> dict[str, Any]:
        """A worker's answer to one request (see serve/template_worker.py). A worker that
        overruns is killed (TemplateTimeout), as is one whose caller is cancelled (the client
        left); either is replaced."""
        if self._idle is None:
            raise RuntimeError("start() the template workers first")
        if not self.workers and not self._starting:
            raise RuntimeError("no template worker is running (they failed to restart)")
        try:
            worker = await asyncio.wait_for(self._idle.get(), QUEUE_TIMEOUT_S)
        except TimeoutError:
            raise WorkersBusy from None
        try:
            answer = await asyncio.wait_for(worker.call(request), self.timeout_s)
        except TimeoutError:
            await self._replace(worker)
            raise TemplateTimeout from None
        except BaseException:
            await self._replace(worker)
            raise
        if answer.get("out_of_memory"):
            await self._replace(worker)
        else:
            self._idle.put_nowait(worker)
        return answer

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", str(WORKER), str(self.memory_bytes),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        if process.stdin is None or process.stdout is None:
            raise RuntimeError("a template worker started without its pipes")
        worker = _Worker(process, process.stdin, process.stdout)
        try:
            ready = await asyncio.wait_for(worker.read(), START_TIMEOUT_S)
        except BaseException:
            await worker.kill()
            raise
        if ready != {"ready": True}:
            await worker.kill()
            raise RuntimeError(f"a template worker started with {ready!r}")
        return worker

    async def _replace(self, worker: _Worker) -> None:
        """Kill a worker and start another in its place (in the background)."""
        self.workers.discard(worker)
        await worker.kill()
        task = asyncio.get_running_loop().create_task(self._respawn())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _respawn(self) -> None:
        try:
            worker = await self._spawn()
        except Exception:
            log.exception("a template worker did not restart")
            return
        self.workers.add(worker)
        if self._idle is not None:
            self._idle.put_nowait(worker)
