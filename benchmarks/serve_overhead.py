"""What the HTTP server adds: the same chat prompts, greedy, streamed in-process
(`LLM.chat_stream`) and through `verispec serve`'s API with the official openai client, one
request at a time, interleaved; the answers must be identical.

    python benchmarks/serve_overhead.py                       # SmolLM2 + its drafter, 4 prompts
    python benchmarks/serve_overhead.py --model embedded-code --prompts 4 --max-tokens 96

Prints per path: median TTFT, median mean inter-token time, median tokens/s per request,
and the served/in-process ratios, with the settings. Two engines of the same configuration are
loaded (one per path), so neither path's state affects the other's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai
import torch

from verispec import LLM, SamplingParams
from verispec.bench.workloads import WORKLOADS, ChatPrompt
from verispec.serve import Server


def in_process(llm: LLM, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, list]:
    """(text, [arrival time of each chunk's tokens, one per token]) of one streamed answer."""
    start = time.perf_counter()
    times: list[float] = [start]
    text = ""
    for delta in llm.chat_stream(messages, SamplingParams(temperature=0, max_tokens=max_tokens)):
        text += delta.text
        times += [time.perf_counter()] * len(delta.token_ids)
    return text, times


def served(client: openai.OpenAI, model: str, messages: list, max_tokens: int) -> tuple[str, list]:
    start = time.perf_counter()
    times: list[float] = [start]
    text = ""
    stream = client.chat.completions.create(model=model, messages=messages, stream=True,
                                            temperature=0, max_tokens=max_tokens)  # fmt: skip
    for chunk in stream:
        if not chunk.choices:
            continue
        text += chunk.choices[0].delta.content or ""
        spec = chunk.choices[0].model_extra.get("speculation")
        times += [time.perf_counter()] * (spec["num_tokens"] if spec else 0)
    return text, times


def summary(runs: list[list[float]]) -> tuple[float, float, float]:
    """Medians over runs of [start, token times...]: TTFT s, mean inter-token time after the
    first token s (tokens of one step arrive together), tokens/s from the request's start."""
    ttft = statistics.median(t[1] - t[0] for t in runs)
    gaps = statistics.median((t[-1] - t[1]) / (len(t) - 2) for t in runs)
    tps = statistics.median((len(t) - 1) / (t[-1] - t[0]) for t in runs)
    return ttft, gaps, tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", type=int, default=4, help="chat prompts (4)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per answer (96)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the prompts (3)")
    args = parser.parse_args()
    prompts = [p for p in WORKLOADS["chat"].prompts(args.prompts) if isinstance(p, ChatPrompt)]
    local = LLM(model=args.model)
    with Server(LLM(model=args.model).engine, port=0) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        for p in prompts[:1]:  # warm both paths up
            in_process(local, list(p.messages), 8)
            served(client, server.model_name, list(p.messages), 8)
        runs: dict[str, list[list[float]]] = {"in-process": [], "served": []}
        for _ in range(args.repeats):
            for p in prompts:
                a_text, a = in_process(local, list(p.messages), args.max_tokens)
                b_text, b = served(client, server.model_name, list(p.messages), args.max_tokens)
                if a_text != b_text:
                    raise SystemExit(f"answers differ on {p.id}: {a_text!r} vs {b_text!r}")
                runs["in-process"].append(a)
                runs["served"].append(b)
    spec = local.engine.config.speculative
    print(f"model {args.model or 'smollm2-135m-instruct'}, speculative "
          f"{spec.method if spec else None}, {len(prompts)} chat prompts x {args.repeats}, "
          f"greedy, max_tokens {args.max_tokens}, threads {torch.get_num_threads()}; "
          "answers identical")  # fmt: skip
    print(f"{'path':<12} {'TTFT ms':>8} {'ITL ms':>8} {'tokens/s':>9}")
    rows = {name: summary(r) for name, r in runs.items()}
    for name, (ttft, gap, tps) in rows.items():
        print(f"{name:<12} {1e3 * ttft:>8.1f} {1e3 * gap:>8.1f} {tps:>9.2f}")
    (t0, g0, s0), (t1, g1, s1) = rows["in-process"], rows["served"]
    print(f"served / in-process: TTFT {t1 / t0:.2f}x, ITL {g1 / g0:.2f}x, tokens/s {s1 / s0:.2f}x")


if __name__ == "__main__":
    main()
