"""Whether a large request body holds up other clients: `verispec serve` in a process of its own
gets one prompt of ~10 MB while this script polls GET /health, and prints the latency of
/health before (idle) and while the body is sent, parsed, checked and tokenized.

    python benchmarks/server_health.py                          # the default model, 10 MB
    python benchmarks/server_health.py --model embedded-code --megabytes 2

The prompt is random words (so that the tokenizer's word cache does not make it cheap); it is
longer than any context, so the answer is a 400 (context_length_exceeded) once tokenized, which
is the work a server does for such a body (as a chat message, larger than --max-prompt-bytes,
it is a 413 before it is tokenized). The body limit is raised above the body's size when the
default (16 MiB) is smaller.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import string
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_text(num_bytes: int, seed: int = 0) -> str:
    """About num_bytes of lower-case words of 2-9 letters separated by spaces."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
             for _ in range(50_000)]  # fmt: skip
    mean = sum(len(w) + 1 for w in words) / len(words)
    return " ".join(rng.choices(words, k=int(num_bytes / mean)))


def health_latency(url: str) -> float:
    """Seconds for one GET /health."""
    start = time.perf_counter()
    with urllib.request.urlopen(url + "/health", timeout=120) as response:
        response.read()
    return time.perf_counter() - start


def poll(url: str, seconds: float, interval: float, until: threading.Event | None = None) -> list:
    """/health latencies, one poll every interval, for seconds or until the event is set."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until is not None and until.is_set()):
        latencies.append(health_latency(url))
        time.sleep(interval)
    return latencies


def send(url: str, path: str, body: bytes, result: dict, done: threading.Event) -> None:
    """POST the body; record status, seconds and the start of the answer."""
    request = urllib.request.Request(url + path, body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            result["status"], text = response.status, response.read()
    except urllib.error.HTTPError as e:
        result["status"], text = e.code, e.read()
    result["seconds"] = time.perf_counter() - start
    result["answer"] = text[:160].decode(errors="replace")
    done.set()


def line(name: str, latencies: list[float]) -> str:
    ms = [x * 1000 for x in latencies]
    return (f"{name:>18}: {len(ms):4d} polls, median {statistics.median(ms):7.1f} ms, "
            f"max {max(ms):7.1f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model (default: the default model)")
    parser.add_argument("--megabytes", type=float, default=10.0, help="body size in MB (10)")
    parser.add_argument("--route", choices=["completions", "chat"], default="completions",
                        help="send the text as a prompt or as a chat message (completions)")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between polls")
    parser.add_argument("--idle-seconds", type=float, default=2.0, help="idle polling (2 s)")
    args = parser.parse_args()

    text = random_text(int(args.megabytes * 1e6))
    if args.route == "completions":
        path, fields = "/v1/completions", {"prompt": text, "max_tokens": 1}
    else:
        path = "/v1/chat/completions"
        fields = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    body = json.dumps(fields).encode()
    limit = max(DEFAULT_MAX_REQUEST_BYTES, len(body) + 2**20)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "verispec.cli", "serve", "--port", str(port),
               "--max-request-bytes", str(limit)]  # fmt: skip
    if args.model is not None:
        command += ["--model", args.model]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ}, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                health_latency(url)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    message = f"the server did not start:\n{server.communicate()[1]}"
                    raise SystemExit(message) from None
                time.sleep(0.5)
        idle = poll(url, args.idle_seconds, args.interval)
        result: dict = {}
        done = threading.Event()
        sender = threading.Thread(target=send, args=(url, path, body, result, done))
        sender.start()
        busy = poll(url, 3600, args.interval, until=done)
        sender.join()
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"model: {args.model or 'default'}; body: {len(body) / 1e6:.1f} MB to {path} "
          f"({len(text.split())} words); --max-request-bytes {limit}")
    print(f"the large request: HTTP {result['status']} after {result['seconds']:.2f} s: "
          f"{result['answer']}")
    print(line("/health idle", idle))
    if busy:
        print(line("/health meanwhile", busy))
    else:
        print("/health meanwhile: no poll finished before the large request was answered")


if __name__ == "__main__":
    main()
