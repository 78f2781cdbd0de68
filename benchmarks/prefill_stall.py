"""A short chat request alone and beside a long prompt submitted just before it (issue 38's
goal: at most twice its time alone), through the engine on the default model.

    python benchmarks/prefill_stall.py                           # 6000-token prompt, 3 repeats
    python benchmarks/prefill_stall.py --arrive-after 2          # the short one 2 s later
    python benchmarks/prefill_stall.py --long-prefill-chunk 64   # another cap
    python benchmarks/prefill_stall.py --no-cap                  # prefills in arrival order

Each repeat times the short request alone (from its submission to its last token), then again
with the long prompt queued just before it, or --arrive-after seconds before it (the long one
prefilling alone meanwhile; a step in flight when the short one arrives counts in its time, as
a server's would); the long one is aborted once the short one is done. Prints every repeat, the
medians, their ratio, the median of the repeats' own ratios (each pair back to back: the measure
that holds on a machine whose load drifts), and how far the long prompt got meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec import LLM, SamplingParams
from verispec.types.chat import chat_prompt

QUESTION = "Give me three tips for writing clear emails."
FILLER = (
    "The harbour office keeps a log of every ship that enters: its name, its cargo, the hour "
    "of arrival, the berth it was given and the name of the pilot who brought it in. "
)


def run_short(llm: LLM, ids: list[int], params: SamplingParams, long_ids: list[int] | None,
              arrive_after: float = 0.0) -> tuple[float, int, int]:  # fmt: skip
    """Seconds from the short request's arrival (arrive_after seconds after the long one's) to
    its last token, its output tokens, and the long prompt's computed tokens by then (0
    without one)."""
    engine = llm.engine
    long = None
    if long_ids is not None:
        long = engine.add_request(long_ids, SamplingParams(temperature=0.0, max_tokens=16))
    started = time.perf_counter() + arrive_after
    while time.perf_counter() < started:
        engine.step()
    short = engine.add_request(ids, params)
    while not short.finished:
        engine.step()
    seconds = time.perf_counter() - started
    progress = 0
    if long is not None:
        progress = long.num_computed_tokens
        engine.abort_request(long)
    return seconds, len(short.output_token_ids), progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long-tokens", type=int, default=6000, help="long prompt (6000)")
    parser.add_argument("--max-tokens", type=int, default=128, help="short answer's limit (128)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions; medians (3)")
    parser.add_argument("--arrive-after", type=float, default=0.0, metavar="S",
                        help="the short request arrives S seconds after the long one (0)")
    parser.add_argument("--long-prefill-chunk", type=int, default=None,
                        help="EngineConfig.long_prefill_chunk (default: the engine's)")  # fmt: skip
    parser.add_argument("--no-cap", action="store_true",
                        help="long_prefill_chunk=None: prefills in arrival order")  # fmt: skip
    args = parser.parse_args()
    options = {}
    if args.no_cap or args.long_prefill_chunk is not None:
        options["long_prefill_chunk"] = None if args.no_cap else args.long_prefill_chunk
    llm = LLM(**options)
    engine = llm.engine
    _, ids = chat_prompt(llm.tokenizer, [{"role": "user", "content": QUESTION}],
                         "default")  # fmt: skip
    filler = engine.tokenizer.encode(FILLER * (args.long_tokens // 20 + 1))
    long_ids = filler[: args.long_tokens]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    print(f"model {engine.model_path.name}, speculation "
          f"{engine.config.speculative.method if engine.config.speculative else 'off'}, "
          f"long_prefill_chunk {engine.config.long_prefill_chunk}, short prompt {len(ids)} "
          f"tokens, long prompt {len(long_ids)} tokens, the short one {args.arrive_after:g} s "
          f"after it, {args.repeats} repeats")  # fmt: skip
    run_short(llm, ids, params, None)  # warm-up: first-step costs, the policy's profile
    alone, beside = [], []
    for i in range(args.repeats):
        a_s, a_n, _ = run_short(llm, ids, params, None)
        b_s, b_n, progress = run_short(llm, ids, params, long_ids, args.arrive_after)
        alone.append(a_s)
        beside.append(b_s)
        print(f"repeat {i}: alone {a_s:.2f} s ({a_n} tokens), beside the long prompt "
              f"{b_s:.2f} s ({b_n} tokens; the long prompt computed {progress} of "
              f"{len(long_ids)} meanwhile), ratio {b_s / a_s:.2f}")  # fmt: skip
    a, b = statistics.median(alone), statistics.median(beside)
    ratios = statistics.median(b_s / a_s for a_s, b_s in zip(alone, beside, strict=True))
    print(f"median: alone {a:.2f} s, beside {b:.2f} s, ratio {b / a:.2f}; the repeats' ratios' "
          f"median {ratios:.2f}, each pair run back to back (goal <= 2)")


if __name__ == "__main__":
    main()
