"""Hostile chat templates against `verispec serve` (issue 45): the probe's two templates sent in
chat_template_kwargs, the server's resident memory before and after, and a plain chat's time
alone and beside six clients sending the CPU-bound template over and over.

    python benchmarks/template_bomb.py                  # the default model, a default server
    python benchmarks/template_bomb.py --trust          # --trust-request-chat-template on
    python benchmarks/template_bomb.py --model embedded-code --rounds 5

The server runs in a process of its own. By default it refuses a request's template (a 400
before anything is rendered); with --trust it renders it in a worker process, which stops the
memory template by its size cap and the CPU template by --template-timeout. Resident memory is
the server's (and, with --trust, its template workers') from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

MEMORY_TEMPLATE = '{{ "hello " * 3000000 }}'
CPU_TEMPLATE = ("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(50) %}"
                "{% endfor %}{% endfor %}{% endfor %}hi")  # fmt: skip
CHAT = {"messages": [{"role": "user", "content": "Name three primary colours."}],
        "max_tokens": 16, "temperature": 0}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, float, str]:
    """(status, seconds, the start of the answer) of one chat request."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data,
                                     {"Content-Type": "application/json"})  # fmt: skip
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    return status, time.perf_counter() - start, text[:200].decode(errors="replace")


def with_template(template: str) -> dict:
    return {**CHAT, "max_tokens": 2, "chat_template_kwargs": {"chat_template": template}}


def rss_mb(pid: int) -> tuple[float, float]:
    """(resident MB, peak resident MB) of a process, from /proc."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def memory_line(pid: int) -> str:
    rss, peak = rss_mb(pid)
    kids = [rss_mb(c)[0] for c in children(pid)]
    extra = f"; {len(kids)} worker(s) {sum(kids):.0f} MB" if kids else ""
    return f"server RSS {rss:.0f} MB (peak {peak:.0f} MB){extra}"


def beside_bombs(
    url: str, count: int, again: bool
) -> tuple[float, list[tuple[int, float, str]]]:
    """A plain chat's seconds beside `count` clients each sending the CPU template once, or
    (again) over and over until the chat is answered, from 0.2 s before it; and their answers."""
    bombs: list[tuple[int, float, str]] = []
    done = threading.Event()

    def hammer() -> None:
        bombs.append(post(url, with_template(CPU_TEMPLATE)))
        while again and not done.is_set():
            bombs.append(post(url, with_template(CPU_TEMPLATE)))

    threads = [threading.Thread(target=hammer) for _ in range(count)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    status, seconds, answer = post(url, CHAT)
    done.set()
    for t in threads:
        t.join()
    if status != 200:
        raise SystemExit(f"the plain chat failed: {status} {answer}")
    return seconds, bombs


def seconds_line(seconds: list[float]) -> str:
    return f"{', '.join(f'{s:.2f}' for s in seconds)} s (median {statistics.median(seconds):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model (default: the default model)")
    parser.add_argument("--trust", action="store_true",
                        help="start the server with --trust-request-chat-template")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of each measure (3)")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "verispec.cli", "serve", "--port", str(port)]
    command += ["--model", args.model] if args.model is not None else []
    command += ["--trust-request-chat-template"] if args.trust else []
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ}, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=10).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start:\n{server.communicate()[1]}"
                                     ) from None  # fmt: skip
                time.sleep(0.5)
        for _ in range(2):  # warm up: the first chats compile and profile
            post(url, CHAT)
        print(f"model: {args.model or 'default'}; trust request templates: {args.trust}")
        print(f"after warm-up: {memory_line(server.pid)}")
        for name, template in (("memory", MEMORY_TEMPLATE), ("cpu", CPU_TEMPLATE)):
            for _ in range(args.rounds):
                status, seconds, answer = post(url, with_template(template))
                print(f"{name} template: HTTP {status} in {seconds * 1000:.0f} ms: {answer}")
            print(f"after the {name} template: {memory_line(server.pid)}")
        alone = [post(url, CHAT)[1] for _ in range(args.rounds)]
        print(f"plain chat alone: {seconds_line(alone)}")
        for again, name in ((False, "six at once"), (True, "six clients sending again")):
            beside = []
            for _ in range(args.rounds):
                seconds, bombs = beside_bombs(url, 6, again)
                beside.append(seconds)
                statuses = sorted({s for s, _, _ in bombs})
                times = [t * 1000 for _, t, _ in bombs]
                print(f"  {name}: {len(bombs)} CPU templates answered HTTP {statuses}, median "
                      f"{statistics.median(times):.0f} ms, max {max(times):.0f} ms")
            print(f"plain chat beside {name}: {seconds_line(beside)}")
        print(f"at the end: {memory_line(server.pid)}")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
