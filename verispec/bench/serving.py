"""`verispec bench --serving`: a concurrency sweep through HTTP. Each speculation setting gets a
`verispec serve` of its own (in this process, one engine each, or a running server at --url);
at each concurrency, every setting in turn receives the same chat workload from that many
streaming clients (the async openai client), interleaved so the machine's drift hits all alike.

Per (setting, concurrency): output throughput, TTFT and inter-token percentiles, goodput
(requests per second meeting both latency targets, printed with them), acceptance rate and
tokens per step from the responses' `speculation`, and the ratio to speculation off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from verispec.config import SpecConfig
from verispec.spec.resolve import resolve_speculative

SETTINGS = ("off", "auto", "fixed")
"""off: plain decoding; auto: the model's own drafter, adaptive; fixed: the same drafter at its
fixed k (or tree). kN: the model's own drafting method as a chain of N tokens."""


@dataclass(frozen=True)
class ServingConfig:
    model: str | None = None
    settings: tuple[str, ...] = SETTINGS
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    requests: int | None = None
    """Requests per (setting, concurrency, round); default max(8, 2 x concurrency)."""
    repeats: int = 1
    """Rounds per concurrency, each running every setting in turn; a row's throughput is the
    median round's, its latencies pooled over rounds."""
    max_tokens: int = 64
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.25
    url: str | None = None


@dataclass
class SweepRow:
    """One setting at one concurrency of the serving sweep: its latencies, goodput and drafts."""

    setting: str
    concurrency: int
    requests: int
    output_tokens: int
    seconds: float
    ttft_p50_s: float
    ttft_p90_s: float
    itl_p50_s: float
    itl_p90_s: float
    goodput_rps: float
    acceptance_rate: float | None
    tokens_per_step: float | None
    ratio_to_off: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.seconds


def spec_for(setting: str, model: str | None) -> SpecConfig | None:
    """The resolved speculative setting a name stands for (ValueError for an unknown one):
    off, auto (the model's own drafter, adaptive), fixed (the same at its k) or kN (the same
    drafter at N tokens a step), each through the one resolver (spec/resolve.py)."""
    if setting == "off":
        return None
    if setting not in ("auto", "fixed") and not (setting.startswith("k") and setting[1:].isdigit()):
        raise ValueError(f"unknown setting {setting!r}; allowed: off, auto, fixed, kN (e.g. k4)")
    own = resolve_speculative(model, "auto")
    if own is None:
        raise ValueError(f"setting {setting!r} needs a model with a drafter of its own; "
                         f"{model} has none (use off)")  # fmt: skip
    if setting == "auto":
        return own
    if setting == "fixed":
        return replace(own, adaptive=False)
    return resolve_speculative(model, "auto", {"num_speculative_tokens": int(setting[1:])})


async def _one(client: Any, model: str, payload: dict, max_tokens: int) -> dict[str, Any]:
    """One streamed request ({"messages"}: chat, {"prompt"}: completion): its TTFT, mean
    inter-token time, tokens and speculation."""
    start = time.perf_counter()
    first = last = None
    tokens = 0
    spec: dict[str, Any] = {}
    api = client.chat.completions if "messages" in payload else client.completions
    stream = await api.create(
        model=model, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, **payload,
    )  # fmt: skip
    async for chunk in stream:
        if chunk.choices:
            step = chunk.choices[0].model_extra.get("speculation")
            if step and step["num_tokens"]:
                now = time.perf_counter()
                first = first or now
                last = now
                tokens += step["num_tokens"]
        elif chunk.usage is not None:
            spec = chunk.model_extra.get("speculation") or {}
    ttft = (first or time.perf_counter()) - start
    itl = (last - first) / (tokens - 1) if first and last and tokens > 1 else 0.0
    return {"ttft": ttft, "itl": itl, "tokens": tokens, "spec": spec}


