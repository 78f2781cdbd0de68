"""Speculative decoding against plain decoding of the same engine, acceptance beside speedup.

Plain and speculative runs alternate in one process (plain, spec, plain, spec, ... per repeat,
after a warm-up); speedup is the median of each spec run's decode tokens/s over the plain run
just before it. See benchmarks/README.md for the model pair, the workload and the columns.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plain_decode import thread_env

from verispec.bench.facts import print_settings, run_facts
from verispec.bench.report import write_json
from verispec.drafters.registry import method_names, takes_model
from verispec.spec.cost import alpha_from_length, predicted_speedup

BENCH = Path.home() / ".cache/verispec/bench"
TEMPERATURES = ((0.0, 1.0), (1.0, 0.95))  # (temperature, top_p)
TARGET_LAYERS, DRAFT_LAYERS = 8, 2
LAYER_SCALE, LAYER_DECAY, HEAD_SCALE = 8.0, 0.7, 20.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, default=None, help="target checkpoint (default: made)")
    p.add_argument("--draft", type=Path, default=None, help="draft checkpoint (default: made)")
    p.add_argument("--draft-noise", type=float, default=None, metavar="SIGMA",
                   help="made draft: full-size copy + SIGMA * std noise, not 2 layers")  # fmt: skip
    p.add_argument("--methods", nargs="+", choices=method_names(), default=list(method_names()))
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write {settings, rows} here")
    args = p.parse_args()
    if (args.target is None) != (args.draft is None):
        p.error("give both --target and --draft, or neither (the made pair)")
    if min(args.prompts, args.repeats, args.threads, *args.k) < 1 or args.max_tokens < 2:
        p.error("--prompts, --repeats, --threads, --k must be >= 1 and --max-tokens >= 2")
    return args


def stdlib_tokenizer() -> Any:
    """The 8192-token byte-level BPE trained on the stdlib sources (as plain_decode.py's)."""
    from verispec.train.tokenizer import train_bpe_tokenizer

    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return train_bpe_tokenizer((s.read_text(errors="replace") for s in sources), vocab_size=8192)


def make_pair(target: Path, draft: Path, noise: float | None) -> None:
    """A random Llama target whose layer i is scaled by LAYER_SCALE * LAYER_DECAY**i (later
    layers refine, as a layer-skip draft assumes) and a head scaled to ~1 nat of entropy; the
    draft is its first DRAFT_LAYERS layers with the same embedding and head, or with noise a
    full-size copy with every matrix plus noise * its std."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from verispec.train.tokenizer import save_tokenizer

    tok = stdlib_tokenizer()
    config = LlamaConfig(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=8, num_key_value_heads=8, vocab_size=len(tok),
        max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for w in layer.parameters():
                if w.dim() == 2:
                    w.mul_(LAYER_SCALE * LAYER_DECAY**i)
        model.lm_head.weight.mul_(HEAD_SCALE)
        small = copy.deepcopy(model)
        if noise is None:
            small.model.layers = small.model.layers[:DRAFT_LAYERS]
            small.config.num_hidden_layers = DRAFT_LAYERS
        else:
            for w in small.parameters():
                if w.dim() == 2:
                    w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    for m, path in ((model, target), (small, draft)):
        if (path / "config.json").is_file():
            continue  # made before: the target is the same for every draft (seeded)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        m.save_pretrained(str(tmp))
        GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id).save_pretrained(str(tmp))  # fmt: skip
        save_tokenizer(tok, tmp)
        tmp.rename(path)


def resolve_pair(target: Path | None, draft: Path | None, noise: float | None) -> tuple[Path, Path]:
    """The given pair, or the made one (created once under ~/.cache/verispec/bench/)."""
    if target is not None and draft is not None:
        return target, draft
    target = BENCH / "spec-target-8l"
    draft = BENCH / (f"spec-draft-noise{noise}" if noise is not None else "spec-draft-2l")
    if not (target / "config.json").is_file() or not (draft / "config.json").is_file():
        print(f"creating {target} and {draft} (random weights, once) ...", file=sys.stderr)
        BENCH.mkdir(parents=True, exist_ok=True)
        make_pair(target, draft, noise)
    return target, draft


def workload(n: int) -> list[str]:
    """n copy-this-code prompts: a stdlib function, then an instruction to copy it and its first
    lines again, so the prompt repeats itself (what prompt lookup feeds on)."""
    prompts = []
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = source.read_text(errors="replace")
        start = text.find("\ndef ")
        if start < 0:
            continue
        snippet = text[start + 1 : start + 700]
        head = "\n".join(snippet.splitlines()[:3])
        prompts.append(f"# {source.name}\n{snippet}\n\n# Copy the function above exactly:\n{head}")
        if len(prompts) == n:
            break
    return prompts


class Timer:
    """Wraps a bound method; keeps each call's wall time and what `classify` says of the call."""

    def __init__(self, fn: Callable[..., Any], classify: Callable[..., Any]) -> None:
        self.fn, self.classify, self.calls = fn, classify, []

    def __call__(self, *args: Any) -> Any:
        t0 = time.perf_counter()
        result = self.fn(*args)
        self.calls.append((time.perf_counter() - t0, self.classify(*args, result=result)))
        return result


def instrument(llm: Any) -> tuple[Timer, Timer | None]:
    """Time every target forward (tagged with its token count) and every propose() (tagged
    with its draft forwards; None for a request's first, which includes the draft's prefill)."""
    engine, seen = llm.engine, set()
    engine.runner.execute = Timer(
        engine.runner.execute,
        lambda sched, result: sum(len(s.token_ids) + len(s.draft_token_ids) for s in sched),
    )

    def draft_forwards(requests: list[Any], ks: list[int], result: Any) -> int | None:
        first = any(r.request_id not in seen for r in requests)
        seen.update(r.request_id for r in requests)
        return None if first else max(ks)

    if engine.proposer is None:
        return engine.runner.execute, None
    engine.proposer.propose = Timer(engine.proposer.propose, draft_forwards)
    return engine.runner.execute, engine.proposer.propose


def run(llm: Any, prompts: list[str], temperature: float, top_p: float, n: int) -> dict:
    """Each prompt alone (concurrency 1); decode tok/s = sum(out - 1) / sum(e2e - TTFT)."""
    from verispec import SamplingParams
    from verispec.types.stats import SpecStats

    stats, tokens, decode_s, ids = SpecStats(), 0, 0.0, []
    for seed, prompt in enumerate(prompts):
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=n, seed=seed,
                                ignore_eos=True)  # fmt: skip
        out = llm.generate(prompt, params)[0]
        stats.merge(out.metrics.spec)
        tokens += out.metrics.num_output_tokens - 1
        decode_s += out.metrics.e2e_s - out.metrics.ttft_s
        ids.append(out.token_ids)
    return {"tok_s": tokens / decode_s, "stats": stats, "ids": ids}


