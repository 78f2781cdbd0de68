"""`verispec bench`: settings, progress, the run, and its outputs."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

from verispec.bench.engines import HEAD_METHODS, PREFIX_CACHING, parse_tree_shape
from verispec.bench.facts import cpu_description
from verispec.bench.harness import run_bench
from verispec.bench.hf_engine import hf_location
from verispec.bench.plan import ENGINES, BenchConfig, chain_methods
from verispec.bench.report import table, verify_table, write_json, write_plots
from verispec.bench.summary import comparison_notes
from verispec.bench.verify_cost import LLAMA_1B, random_llama, random_llama_125m, verify_cost_curve
from verispec.cli.comma_list import comma_list
from verispec.cli.options import DRAFT_FLAG_VALUES
from verispec.drafters.registry import PLAIN, method_names, takes_draft_model
from verispec.models.weights.loader import load_model
from verispec.types.numerics import AUTO_DRAFT

QUICK = {"plan": "quick", "ks": (4,), "prompts": 3, "max_tokens": 64, "repeats": 2}
VERIFY_REPEATS = {"quick": 3, "full": 10}


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """The `bench` subcommand's options: the plan's, then those of the serving sweep."""
    bench = sub.add_parser(
        "bench", help="benchmark speculative decoding against plain decoding and transformers",
        description="Runs every configuration interleaved with plain decoding of the same engine "
        "(speedups are ratios measured side by side), verispec and transformers on the same "
        "weights and prompts; prints a table, optionally JSON and PNG plots.",
    )  # fmt: skip
    quick = "each method on its home workload, k=4, 3 prompts, 2 repeats"
    bench.add_argument("--quick", action="store_true", help=quick)
    bench.add_argument("--target", "--model", dest="target", default=None,
                       help="target: checkpoint directory, .gguf file or model name "
                       "(embedded-code)")  # fmt: skip
    bench.add_argument("--draft", default=None,
                       help="draft checkpoint or model name (embedded-code-draft)")  # fmt: skip
    bench.add_argument("--draft-quantization", choices=DRAFT_FLAG_VALUES,
                       default=AUTO_DRAFT,
                       help="the draft model's, in its rows and its cost runs (as verispec run "
                       "uses a named model's own draft): auto = w8a8 where the CPU has AVX-512 "
                       "VNNI, else none (as stored)")  # fmt: skip
    bench.add_argument("--workloads", type=comma_list(str), default=None,
                       help="code,edit,free,chat,agentic,code_chat,code_edit (the last "
                       "four: for chat models)")  # fmt: skip
    bench.add_argument("--methods", type=comma_list(str), default=None,
                       help=f"methods ({','.join((PLAIN, *method_names()))}; default: those "
                       "that need no head, and eagle/medusa given --eagle/--medusa)")  # fmt: skip
    bench.add_argument("--k", type=comma_list(int), default=None, help="k values (2,4,8)")
    bench.add_argument("--eagle", default=None, metavar="PATH",
                       help="EAGLE head directory (runs method eagle)")  # fmt: skip
    bench.add_argument("--medusa", default=None, metavar="PATH",
                       help="Medusa heads directory (runs method medusa)")  # fmt: skip
    bench.add_argument("--trees", type=comma_list(str), default=None, metavar="SHAPES",
                       help="eagle/medusa draft trees KxD:N besides each k's chain: topk K, "
                       "depth D, at most N nodes; KxD:N+L (eagle) grafts a prompt-lookup chain "
                       "of up to L more (e.g. 4x6:16,3x4:8+4)")  # fmt: skip
    bench.add_argument("--temperatures", type=comma_list(float), default=None, help="(0,1)")
    bench.add_argument("--top-p", type=float, default=None, help="top-p when sampling (0.95)")
    bench.add_argument("--prompts", type=int, default=None, help="prompts per workload (6)")
    bench.add_argument("--max-tokens", type=int, default=None, help="(each workload's own)")
    bench.add_argument("--repeats", type=int, default=None, help="measured repeats (3)")
    bench.add_argument("--concurrency", type=comma_list(int), default=None, help="(1)")
    bench.add_argument("--engines", type=comma_list(str), default=None,
                       help=f"({','.join(ENGINES)})")  # fmt: skip
    bench.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")
    bench.add_argument("--no-verify-cost", action="store_true", help="skip the q curve")
    bench.add_argument("--json", default=None, metavar="PATH", help="write settings and rows")
    bench.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots")
    serving = bench.add_argument_group(
        "serving mode (--serving): a concurrency sweep through HTTP, speculation settings side "
        "by side; uses --target, --concurrency (1,2,4,8,16,32), --max-tokens (64), --repeats "
        "(rounds, median; 1), --json, --plot"
    )
    serving.add_argument("--serving", action="store_true",
                         help="sweep concurrency through verispec serve instead")  # fmt: skip
    serving.add_argument("--settings", type=comma_list(str), default=None,
                         help="off, auto (adaptive), fixed (the model's own drafter at its k), "
                         "kN (its method as a chain of N) (off,auto,fixed)")  # fmt: skip
    serving.add_argument("--requests", type=int, default=None,
                         help="requests per concurrency and setting (max(8, 2 x concurrency))")
    serving.add_argument("--url", default=None,
                         help="benchmark a running server instead (one setting: its own)")


def run_benchmark(args: argparse.Namespace) -> int:
    """`verispec bench`: the serving sweep with --serving, else the plan the options ask for."""
    if args.serving:
        return run_serving(args)
    return run(bench_config(args), args)


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the options ask for: the quick preset or the full defaults, then any
    explicit option on top; default models are the embedded pair."""
    import torch

    from verispec.cli.options import from_draft_flag
    from verispec.spec.resolve import DraftRuntime

    options: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in ("workloads", "methods", "temperatures", "top_p", "prompts", "max_tokens",
                 "repeats", "concurrency", "engines"):  # fmt: skip
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.k is not None:
        options["ks"] = args.k
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        options["threads"] = args.threads
    else:
        options["threads"] = torch.get_num_threads()
    heads = {m: bench_head(getattr(args, m), f"--{m}") for m in HEAD_METHODS if getattr(args, m)}
    if args.methods is None:  # the default methods, and every method given a head
        options["methods"] = (*chain_methods(), *heads)
    if args.trees is not None:
        options["trees"] = tuple(parse_tree_shape(t) for t in args.trees)
    target = bench_model(args.target, "target", "--target")
    draft = bench_model(args.draft, "draft", "--draft")
    cpu = DraftRuntime(device="cpu", dtype="float32")  # where the bench's rows run
    options["draft_quantization"] = cpu.draft_quantization(from_draft_flag(args.draft_quantization))
    return BenchConfig(target=target, draft=draft, heads=heads, **options)


