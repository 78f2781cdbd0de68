"""Structured output beside free text: does speculation pay as much under a JSON schema, and
what does the grammar's mask cost a step?

For each prompt (extraction tasks: a record described in prose, answered as JSON) the same
engine answers four ways, greedy, interleaved per prompt: plain and speculative, without and
with the prompt's JSON schema. It prints tokens/s per configuration (medians over prompts and
rounds), the speculative speedup with and without the schema and their ratio (the issue's goal:
>= 0.9), whether every constrained answer validates (jsonschema), and the mask's own cost: the
time of `GrammarMatcher.masks` for one row and for a verify step's rows, beside a plain step.

    python benchmarks/structured.py                      # the default model, speculative="auto"
    python benchmarks/structured.py --speculative ngram --k 8 --rounds 3
    python benchmarks/structured.py --model qwen2.5-coder-1.5b-instruct --quantization a8
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import jsonschema

from verispec import LLM, SamplingParams, SpecConfig, StructuredOutputsParams

PEOPLE = [
    ("Maria Lopez is a 34-year-old architect from Madrid who speaks Spanish, English and "
     "French; she is not married.", "person"),
    ("Kenji Watanabe, aged 58, works as a carpenter in Osaka. He speaks Japanese only and has "
     "been married for thirty years.", "person"),
    ("Our new hire, Priya Nair (27), is a data analyst based in Bangalore; she speaks Hindi, "
     "Malayalam and English and is single.", "person"),
    ("Tom Becker, 41, a married nurse from Hamburg, speaks German and English.", "person"),
]
BOOKS = [
    ("'The Silent Harbor' by Ana Ribeiro, published in 2019 by Lumen Press, 342 pages, "
     "a mystery novel; in stock.", "book"),
    ("Lumen Press released 'Gardens of Iron', a 512-page science fiction epic by Piotr Nowak, "
     "in 2021. It is out of stock.", "book"),
    ("'A Short History of Bread' (nonfiction, 1998, 220 pages) by Claire Dubois, from Harvest "
     "Books; in stock.", "book"),
    ("Harvest Books, 2023: 'Numbers at Play', a 180-page children's book by Sam Okafor, in "
     "stock.", "book"),
]
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object", "additionalProperties": False,
        "required": ["name", "age", "occupation", "city", "languages", "married"],
        "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "occupation": {"type": "string"}, "city": {"type": "string"},
            "languages": {"type": "array", "items": {"type": "string"}},
            "married": {"type": "boolean"},
        },
    },
    "book": {
        "type": "object", "additionalProperties": False,
        "required": ["title", "author", "year", "publisher", "pages", "genre", "in_stock"],
        "properties": {
            "title": {"type": "string"}, "author": {"type": "string"},
            "year": {"type": "integer"}, "publisher": {"type": "string"},
            "pages": {"type": "integer"}, "genre": {"type": "string"},
            "in_stock": {"type": "boolean"},
        },
    },
}  # fmt: skip


def cpu() -> str:
    """This CPU's model name, family/model and the instruction sets the kernels choose by."""
    info: dict[str, str] = {}
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    flags = set(info.get("flags", "").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if f in flags]
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family')} "
            f"model {info.get('model')}; {' '.join(isa)})")  # fmt: skip


def messages(text: str, kind: str) -> list[dict[str, str]]:
    fields = ", ".join(SCHEMAS[kind]["required"])
    return [{"role": "user", "content": f"Extract the {kind} as a JSON object with the keys "
             f"{fields}.\n\n{text}"}]  # fmt: skip


def run(llm: LLM, msgs: list[dict[str, str]], params: SamplingParams) -> tuple[float, Any]:
    """(tokens/s of the decode, the output) of one answer."""
    out = llm.chat([msgs], params)[0]
    m = out.metrics
    decode_s = (m.e2e_s or 0.0) - (m.ttft_s or 0.0)
    n = max(len(out.token_ids) - 1, 1)
    return n / decode_s if decode_s > 0 else float("nan"), out


