"""A worker process rendering requests' own chat templates for `verispec serve`
(`--trust-request-chat-template`; serve/template_workers.py starts and kills it).

The worker runs this file by path (`python -P template_worker.py MEMORY_BYTES`), never through
the package: importing verispec would load torch and the engine into a process whose only job
is Jinja (the server imports it for the frame format only). It lowers its CPU priority below the
server's, caps its own address space at what it holds after its imports plus MEMORY_BYTES (the
kernel then refuses a template's larger allocation: a MemoryError here, not an out-of-memory
kill of the server), says it is ready, and then answers one request at a time on
stdin/stdout. A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON. A
request is {"template", "messages", "tools", "variables", "max_bytes"} and optionally
"add_generation_prompt" (default true); the answer is {"text"},
{"too_large": bytes} (the text is not sent), {"error": message} or {"out_of_memory": true},
after which the worker exits. Time is bounded by the parent, which kills a worker that has not
answered in time.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
"""A frame's length prefix."""
NICENESS = 10
"""How much lower than the server's the worker's CPU priority is: a template that burns its
whole time limit takes CPU from the engine only when the engine leaves some."""


def read_frame(stream: BinaryIO) -> Any:
    """The next frame's JSON value, or None at the end of the stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    return json.loads(stream.read(size))


def write_frame(stream: BinaryIO, value: Any) -> None:
    data = json.dumps(value, ensure_ascii=False).encode("utf-8")
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def limit_memory(budget: int) -> None:
    """Cap the address space at its current size plus `budget` bytes (Linux's /proc tells the
    size; elsewhere the cap is not set and the parent's timeout alone bounds a render)."""
    try:
        with open("/proc/self/status") as status:
            line = next(x for x in status if x.startswith("VmSize:"))
    except (OSError, StopIteration):
        return
    limit = int(line.split()[1]) * 1024 + budget
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def render(request: dict[str, Any]) -> dict[str, Any]:
    """One request's answer: the rendered text if it fits max_bytes, else its size or the
    template's error."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template(
            conversations=[request["messages"]], tools=request["tools"],
            chat_template=request["template"],
            add_generation_prompt=request.get("add_generation_prompt", True),
            **request["variables"],
        )  # fmt: skip
        text = rendered[0]
        size = len(text.encode("utf-8"))
    except MemoryError:
        raise
    except UnicodeEncodeError:
        return {"error": "the template wrote text that is not valid UTF-8 (a lone surrogate)"}
    except Exception as e:  # the template's own failure, whatever its kind
        return {"error": f"{type(e).__name__}: {e}"}
    if size > request["max_bytes"]:
        return {"too_large": size}
    return {"text": text}


def main() -> None:
    os.nice(NICENESS)  # first: a worker that replaces a killed one imports at this priority
    import transformers.utils.chat_template_utils  # noqa: F401 (loaded before the cap)

    limit_memory(int(sys.argv[1]))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, {"ready": True})
    while (request := read_frame(stdin)) is not None:
        try:
            answer = render(request)
        except MemoryError:
            write_frame(stdout, {"out_of_memory": True})
            return
        write_frame(stdout, answer)


if __name__ == "__main__":
    main()