def bench_model(name: str | None, role: str, flag: str) -> Path:
    """A model to benchmark: a checkpoint directory, a .gguf file, or a named model (fetched
    once into verispec's cache); None = the embedded model of that role (target or draft)."""
    from verispec.models.catalog.default import embedded_model_path
    from verispec.models.weights.loader import resolve_model_path

    if name is None:
        return embedded_model_path(role)
    try:
        return resolve_model_path(name)
    except ValueError as e:
        raise ValueError(f"{flag} {name}: {e}") from None


def bench_head(name: str, flag: str) -> Path:
    """A drafter head directory (or a named head) for a head method; errors name the flag."""
    from verispec.models.weights.loader import resolve_head_path

    try:
        return resolve_head_path(name)
    except ValueError as e:
        raise ValueError(f"{flag} {name}: {e}") from None


def settings(config: BenchConfig) -> dict[str, Any]:
    """Everything needed to read (and rerun) the figures."""
    import torch
    import transformers

    from verispec import __version__

    fields = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()
    }
    if not any(takes_draft_model(m) for m in config.methods):
        fields["draft"] = None  # no row uses it: do not print a model that did not run
        fields["draft_quantization"] = None
    fields["heads"] = {m: str(path) for m, path in config.heads.items()}
    fields["trees"] = [t.label for t in config.trees]
    return {
        **fields,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_description(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "verispec": __version__,
        "prefix_caching": PREFIX_CACHING,
        "llama_cpp_python": _version("llama-cpp-python") if "llamacpp" in config.engines else None,
        "load_average_before": os.getloadavg()[0],
        "command": " ".join(["verispec", *sys.argv[1:]]) if sys.argv else "verispec bench",
    }


def run(config: BenchConfig, args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write JSON and plots when asked."""
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from verispec.bench.workloads import prompt_token_ids
    from verispec.models.catalog.default import embedded_model_path

    torch.set_num_threads(config.threads)
    info = settings(config)
    print(_settings_line(info), file=sys.stderr, flush=True)
    where, gguf = hf_location(config.target)
    tokenizer = AutoTokenizer.from_pretrained(where, **gguf)
    bars: list[Any] = []

    def tick_total(total: int) -> Any:
        bars.append(tqdm(total=total, desc="bench", unit="round", file=sys.stderr))
        return lambda: bars[0].update(1)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    rows = run_bench(config, lambda p: prompt_token_ids(tokenizer, p), log, tick_total)
    for bar in bars:
        bar.close()
    curve: list[dict[str, Any]] = []
    if not args.no_verify_cost:
        repeats = VERIFY_REPEATS[config.plan]
        log("verification-cost curve ...")
        embedded = config.target == embedded_model_path("target")
        models: list[tuple[str, Any]] = [
            ("embedded-target" if embedded else config.target.stem, config.target),
            ("llama-125m-random", random_llama_125m()),
        ]
        if "verispec-a8" in config.engines:  # the a8 engine's own verify steps
            models.insert(1, (f"{models[0][0]}:a8", lambda: load_model(
                config.target, torch.float32, torch.device("cpu"), quantization="a8")))
        if config.plan == "full":  # 4.4 GB of RAM, ~1 min; made in memory each time
            models.append(("llama-1.1b-random", lambda: random_llama(LLAMA_1B)))
        for label, source in models:
            model = source() if callable(source) else source
            curve += [
                dataclasses.asdict(p) for p in verify_cost_curve(model, label, repeats=repeats)
            ]
            del model
    info["load_average_after"] = os.getloadavg()[0]
    print(_settings_line(info))
    print(table(rows))
    notes = comparison_notes(rows)
    for note in notes:
        print(note)
    if curve:
        print("\nverification cost, t(q) / t(1), warm 256-token cache:")
        print(verify_table(curve))
    if args.json:
        write_json(Path(args.json), info, rows, verify_cost=curve, notes=notes)
        log(f"wrote {args.json}")
    if args.plot:
        for path in write_plots(Path(args.plot), rows, curve):
            log(f"wrote {path}")
    return 0


def _version(package: str) -> str | None:
    """An installed distribution's version, None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _settings_line(info: dict[str, Any]) -> str:
    """One line of the settings; the heads (e.g. `eagle=DIR`) and tree shapes when any ran."""
    keys = ("target", "draft", "draft_quantization", "engines", "workloads", "dtype", "threads",
            "plan", "prompts", "max_tokens", "repeats", "top_p", "prefix_caching", "cpu", "torch",
            "transformers", "llama_cpp_python", "load_average_before")  # fmt: skip
    items = [f"{k}={info.get(k)}" for k in keys]
    heads = [f"{m}={path}" for m, path in info.get("heads", {}).items()]
    if info.get("trees"):
        heads.append(f"trees={','.join(info['trees'])}")
    items[2:2] = heads
    return "settings: " + ", ".join(items)


def run_serving(args: argparse.Namespace) -> int:
    """`verispec bench --serving`: the HTTP concurrency sweep (bench/serving.py)."""
    import json

    from verispec.bench.serving import SETTINGS, ServingConfig, plot, rows_json, run_sweep
    from verispec.bench.serving import table as serving_table

    given = [f"--{n.replace('_', '-')}" for n in ("workloads", "methods", "k", "eagle", "medusa",
             "trees", "temperatures", "top_p", "prompts", "engines", "draft")
             if getattr(args, n) not in (None, False)]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given)} do not apply to --serving")
    if args.url is not None and args.settings is not None and len(args.settings) != 1:
        raise ValueError("--url benchmarks one running server: give one --settings name or none")
    for flag, value in (("--requests", args.requests), ("--max-tokens", args.max_tokens),
                        ("--repeats", args.repeats)):  # fmt: skip
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.concurrency is not None and (not args.concurrency or min(args.concurrency) < 1):
        raise ValueError("--concurrency takes integers >= 1, e.g. 1,2,4")
    settings_ = args.settings or (("server",) if args.url else SETTINGS)
    config = ServingConfig(
        model=args.target, settings=tuple(settings_), url=args.url, requests=args.requests,
        concurrency=tuple(args.concurrency or (1, 2, 4, 8, 16, 32)),
        max_tokens=args.max_tokens or 64, repeats=args.repeats or 1,
    )  # fmt: skip
    rows = run_sweep(config, lambda m: print(m, file=sys.stderr, flush=True))
    print(serving_table(rows, config))
    if args.json:
        Path(args.json).write_text(json.dumps(rows_json(rows, config), indent=2))
    if args.plot:
        print(f"wrote {plot(rows, Path(args.plot) / 'serving_sweep.png')}", file=sys.stderr)
    return 0
