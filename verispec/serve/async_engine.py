"""AsyncEngine: one thread steps the continuous-batching engine; asyncio handlers submit
requests and read each request's progress from a queue of their own.

The engine thread owns the Engine: requests are added and aborted by commands it runs between
steps, so no lock is held across a step. After each step it hands every request that got tokens
a StepNews (a snapshot) through its group's asyncio queue, with call_soon_threadsafe: it never
waits for a reader, so a slow client cannot slow the step loop. A request whose client went
away is aborted at the next step and its KV blocks (the target's and the drafter's) freed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import torch

from verispec.api.stream import ProgressTracker, StepNews
from verispec.engine.engine import Engine
from verispec.engine.request import Request
from verispec.serve.metrics import ServerMetrics
from verispec.types.sampling_params import SamplingParams

Command = Callable[[], None]


class EngineError(RuntimeError):
    """A step of the engine failed; the requests it was serving end with this error."""


@dataclass(slots=True, eq=False)
class RequestGroup:
    """The requests of one API call (n choices per prompt, one or more prompts), read as one
    stream of (choice index, StepNews) in the order the engine produced them."""

    loop: asyncio.AbstractEventLoop
    arrival_time: float
    requests: list[Request] = field(default_factory=list)
    queue: asyncio.Queue[tuple[int, StepNews | BaseException]] = field(
        default_factory=asyncio.Queue
    )
    num_finished: int = 0

    @property
    def done(self) -> bool:
        return self.num_finished == len(self.requests)

    async def __aiter__(self) -> AsyncIterator[tuple[int, StepNews]]:
        """(index, news) until every request finished; an engine failure is raised here."""
        while not self.done:
            index, news = await self.queue.get()
            if isinstance(news, BaseException):
                raise news
            if news.output is not None:
                self.num_finished += 1
            yield index, news

    def push(self, index: int, news: StepNews | BaseException) -> None:
        """Hand news to the reader from the engine thread; never blocks."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, news))
        except RuntimeError:  # the reader's event loop is closed: nobody is listening
            pass


@dataclass(slots=True)
class _Tracked:
    group: RequestGroup
    index: int
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    last_time: float | None = None


class AsyncEngine:
    """Runs `engine` in a thread of its own; submit() and abort() are called from asyncio."""

    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._commands: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._tracked: dict[Request, _Tracked] = {}
        self._threads = torch.get_num_threads()  # the creator's: the loop computes with them
        self._thread = threading.Thread(target=self._run, name="verispec-engine", daemon=True)
        """Waits while the loop runs in the engine's compute thread (engine/compute_thread.py)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the engine thread after the commands already queued (unfinished requests stop)."""
        if self._thread.is_alive():
            self._commands.put(None)
            self._thread.join()

    async def submit(
        self, prompts: Sequence[tuple[list[int], str | None]], params: Sequence[SamplingParams]
    ) -> RequestGroup:
        """Queue one request per (token ids, text) with its params, all or none of them: a
        ValueError (an over-long prompt, say) is raised here and nothing stays queued."""
        loop = asyncio.get_running_loop()
        group = RequestGroup(loop=loop, arrival_time=time.perf_counter())
        added: concurrent.futures.Future[None] = concurrent.futures.Future()

        def add() -> None:
            try:
                for index, ((ids, text), p) in enumerate(zip(prompts, params, strict=True)):
                    request = self.engine.add_request(ids, p)
                    request.prompt = text
                    request.arrival_time = group.arrival_time
                    group.requests.append(request)
                    self._tracked[request] = _Tracked(group, index)
            except BaseException as e:
                self._drop(group)
                added.set_exception(e)
            else:
                added.set_result(None)
                self._observe_queue()

        self._commands.put(add)
        await asyncio.wrap_future(added)
        return group

    def abort(self, group: RequestGroup) -> None:
        """Stop a group's unfinished requests at the next step and free their KV blocks."""
        self._commands.put(lambda: self._drop(group))

    def call(self, fn: Callable[[Engine], object]) -> concurrent.futures.Future[object]:
        """Run fn(engine) in the engine thread between steps (reading state consistently)."""
        done: concurrent.futures.Future[object] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(self.engine))
            except BaseException as e:
                done.set_exception(e)

        self._commands.put(run)
        return done

    def _drop(self, group: RequestGroup) -> None:
        for request in group.requests:
            if not request.finished:
                self.engine.abort_request(request)
            self._tracked.pop(request, None)
        self._observe_queue()

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        self.engine.compute(self._loop)

    def _loop(self) -> None:
        while True:
            commands: list[Command | None] = []
            try:  # wait for a command only when there is nothing to step
                commands.append(self._commands.get(block=not self.engine.has_unfinished()))
                while True:
                    commands.append(self._commands.get_nowait())
            except queue.Empty:
                pass
            for command in commands:
                if command is None:
                    return
                command()
            if self.engine.has_unfinished():
                self._step()

    def _step(self) -> None:
        try:
            updated = self.engine.step()
        except Exception as e:  # fail the requests in flight; the server keeps serving
            self._fail_all(e)
            return
        now = time.perf_counter()
        for request in updated:
            tracked = self._tracked.get(request)
            if tracked is None:
                continue
            news = tracked.progress.news(self.engine, request)
            if news is None:
                continue
            if self.metrics is not None:
                self.metrics.observe_news(request, news, tracked.last_time, now)
            tracked.last_time = now
            tracked.group.push(tracked.index, news)
            if news.output is not None:
                del self._tracked[request]
        if self.metrics is not None:
            self.metrics.observe_engine(self.engine)

    def _fail_all(self, error: Exception) -> None:
        failure = EngineError(f"the engine failed during a step: {type(error).__name__}: {error}")
        for request, tracked in list(self._tracked.items()):
            tracked.group.push(tracked.index, failure)
            if not request.finished:
                try:
                    self.engine.abort_request(request)
                except Exception:  # its state may be half-updated; the failure is reported
                    pass
        self._tracked.clear()
        self._observe_queue()

    def _observe_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_engine(self.engine)
