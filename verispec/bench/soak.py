"""A soak of a running server: waves of concurrent requests, whole, streamed and abandoned
(a stream the client closes after its first chunk), each wave's prompts new (so a prefix cache
indexes new blocks every wave), idle between waves; after each, the server's resident memory
from its /metrics (process_resident_memory_bytes). benchmarks/soak.py runs it on the default
model, tests/serve/test_soak.py a bounded version on a tiny one."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KINDS = ("whole", "streamed", "abandoned")
"""Request kinds, dealt in turn: an answer read whole, a stream read to its end, and a stream
the client closes after its first chunk (the server must abort it and free its blocks)."""
WORDS = ("harbour ship cargo pilot berth tide anchor crane ledger night morning storm calm "
         "rope mast deck captain clerk office lamp signal river bridge market salt timber "
         "grain coal wool iron copper glass paper ink").split()  # fmt: skip


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak: `waves` waves of `requests` concurrent requests each."""

    waves: int = 12
    requests: int = 32
    prompt_words: int = 200
    """Words per prompt (a few more tokens each); every prompt is new."""
    max_tokens: int = 32
    timeout_s: float = 600.0
    """Longest wait for one request, and for the server to be idle after a wave."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("waves", "requests", "prompt_words", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(slots=True)
class Wave:
    """What one wave did, and the server's resident memory once it was idle again."""

    index: int
    seconds: float
    resident_bytes: int
    done: Counter[str] = field(default_factory=Counter)
    """Requests per kind that got what they asked for (an abandoned one: its first chunk)."""
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def serve_process(
    args: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 600.0
) -> Iterator[tuple[str, str]]:
    """`verispec serve ARGS` as a process of its own on a free local port (env: variables to
    set, e.g. OMP_NUM_THREADS): (url, its start line) once /metrics answers; stopped on exit.
    Its log is read and dropped meanwhile (a full pipe would stall the server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "verispec.cli", "serve", "--port", str(port), *args],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        log: deque[str] = deque(maxlen=20)
        line = None
        for text in process.stderr:
            log.append(text)
            if "verispec: serving" in text:
                line = text
                break
        if line is None:
            raise RuntimeError(f"verispec serve {' '.join(args)} exited before serving:\n"
                               + "".join(log))  # fmt: skip
        # the rest of the log is read and dropped (deque(iterable, 0) consumes it)
        threading.Thread(target=deque, args=(process.stderr, 0), daemon=True).start()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                metrics(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url, line.strip()
    finally:
        process.terminate()
        process.wait(timeout=30)


def metrics(url: str) -> dict[str, float]:
    """{sample name: value} of the server's /metrics, labels dropped (one model per server)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}  # fmt: skip


def resident_bytes(url: str) -> int:
    """The server process's resident memory, from its /metrics."""
    value = metrics(url).get("process_resident_memory_bytes")
    if value is None:
        raise ValueError(f"{url}/metrics has no process_resident_memory_bytes (Linux only)")
    return int(value)


def wait_idle(url: str, timeout_s: float) -> None:
    """Until the server runs and queues no request and holds no KV block (an abandoned
    stream is aborted at the next step)."""
    deadline = time.monotonic() + timeout_s
    names = ("verispec:num_requests_running", "verispec:num_requests_waiting",
             "verispec:kv_cache_usage_perc")  # fmt: skip
    while any(metrics(url).get(name, 0) for name in names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} was not idle {timeout_s:.0f} s after a wave")
        time.sleep(0.1)


def payload(wave: int, index: int, config: SoakConfig, model: str) -> tuple[str, dict]:
    """(route, body) of request `index` of `wave`: chat and completions in turn, a prompt of
    words no other request of the soak has (its number first), greedy."""
    rng = random.Random(f"{config.seed}-{wave}-{index}")
    text = f"Note {wave}-{index}: " + " ".join(rng.choice(WORDS)
                                               for _ in range(config.prompt_words))  # fmt: skip
    body: dict = {"model": model, "max_tokens": config.max_tokens, "temperature": 0}
    if index % 2:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**body, "prompt": text}


def send(url: str, route: str, body: dict, kind: str, timeout_s: float) -> None:
    """One request of `kind`; raises on an error status or a stream without a chunk."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        data = json.dumps({**body, "stream": kind != "whole"}).encode()
        conn.request("POST", route, data, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {response.read()[:200]!r}")
        if kind == "whole":
            json.loads(response.read())
            return
        chunks = 0
        for line in response:
            if line.startswith(b"data: {"):
                chunks += 1
                if kind == "abandoned":
                    return  # the connection closes here, mid-stream
            elif line.startswith(b"data: [DONE]"):
                break
        if not chunks:
            raise RuntimeError("a stream ended without a chunk")
    finally:
        conn.close()


def run_wave(url: str, model: str, wave: int, config: SoakConfig) -> Wave:
    """Send one wave's requests at once, wait for them and for the server to be idle, then
    read its resident memory."""
    kinds = [KINDS[i % len(KINDS)] for i in range(config.requests)]
    start = time.perf_counter()

    def one(i: int) -> str | None:
        """None when request i went as asked, else its error."""
        route, body = payload(wave, i, config, model)
        try:
            send(url, route, body, kinds[i], config.timeout_s)
        except Exception as e:  # a soak reports failures rather than stopping
            return f"{kinds[i]} {i}: {type(e).__name__}: {e}"
        return None

    with ThreadPoolExecutor(config.requests) as pool:
        errors = list(pool.map(one, range(config.requests)))
    seconds = time.perf_counter() - start
    wait_idle(url, config.timeout_s)
    done = Counter(kind for kind, error in zip(kinds, errors, strict=True) if error is None)
    return Wave(wave, seconds, resident_bytes(url), done, [e for e in errors if e])


def run_soak(url: str, model: str, config: SoakConfig,
             log: Callable[[Wave], None] | None = None) -> list[Wave]:  # fmt: skip
    """Every wave in turn (log sees each as it ends)."""
    waves = []
    for wave in range(1, config.waves + 1):
        waves.append(run_wave(url, model, wave, config))
        if log is not None:
            log(waves[-1])
    return waves