def mask_cost(llm: LLM, kind: str, text: str, k: int) -> tuple[float, float]:
    """Median seconds of one row's mask and of a verify step's 1 + k rows, mid-answer."""
    compiler = llm.engine.grammars
    matcher = compiler.matcher(StructuredOutputsParams(json=SCHEMAS[kind]))
    answer = llm.engine.tokenizer.encode(text)
    for token in answer[: len(answer) // 2]:
        matcher.advance(token)
    drafts = answer[len(answer) // 2 : len(answer) // 2 + k]
    one, rows = [], []
    for _ in range(50):
        t = time.perf_counter()
        matcher.masks([[]])
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        matcher.masks([drafts[:j] for j in range(len(drafts) + 1)])
        rows.append(time.perf_counter() - t)
    return statistics.median(one), statistics.median(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model name or path (default: the default)")
    ap.add_argument("--speculative", default="auto", help='"auto" or a method (ngram, ...)')
    ap.add_argument("--k", type=int, default=None, help="drafts per step for a method")
    ap.add_argument("--quantization", default=None, help='e.g. "a8" for a GGUF target')
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    spec: str | SpecConfig = args.speculative
    if args.speculative != "auto":
        options: dict[str, Any] = {"method": args.speculative}
        if args.k is not None:
            options["num_speculative_tokens"] = args.k
        spec = SpecConfig(**options)
    llm = LLM(model=args.model, speculative=spec, quantization=args.quantization)
    print(f"model {args.model or 'default'} ({args.quantization or 'as stored'}), speculative "
          f"{args.speculative}, {cpu()}")  # fmt: skip
    rates: dict[str, list[float]] = {c: [] for c in ("plain", "spec", "plain+json", "spec+json")}
    valid = total = 0
    for _ in range(args.rounds):
        for text, kind in PEOPLE + BOOKS:
            msgs = messages(text, kind)
            schema = StructuredOutputsParams(json=SCHEMAS[kind])
            answers = {}
            for config in rates:
                constraint = schema if "json" in config else None
                params = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                        speculative=config.startswith("spec"),
                                        structured_outputs=constraint)  # fmt: skip
                rate, out = run(llm, msgs, params)
                rates[config].append(rate)
                answers[config] = out
            if answers["spec+json"].token_ids != answers["plain+json"].token_ids:
                raise SystemExit("speculative constrained answer differs from plain")
            total += 1
            try:
                jsonschema.validate(json.loads(answers["spec+json"].text), SCHEMAS[kind])
                valid += 1
            except (ValueError, jsonschema.ValidationError) as e:
                print(f"  invalid ({answers['spec+json'].finish_reason}): {e}")
    med = {c: statistics.median(v) for c, v in rates.items()}
    for c, v in med.items():
        print(f"{c:>11}: {v:7.1f} tok/s (median of {len(rates[c])})")
    free = statistics.median(s / p for s, p in zip(rates["spec"], rates["plain"], strict=True))
    con = statistics.median(
        s / p for s, p in zip(rates["spec+json"], rates["plain+json"], strict=True)
    )
    print(f"speedup without a schema {free:.2f}x, with one {con:.2f}x: ratio {con / free:.2f} "
          f"(goal >= 0.9); valid JSON {valid}/{total}; greedy equal to plain: all")  # fmt: skip
    one, step = mask_cost(llm, PEOPLE[0][1], json.dumps({"name": "Maria Lopez", "age": 34,
                          "occupation": "architect", "city": "Madrid"}), 8)  # fmt: skip
    print(f"mask: {one * 1e6:.0f} us for one row, {step * 1e6:.0f} us for 9 rows (k = 8); a "
          f"plain step {1e3 / med['plain+json']:.1f} ms constrained, "
          f"{1e3 / med['plain']:.1f} ms free")  # fmt: skip


if __name__ == "__main__":
    main()
