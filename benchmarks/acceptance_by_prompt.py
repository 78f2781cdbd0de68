"""Output tokens per decode step, per chat prompt, for several drafters (no timing): which
prompts each drafter wins, and what grafting prompt lookups onto the head's tree gives.
Tokens per step counts every target step after the prefill, with or without drafts; the mean
acceptance length (1 + accepted / verify steps) leaves out the steps where prompt lookup found
nothing to draft, which flatters it against a head that drafts every step.
Acceptance does not depend on the machine's load, so this runs beside anything. See
benchmarks/README.md.

    python benchmarks/acceptance_by_prompt.py [--model smollm2-135m-instruct] [--prompts 12]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from verispec import LLM, SamplingParams, SpecConfig
from verispec.bench.workloads import PROMPTS_DIR
from verispec.drafters.registry import HEAD_METHOD, MODEL_FREE_METHOD
from verispec.spec.resolve import own_drafter
from verispec.types.outputs import RequestOutput


def drafters(model: str, k: int, graft: int) -> dict[str, SpecConfig]:
    """Prompt lookup (chain of k), the model's shipped head as a chain of k, with the tree its
    config names (without a lookup), and that tree with a lookup chain of `graft` grafted on."""
    head = own_drafter(model, HEAD_METHOD)
    if head is None:
        raise ValueError(f"{model} ships no {HEAD_METHOD} head; give a named model that does")
    topk, depth = head.tree_topk, head.tree_depth
    nodes = head.num_speculative_tokens - (head.prompt_lookup_tokens or 0)  # the head's own
    lookup = SpecConfig(method=MODEL_FREE_METHOD, num_speculative_tokens=k)
    chain = SpecConfig(method=HEAD_METHOD, model=head.model, num_speculative_tokens=k)
    tree = SpecConfig(method=HEAD_METHOD, model=head.model, num_speculative_tokens=nodes,
                      tree_topk=topk, tree_depth=depth)  # fmt: skip
    both = SpecConfig(method=HEAD_METHOD, model=head.model, num_speculative_tokens=nodes + graft,
                      tree_topk=topk, tree_depth=depth, prompt_lookup_tokens=graft)  # fmt: skip
    shape = f"{topk}x{depth}:{nodes}"
    return {f"{MODEL_FREE_METHOD} k={k}": lookup, f"{HEAD_METHOD} k={k}": chain,
            f"{HEAD_METHOD} {shape}": tree, f"{HEAD_METHOD} {shape}+{graft}": both}


def tokens_per_step(output: RequestOutput) -> float:
    """Output tokens per target step after the prefill (which emits the first token): each
    step emits its accepted drafts + 1. E.g. 96 tokens with 62 drafts accepted: 95 / 33."""
    emitted = output.metrics.num_output_tokens - 1
    return emitted / max(1, emitted - output.metrics.spec.num_accepted_tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=12, help="first N chat prompts")
    parser.add_argument("--k", type=int, default=3, help="chain length")
    parser.add_argument("--graft", type=int, default=4, help="lookup tokens grafted on the tree")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = (PROMPTS_DIR / "chat.jsonl").read_text().splitlines()[: args.prompts]
    rows = [json.loads(line) for line in lines]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=0,
                            max_tokens=args.max_tokens)  # fmt: skip
    lengths: dict[str, list[float]] = {}
    for name, spec in drafters(args.model, args.k, args.graft).items():
        llm = LLM(model=args.model, speculative=spec)
        outputs = llm.chat([r["messages"] for r in rows], params)
        lengths[name] = [tokens_per_step(o) for o in outputs]
    print(f"model={args.model} T={args.temperature} top_p={args.top_p} seed=0 "
          f"max_tokens={args.max_tokens} (output tokens per decode step)")  # fmt: skip
    print("| prompt | " + " | ".join(lengths) + " |")
    print("|---" * (len(lengths) + 1) + "|")
    for i, row in enumerate(rows):
        print(f"| {row['id']} | " + " | ".join(f"{v[i]:.2f}" for v in lengths.values()) + " |")
    means = [sum(v) / len(v) for v in lengths.values()]
    print("| mean | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