def summarise(cfg: dict, plain_fwd_s: float) -> dict[str, Any]:
    """One table row from a configuration's paired runs and timers."""
    from verispec.types.stats import SpecStats

    med, k = statistics.median, cfg["k"]
    stats = SpecStats()
    for r in cfg["spec"]:
        stats.merge(r["stats"])
    drafts = [t / n for t, n in cfg["propose"].calls if n]
    verify = [t for t, n in cfg["execute"].calls if 1 < n <= 1 + k]
    c = med(drafts) / plain_fwd_s
    alpha = alpha_from_length(stats.mean_acceptance_length, k)
    pairs = list(zip(cfg["plain"], cfg["spec"], strict=True))
    differ = [sum(a != b for a, b in zip(p["ids"], s["ids"], strict=True)) for p, s in pairs]
    return {
        "method": cfg["method"], "k": k, "temperature": cfg["temperature"], "top_p": cfg["top_p"],
        "plain_tok_s": med(r["tok_s"] for r in cfg["plain"]),
        "spec_tok_s": med(r["tok_s"] for r in cfg["spec"]),
        "speedup": med(s["tok_s"] / p["tok_s"] for p, s in pairs),
        "plain_runs_tok_s": [p["tok_s"] for p, _ in pairs],
        "spec_runs_tok_s": [s["tok_s"] for _, s in pairs],
        **stats.to_dict(),
        "draft_cost_ratio": c,
        "verify_cost_ratio": med(verify) / plain_fwd_s if verify else None,
        "predicted_speedup_rate": predicted_speedup(stats.acceptance_rate, k, c),
        "alpha": alpha,
        "predicted_speedup_alpha": predicted_speedup(alpha, k, c),
        "requests_differing_from_plain": max(differ),
    }  # fmt: skip