async def _load(url: str, model: str, prompts: Sequence[dict], requests: int, concurrency: int,
                max_tokens: int) -> tuple[list[dict[str, Any]], float]:  # fmt: skip
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            results.append(await _one(client, model, prompts[i % len(prompts)], max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    await client.close()
    return results, seconds


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile q (0-100) of values; 0 for none.

    >>> _percentile([3.0, 1.0, 2.0], 50), _percentile([1.0, 2.0, 3.0, 4.0], 90)
    (2.0, 4.0)
    """
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _row(setting: str, concurrency: int, results: list[dict], seconds: float,
         config: ServingConfig) -> SweepRow:  # fmt: skip
    drafted = sum(r["spec"].get("num_draft_tokens") or 0 for r in results)
    accepted = sum(r["spec"].get("num_accepted_tokens") or 0 for r in results)
    steps = sum(r["spec"].get("num_verify_steps") or 0 for r in results)
    good = sum(r["ttft"] <= config.ttft_slo_s and r["itl"] <= config.itl_slo_s for r in results)
    ttfts, itls = [r["ttft"] for r in results], [r["itl"] for r in results]
    return SweepRow(
        setting=setting, concurrency=concurrency, requests=len(results),
        output_tokens=sum(r["tokens"] for r in results), seconds=seconds,
        ttft_p50_s=_percentile(ttfts, 50), ttft_p90_s=_percentile(ttfts, 90),
        itl_p50_s=_percentile(itls, 50), itl_p90_s=_percentile(itls, 90),
        goodput_rps=good / seconds, acceptance_rate=accepted / drafted if drafted else None,
        tokens_per_step=1 + accepted / steps if steps else None,
    )  # fmt: skip


def run_sweep(config: ServingConfig, log: Any = print) -> list[SweepRow]:
    """Every setting at every concurrency, interleaved; rows in (concurrency, setting) order."""
    from verispec import LLM
    from verispec.serve import Server

    specs = {} if config.url else {s: spec_for(s, config.model) for s in config.settings}
    servers: dict[str, Any] = {}
    prompts = workload(True)
    try:
        for setting, spec in specs.items():
            llm = LLM(model=config.model, speculative=spec, max_num_seqs=max(config.concurrency))
            servers[setting] = Server(llm.engine, port=0).start()
            prompts = workload(bool(llm.tokenizer.chat_template))
            log(f"serving {setting} at {servers[setting].url}")
        urls = {s: (config.url or servers[s].url) for s in config.settings}
        model = servers[config.settings[0]].model_name if servers else _served_model(config.url)
        for setting in config.settings:  # warm-up: kernels, and the adaptive policy's estimates
            asyncio.run(_load(urls[setting], model, prompts, 4, 2, 16))
        rows: list[SweepRow] = []
        for c in config.concurrency:
            n = config.requests or max(8, 2 * c)
            runs: dict[str, list[tuple[list[dict], float]]] = {s: [] for s in config.settings}
            for _ in range(config.repeats):  # rounds: every setting in turn, drift hits all
                for setting in config.settings:
                    runs[setting].append(asyncio.run(
                        _load(urls[setting], model, prompts, n, c, config.max_tokens)
                    ))  # fmt: skip
                    log(f"concurrency {c:>3} {setting:>6}: "
                        f"{_tokens(runs[setting][-1]):7.1f} tokens/s")  # fmt: skip
            for setting, rounds in runs.items():
                median = sorted(rounds, key=_tokens)[len(rounds) // 2]
                pooled = [r for results, _ in rounds for r in results]
                row = _row(setting, c, pooled, median[1] * len(rounds), config)
                row.output_tokens = sum(r["tokens"] for r in median[0]) * len(rounds)
                row.extra["workload"] = "chat" if "messages" in prompts[0] else "code"
                row.extra["round_tokens_per_s"] = [round(_tokens(x), 2) for x in rounds]
                rows.append(row)
            off = next((r for r in rows if r.concurrency == c and r.setting == "off"), None)
            for r in rows:
                if r.concurrency == c and off is not None:
                    r.ratio_to_off = r.throughput / off.throughput
        return rows
    finally:
        for server in servers.values():
            server.stop()


def _tokens(run: tuple[list[dict], float]) -> float:
    """Output tokens per second of one (results, seconds) run."""
    results, seconds = run
    return sum(r["tokens"] for r in results) / seconds


def workload(chat: bool) -> list[dict[str, Any]]:
    """Request payloads: the chat workload's conversations for a chat model, else the code
    workload's prompts as completions."""
    from verispec.bench.workloads import WORKLOADS, ChatPrompt

    if chat:
        return [{"messages": list(p.messages)} for p in WORKLOADS["chat"].prompts()
                if isinstance(p, ChatPrompt)]  # fmt: skip
    return [{"prompt": p.text} for p in WORKLOADS["code"].prompts(32)
            if not isinstance(p, ChatPrompt)]  # fmt: skip


def _served_model(url: str | None) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def table(rows: list[SweepRow], config: ServingConfig) -> str:
    """The sweep as a text table, with its settings."""
    workload_name = rows[0].extra.get("workload", "chat") if rows else "chat"
    lines = [
        f"model {config.model or 'smollm2-135m-instruct'}, {workload_name} workload, greedy, "
        f"max_tokens "
        f"{config.max_tokens}, streaming through HTTP (async openai client); goodput: TTFT <= "
        f"{config.ttft_slo_s} s and mean inter-token <= {1e3 * config.itl_slo_s:.0f} ms",
        f"{'conc':>4} {'setting':>7} {'req':>4} {'tok/s':>7} {'x off':>6} {'TTFT p50':>8} "
        f"{'p90':>6} {'ITL p50':>7} {'p90':>6} {'goodput':>7} {'accept':>6} {'tok/step':>8}",
    ]
    for r in rows:
        ratio = f"{r.ratio_to_off:.2f}" if r.ratio_to_off is not None else "-"
        acc = f"{r.acceptance_rate:.0%}" if r.acceptance_rate is not None else "-"
        tps = f"{r.tokens_per_step:.2f}" if r.tokens_per_step is not None else "-"
        lines.append(
            f"{r.concurrency:>4} {r.setting:>7} {r.requests:>4} {r.throughput:>7.1f} {ratio:>6} "
            f"{1e3 * r.ttft_p50_s:>8.0f} {1e3 * r.ttft_p90_s:>6.0f} {1e3 * r.itl_p50_s:>7.1f} "
            f"{1e3 * r.itl_p90_s:>6.1f} {r.goodput_rps:>7.2f} {acc:>6} {tps:>8}"
        )
    return "\n".join(lines)


def plot(rows: list[SweepRow], path: Path) -> Path:
    """Throughput and its ratio to speculation off, against concurrency, one line a setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for setting in dict.fromkeys(r.setting for r in rows):
        mine = [r for r in rows if r.setting == setting]
        xs = [r.concurrency for r in mine]
        left.plot(xs, [r.throughput for r in mine], marker="o", label=setting)
        right.plot(xs, [r.ratio_to_off or 0 for r in mine], marker="o", label=setting)
    for ax, title in ((left, "output tokens/s"), (right, "throughput / speculation off")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    right.axhline(1.0, color="grey", lw=0.8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rows_json(rows: list[SweepRow], config: ServingConfig) -> dict[str, Any]:
    return {"settings": asdict(config),
            "rows": [{**asdict(r), "throughput": r.throughput} for r in rows]}  # fmt: skip
