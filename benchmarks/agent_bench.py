"""Agents' requests through the OpenAI API: JSON-schema extraction and forced tool calls (the
bench's `agent` workload, verispec/bench/prompts/agent.jsonl), served by a real `verispec
serve` in this process, plain and speculative, every answer checked.

Each configuration runs in a process of its own: it loads the model, serves it on a free port
(prefix caching on, as `verispec serve` runs) and sends every request one at a time, streamed
(raw SSE lines, parsed after the answer); decode
tokens/s is (tokens - 1) / (last chunk - first chunk, the role chunk left out), the median over
the requests of a kind. The speculative run also reports tokens per
step (emitted / target steps) and the share of emitted tokens that were forced drafts the
target accepted. At temperature 0 each speculative answer must equal the plain one (lossless);
every extraction must validate against its schema and every tool call must name the forced
function with arguments its schema accepts. Example:

    python benchmarks/agent_bench.py --model qwen2.5-coder-1.5b-instruct --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import jsonschema
import torch

from verispec import LLM
from verispec.bench.facts import cpu_description
from verispec.bench.workloads import AGENT
from verispec.serve import Server


def kind_of(row: dict[str, Any]) -> str:
    return "tool call" if row.get("tools") else "extraction"


def ask(url: str, model: str, row: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """One streamed request, read as raw Server-Sent Events (each line's arrival time kept,
    the JSON parsed only afterwards, so the client takes little of the CPU it shares with the
    server): its answer (content or the tool call), chunk times, usage and speculation."""
    body = {"model": model, "messages": row["messages"], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            **{k: row[k] for k in ("response_format", "tools", "tool_choice") if k in row}}
    lines: list[tuple[float, str]] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                lines.append((time.perf_counter(), line))
    times, content, name, arguments, usage, spec = [], "", "", "", None, {}
    for t, line in lines:
        chunk = json.loads(line[len("data: "):])
        if chunk.get("usage"):
            usage, spec = chunk["usage"], chunk.get("speculation") or {}
        if chunk["choices"]:  # the role at once, then one a step (text, or nothing while a
            times.append(t)  # tool call is held back until it closes)
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                name += function.get("name") or ""
                arguments += function.get("arguments") or ""
    assert usage is not None, lines[-3:]
    return {"content": content, "name": name, "arguments": arguments, "times": times,
            "tokens": usage["completion_tokens"], "spec": spec}


def check(row: dict[str, Any], answer: dict[str, Any]) -> str | None:
    """Why the answer is invalid, or None."""
    try:
        if kind_of(row) == "extraction":
            schema = row["response_format"]["json_schema"]["schema"]
            jsonschema.validate(json.loads(answer["content"]), schema)
            return None
        wanted = row["tool_choice"]["function"]["name"]
        if answer["name"] != wanted:
            return f"called {answer['name']!r}, not {wanted!r}"
        tool = next(t for t in row["tools"] if t["function"]["name"] == wanted)
        jsonschema.validate(json.loads(answer["arguments"]), tool["function"]["parameters"])
        return None
    except (ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0]


def run_config(args: argparse.Namespace, speculative: str | dict[str, Any] | None,
               rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    """Every row answered by a server of the model with this speculative setting."""
    llm = LLM(model=args.model, speculative=speculative, max_model_len=args.max_model_len,
              enable_prefix_caching=True)  # as `verispec serve` runs by default
    name = args.model or "default"
    with Server(llm.engine, port=0, model_name=name) as server:
        ask(server.url, name, rows[0], 8)  # warm up (compiles the grammar machinery)
        answers = [ask(server.url, name, row, args.max_tokens) for row in rows]
    del llm
    return answers


def in_own_process(one: str) -> list[dict[str, Any]]:
    """This script's answers for one configuration, run in a fresh process: no thread of an
    earlier configuration's engine (with its OpenMP workers) is left to share the cores."""
    command = [sys.executable, __file__, "--one", one, *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {one} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def decode_rate(answer: dict[str, Any]) -> float:
    """Tokens after the first per second, from the first step's chunk to the last's."""
    times = answer["times"][1:]  # the role chunk comes before the prompt is read
    if len(times) < 2 or times[-1] <= times[0]:
        return float("nan")
    return (answer["tokens"] - 1) / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a named model or path (default: the "
                        "default model)")  # fmt: skip
    parser.add_argument("--speculative", default="auto", type=lambda t: t if t == "auto"
                        else json.loads(t), help='the speculative run\'s setting: "auto" (the '
                        "model's default drafter) or a SpecConfig as JSON")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=AGENT.max_tokens)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", choices=["plain", "speculative"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = AGENT.rows()
    if args.one:  # one configuration, in a process of its own: print its answers as JSON
        speculative = None if args.one == "plain" else args.speculative
        print(json.dumps(run_config(args, speculative, rows)))
        return
    print(f"# {cpu_description()}, {args.threads} threads, torch {torch.__version__}")
    plain, spec = (in_own_process(one) for one in ("plain", "speculative"))
    table: dict[str, dict[str, list[float]]] = {}
    invalid = 0
    for row, p, s in zip(rows, plain, spec, strict=True):
        same = all(p[k] == s[k] for k in ("content", "name", "arguments"))
        problems = [m for m in (check(row, p), check(row, s)) if m]
        invalid += bool(problems)
        st = s["spec"]
        accepted, forced = st.get("num_accepted_tokens", 0), st.get("num_accepted_forced_tokens", 0)
        steps = max(1, s["tokens"] - accepted)  # each step emits its accepted drafts + 1
        f = table.setdefault(kind_of(row), {"plain": [], "spec": [], "per_step": [], "forced": []})
        f["plain"].append(decode_rate(p))
        f["spec"].append(decode_rate(s))
        f["per_step"].append(s["tokens"] / steps)
        f["forced"].append(forced / max(1, s["tokens"]))
        print(f"{row['id']:<18} {s['tokens']:>4} tokens  plain {decode_rate(p):7.2f}  "
              f"spec {decode_rate(s):7.2f} tok/s  {s['tokens'] / steps:.2f} tokens/step  "
              f"forced {forced / max(1, s['tokens']):.0%}  {'same' if same else 'DIFFERENT'}"
              f"{'  INVALID: ' + '; '.join(problems) if problems else ''}")  # fmt: skip
        if not same:
            raise SystemExit(f"{row['id']}: the speculative answer differs from plain decoding")
    print(f"\n{'kind':<11} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
          f"{'tokens/step':>11} {'forced':>7}")
    for kind, f in table.items():
        p, s = statistics.median(f["plain"]), statistics.median(f["spec"])
        per_step, forced = statistics.median(f["per_step"]), statistics.median(f["forced"])
        print(f"{kind:<11} {p:>11.2f} {s:>10.2f} {s / p:>5.2f}x {per_step:>11.2f} {forced:>7.0%}")
    print(f"invalid answers: {invalid} of {2 * len(rows)}")


if __name__ == "__main__":
    main()
