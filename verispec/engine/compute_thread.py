"""ComputeThread: the one thread an engine computes in, whichever thread asks it to.

The native kernels parallelise with OpenMP, whose GNU runtime keeps a pool of worker threads
for every thread that starts parallel regions. Once two threads have (the caller that built an
engine, and a server's engine loop), the process has more OpenMP threads than cores, and the
runtime stops spinning between regions: every region then waits for its workers to wake, and a
small model's step becomes several times slower. An engine therefore runs its construction and
its steps in a thread of its own; a call from any other thread is handed to it and waited for.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

R = TypeVar("R")

_Job = tuple[Callable[..., Any], tuple[Any, ...], int, concurrent.futures.Future[Any]] | None


class ComputeThread:
    """A daemon thread that runs the calls handed to it, one at a time, in order; it ends when
    its owner is collected (weakref.finalize on the owner) or close() is called."""

    def __init__(self, name: str = "verispec-compute") -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=_work, args=(self._jobs,), name=name, daemon=True)
        self._thread.start()

    def bind(self, owner: object) -> None:
        """End the thread when `owner` is garbage-collected."""
        weakref.finalize(owner, self._jobs.put, None)

    def run(self, fn: Callable[..., R], *args: Any) -> R:
        """fn(*args) in the compute thread (directly when called from it), with as many torch
        threads as the caller has (torch.set_num_threads is a thread's own under OpenMP); its
        exception is raised here."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        done: concurrent.futures.Future[R] = concurrent.futures.Future()
        self._jobs.put((fn, args, torch.get_num_threads(), done))
        return done.result()

    def close(self) -> None:
        """End the thread once the calls already handed to it have run."""
        self._jobs.put(None)


def _work(jobs: queue.SimpleQueue[_Job]) -> None:
    """The thread's loop: run each job, hand back its result or exception, until None."""
    while (job := jobs.get()) is not None:
        fn, args, threads, done = job
        try:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            done.set_result(fn(*args))
        except BaseException as e:  # handed back to the caller, who raises it
            done.set_exception(e)
        del job, fn, args, done  # hold nothing of the owner between jobs
