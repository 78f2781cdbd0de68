"""Does the server's memory stay where start-up said? `verispec serve` (the default model unless
told otherwise) takes waves of concurrent requests, whole, streamed and abandoned in turn, with
new prompts every wave and idle time between waves; its resident memory after each wave (from
/metrics) against the first wave's and against the start line's (issue 45's goal: the last wave
within 10% of the first).

    python benchmarks/soak.py                                  # 12 waves of 32, default model
    python benchmarks/soak.py --waves 4 --requests 8           # shorter
    python benchmarks/soak.py -- --kv-cache-memory 1GiB        # options after -- go to serve
"""

from __future__ import annotations

import argparse
import re
import time

from verispec.bench.soak import SoakConfig, Wave, run_soak, serve_process
from verispec.kv.memory import parse_size

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waves", type=int, default=12, help="waves (12)")
    parser.add_argument("--requests", type=int, default=32, help="requests per wave (32)")
    parser.add_argument("--prompt-words", type=int, default=200,
                        help="words per prompt, all new (200)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (32)")
    parser.add_argument("serve_args", nargs="*", help="options of verispec serve, after --")
    args = parser.parse_args()
    config = SoakConfig(args.waves, args.requests, args.prompt_words, args.max_tokens)
    started = time.perf_counter()
    with serve_process(args.serve_args) as (url, line):
        print(line)
        said = re.search(r"memory: ([\d.]+ \w+) resident", line)
        model = re.search(r"serving (\S+) on", line)
        assert model is not None, line
        print(f"{config.waves} waves of {config.requests} requests (whole, streamed, abandoned "
              f"in turn), {config.prompt_words}-word prompts, {config.max_tokens} tokens")

        def log(wave: Wave) -> None:
            print(f"wave {wave.index:2d}: {wave.seconds:6.1f} s, resident "
                  f"{wave.resident_bytes / MIB:7.1f} MiB, done {dict(wave.done)}"
                  + (f", {len(wave.errors)} errors: {wave.errors[:2]}" if wave.errors else ""),
                  flush=True)  # fmt: skip

        waves = run_soak(url, model.group(1), config, log)
    first, last = waves[0].resident_bytes, waves[-1].resident_bytes
    versus_start = "" if said is None else \
        f", {last / parse_size(said.group(1)) - 1:+.1%} from the start line's {said.group(1)}"
    print(f"resident after wave {len(waves)}: {last / MIB:.1f} MiB, {last / first - 1:+.1%} "
          f"from wave 1's {first / MIB:.1f} MiB (goal: within 10%){versus_start}; "
          f"{time.perf_counter() - started:.0f} s in all")  # fmt: skip


if __name__ == "__main__":
    main()