def num_parameters(path: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "-" if x is None else format(x, spec) + unit


def main() -> None:
    args = parse_args()
    import torch
    import transformers

    from verispec import LLM, SpecConfig

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    target, draft = resolve_pair(args.target, args.draft, args.draft_noise)
    prompts = workload(args.prompts)
    options = {"model": str(target), "dtype": "float32", "device": "cpu", "max_num_seqs": 1,
               "max_model_len": 2048}  # fmt: skip
    plain = LLM(**options)
    plain_execute, _ = instrument(plain)
    configs = []
    for method in args.methods:
        for k in args.k:
            spec = SpecConfig(method=method, num_speculative_tokens=k,
                              model=str(draft) if takes_model(method) else None)  # fmt: skip
            llm = LLM(**options, speculative=spec)
            execute, propose = instrument(llm)
            for temperature, top_p in TEMPERATURES:
                configs.append({"method": method, "k": k, "temperature": temperature,
                                "top_p": top_p, "llm": llm, "execute": execute,
                                "propose": propose, "plain": [], "spec": []})  # fmt: skip
    for cfg in configs:  # warm-up
        for llm in (plain, cfg["llm"]):
            run(llm, prompts[:1], cfg["temperature"], cfg["top_p"], 8)
    for rep in range(args.repeats):
        for cfg in configs:
            t, p, n = cfg["temperature"], cfg["top_p"], args.max_tokens
            cfg["plain"].append(run(plain, prompts, t, p, n))
            cfg["spec"].append(run(cfg["llm"], prompts, t, p, n))
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)

    plain_fwd_s = statistics.median(t for t, n in plain_execute.calls if n == 1)
    rows = [summarise(cfg, plain_fwd_s) for cfg in configs]
    settings = {
        "target": f"{target} ({num_parameters(target):,} parameters)",
        "draft": f"{draft} ({num_parameters(draft):,} parameters)",
        "workload": f"{len(prompts)} copy-this-code prompts (stdlib functions), one at a time "
                    f"(concurrency 1), {args.max_tokens} new tokens each, ignore_eos",
        "sampling": "temperature 0 (greedy); temperature 1.0 with top_p 0.95, seed = prompt index",
        "repeats": args.repeats, "dtype": "float32", "threads": args.threads,
        "plain_forward_ms": f"{1e3 * plain_fwd_s:.2f} (median single-token target forward)",
        "transformers": transformers.__version__,
        **run_facts(load_before), "env": thread_env(),
    }  # fmt: skip
    print_settings(settings)
    print()
    print("| method | k | temp | top_p | plain tok/s | spec tok/s | speedup | accept rate "
          "| mean accept len | per-position | draft cost c | verify cost | pred. (a = rate) "
          "| alpha | pred. (a = alpha) "
          "| greedy != plain |")  # fmt: skip
    print("|---" * 16 + "|")
    for r in rows:
        pos = " ".join(f"{x:.2f}" for x in r["per_position_acceptance_rate"])
        same = r["requests_differing_from_plain"] if r["temperature"] == 0 else "n/a"
        print(f"| {r['method']} | {r['k']} | {r['temperature']:g} | {r['top_p']:g} "
              f"| {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} | {r['speedup']:.2f}x "
              f"| {fmt(r['acceptance_rate'], '.2f')} | {fmt(r['mean_acceptance_length'], '.2f')} "
              f"| {pos or '-'} | {r['draft_cost_ratio']:.3f} "
              f"| {fmt(r['verify_cost_ratio'], '.2f')} "
              f"| {fmt(r['predicted_speedup_rate'], '.2f', 'x')} | {fmt(r['alpha'], '.2f')} "
              f"| {fmt(r['predicted_speedup_alpha'], '.2f', 'x')} | {same} |")  # fmt: skip
    if args.json:
        write_json(args.json, settings, rows)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
