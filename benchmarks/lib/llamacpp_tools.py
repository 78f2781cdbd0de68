"""llama.cpp's command-line tools beside verispec on the same GGUF files (benchmarks/real_pair.py):
their command lines and the figures parsed from what they print.

llama-bench times decoding on an empty context. llama-speculative-simple answers one prompt,
read byte for byte from a file (-bf; -f would drop a final newline, which chat templates end
with) with escapes left alone (--no-escape: code holds backslashes); it always tokenizes the
prompt with special tokens parsed, so a chat template's markers become their token ids. It
runs with the draft model (-md), or without one as llama.cpp's plain decoding on the same
prompt: the ngram-simple drafter sized never to fire (NO_DRAFT_NGRAM) leaves every step a
one-token target step, and the parsed draft count proves it.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass

from verispec.bench.engines import Sampling

CONTEXT = 4096
"""llama-speculative-simple's -c: room for any workload prompt and its answer (its default, the
model's own context length, would allocate a KV cache far larger than the workloads need)."""
NO_DRAFT_NGRAM = 1024
"""ngram-simple's lookup length for drafting nothing (llama.cpp's largest): it searches only
once the context holds more than this plus the draft length (--spec-ngram-simple-size-m)
plus one tokens."""
ATTEMPTS = 3
"""Runs of llama-speculative-simple before giving up on a log without its figures."""


@dataclass(frozen=True, slots=True)
class SpeculativeRun:
    """What llama-speculative-simple printed after answering one prompt."""

    decoded: int  # tokens generated (its n_predict)
    seconds: float  # decode time, after the prompt's prefill
    tokens_per_s: float  # its printed speed: decoded / seconds
    drafted: int  # draft tokens verified (n_drafted)
    accepted: int  # of them accepted (n_accept)

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted; None when nothing was drafted (plain decoding)."""
        return self.accepted / self.drafted if self.drafted else None


def parse_speculative_simple(log: str) -> SpeculativeRun:
    """The figures of llama-speculative-simple's log (its stderr), whose lines may start with a
    timestamp and a level, e.g. "0.00.069.646 I decoded   28 tokens in    0.005 seconds, speed:
    5340.454 t/s", "n_drafted = 21", "n_accept  = 21" -> SpeculativeRun(28, 0.005, 5340.454, 21,
    21). Its acceptance line is left alone: it prints nan% when nothing was drafted.
    """
    speed = re.search(r"\bdecoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s",
                      log)  # fmt: skip
    drafted = re.search(r"\bn_drafted\s*=\s*(\d+)\s*$", log, re.M)
    accepted = re.search(r"\bn_accept\s*=\s*(\d+)\s*$", log, re.M)
    if speed is None or drafted is None or accepted is None:
        raise ValueError(
            "llama-speculative-simple printed no 'decoded N tokens in S seconds, speed: X t/s', "
            f"n_drafted and n_accept lines; its log ends: {log[-500:]!r}"
        )
    return SpeculativeRun(int(speed[1]), float(speed[2]), float(speed[3]), int(drafted[1]),
                          int(accepted[1]))  # fmt: skip


def run_speculative_simple(command: list[str], attempts: int = ATTEMPTS) -> SpeculativeRun:
    """Run llama-speculative-simple and parse its figures, running it again when its log came
    back without them: llama.cpp's logger prints from its own thread and is not flushed at exit
    (common/log.cpp), so on a busy CPU a run's last lines can be lost."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for _ in range(attempts - 1):
        log = tool_log(command)  # a failed run raises here, and is not retried
        try:
            return parse_speculative_simple(log)
        except ValueError:
            continue
    return parse_speculative_simple(tool_log(command))


def tool_log(command: list[str]) -> str:
    """What a llama.cpp tool printed to stderr (its log), or ValueError when it failed. Bytes
    that are not UTF-8 are replaced: an answer's token pieces may split a character."""
    done = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace")
    if done.returncode != 0:
        raise ValueError(f"{' '.join(command)} exited with {done.returncode}: "
                         f"{done.stderr[-1000:]}")  # fmt: skip
    return done.stderr


def sampling_flags(sampling: Sampling, seed: int) -> list[str]:
    """llama.cpp's sampler set as verispec's: temperature and top-p only (its default top-k 40
    and min-p 0.05 off), and the prompt's own seed (temperature 0 is greedy)."""
    return ["--temp", f"{sampling.temperature:g}", "--top-p", f"{sampling.top_p:g}",
            "--top-k", "0", "--min-p", "0", "--seed", str(seed)]  # fmt: skip


def no_draft_flags(context_tokens: int) -> list[str]:
    """ngram-simple flags that never draft while the context holds at most context_tokens
    (the prompt, the answer, a margin): llama-speculative-simple then decodes plainly.
    E.g. 1500 -> size-n 1024, size-m 476 (no lookup below 1501 tokens)."""
    size_m = max(1, context_tokens - NO_DRAFT_NGRAM)
    if size_m > NO_DRAFT_NGRAM:
        raise ValueError(
            f"a plain llama-speculative-simple run holds at most {2 * NO_DRAFT_NGRAM} tokens "
            f"(prompt and answer), got {context_tokens}; use a shorter prompt or fewer tokens"
        )
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NO_DRAFT_NGRAM),
            "--spec-ngram-simple-size-m", str(size_m)]  # fmt: skip


def speculative_command(
    binary: str,
    target: str,
    prompt_file: str,
    sampling: Sampling,
    threads: int,
    *,
    seed: int,
    draft: str | None,
    k: int,
    context_tokens: int,
) -> list[str]:
    """llama-speculative-simple's command line for one prompt file: with the draft model
    drafting k tokens a step, or with no draft (draft None; see no_draft_flags)."""
    command = [binary, "-m", target, "-bf", prompt_file, "--no-escape", "-c", str(CONTEXT),
               "-n", str(sampling.max_tokens), "-t", str(threads),
               *sampling_flags(sampling, seed)]  # fmt: skip
    if draft is None:
        return [*command, *no_draft_flags(context_tokens)]
    return [*command, "-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
            "-td", str(threads)]  # fmt: skip


def llama_bench_command(binary: str, model: str, threads: int, tokens: int) -> list[str]:
    """llama-bench timing `tokens` decode steps (tg) from an empty context, as JSON."""
    return [binary, "-m", model, "-t", str(threads), "-p", "0", "-n", str(tokens), "-o", "json"]


def parse_llama_bench(stdout: str) -> float:
    """llama-bench's decode tokens/s (the tg test's avg_ts) from its JSON output."""
    try:
        rows = json.loads(stdout)
        return float(next(r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0))
    except (ValueError, StopIteration, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"llama-bench printed no tg result ({e}): {stdout[-500:]!r}") from None
