"""Prefix caching through the server: chat requests that share a long system prompt, sent one
after another to `verispec serve` with prefix caching off and on; TTFT of each request.

    python benchmarks/prefix_cache.py                   # SmolLM2 + its EAGLE head, as served
    python benchmarks/prefix_cache.py --method ngram    # prompt lookup instead
    python benchmarks/prefix_cache.py --model embedded-code --method none

Prints the settings, then per server: the first request's TTFT (nothing cached yet), the median
TTFT of the later ones, the cache's hit rate, and later-request TTFT off / on. Answers must be
identical with and without the cache (greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

from verispec import LLM
from verispec.serve import Server
from verispec.types.chat import chat_prompt

SYSTEM = (
    "You are the help desk of the Velmar harbour museum. Answer visitors' questions politely "
    "and briefly, using only the facts below.\n"
    + "".join(
        f"Fact {i}: Room {i} shows the harbour as it was in {1820 + 5 * i}, with models of the "
        f"boats, the quay walls and the warehouses of that year, and a map of the town.\n"
        for i in range(1, 22)
    )
)
QUESTIONS = [
    "When was the harbour built?", "What is in room 3?", "Is there a map?",
    "Which room shows 1900?", "Can I see boat models?", "What happened in 1950?",
]  # fmt: skip


def ttft(
    client: openai.OpenAI, model: str, question: str, max_tokens: int, system: str = SYSTEM
) -> tuple[float, str]:
    """(seconds to the first content, the whole answer) of one streamed chat request."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    start, first, text = time.perf_counter(), None, ""
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True,
                                                max_tokens=max_tokens, temperature=0):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text += chunk.choices[0].delta.content
    return (first or time.perf_counter()) - start, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--method", default="auto", choices=("auto", "ngram", "none"),
                        help="drafter: the model's own with adaptive speculation, as `verispec "
                        "serve` runs it (auto, default; SmolLM2: its EAGLE head, whose "
                        "own KV blocks are cached beside the target's), prompt lookup, "
                        "or none")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (16)")
    args = parser.parse_args()
    spec = {"auto": "auto", "none": None,
            "ngram": {"method": "ngram", "num_speculative_tokens": 4}}[args.method]  # fmt: skip
    rows, answers = {}, {}
    for enabled in (False, True):
        llm = LLM(model=args.model, speculative=spec, enable_prefix_caching=enabled)
        with Server(llm.engine, port=0) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
            ttft(client, server.model_name, "Hi", 2, "Be brief.")  # warm-up, another prefix
            times, texts = zip(*(ttft(client, server.model_name, q, args.max_tokens)
                                 for q in QUESTIONS), strict=True)  # fmt: skip
        cache = llm.engine.prefix_cache
        hit_rate = cache.num_hits / cache.num_queries if cache and cache.num_queries else 0.0
        rows[enabled] = (times[0], statistics.median(times[1:]), hit_rate)
        answers[enabled] = texts
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": QUESTIONS[0]}]  # fmt: skip
        prompt_tokens = len(chat_prompt(llm.tokenizer, messages, "model")[1])
    if answers[False] != answers[True]:
        raise SystemExit("answers differ with the prefix cache")
    print(f"model {args.model or 'smollm2-135m-instruct'}, drafter {args.method}, "
          f"{len(QUESTIONS)} chat requests in sequence sharing a system prompt, ~{prompt_tokens} "
          f"prompt tokens each, greedy, max_tokens {args.max_tokens}; answers identical")
    print(f"{'prefix cache':<13} {'first TTFT ms':>13} {'later TTFT ms':>13} {'hit rate':>9}")
    for enabled, (first, later, hit_rate) in rows.items():
        print(f"{'on' if enabled else 'off':<13} {1e3 * first:>13.1f} {1e3 * later:>13.1f} "
              f"{hit_rate:>9.1%}")  # fmt: skip
    print(f"later-request TTFT off / on: {rows[False][1] / rows[True][1]:.1f}x")


if __name__ == "__main__":
    main()
