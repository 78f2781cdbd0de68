"""`verispec verify`: is speculative decoding of a configuration exact? Runs it against plain
decoding of the same target (a local engine, or a running server) and prints a verdict with its
evidence (verispec/audit/; the rules in docs/verify.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verispec.cli.options import add_model_options, check_arguments, sampling_params
from verispec.config import SpecConfig
from verispec.types.sampling_params import SamplingParams

if TYPE_CHECKING:
    from verispec.api.llm import LLM
    from verispec.audit.report import Report

DEFAULT_TOKENS = 32
"""Greedy: output tokens per prompt."""
DEFAULT_PROMPTS = {"greedy": 4, "sampling": 2}
DEFAULT_SAMPLES = 1000
"""Sampling: speculative samples per prompt (and as many plain ones against a server)."""
SAMPLING_BATCH = 32
"""Sampling, local engine: requests decoded at once (the check's own engine setting)."""

DESCRIPTION = """\
Runs a configuration (the same model, drafter and sampling options as generate) against plain
decoding of the same target and prints a verdict. Exit status: 0 exact, 1 not exact or
inconclusive (no draft was verified), 2 bad usage.

greedy (--temperature 0, the default): each prompt is decoded with speculation and plainly
(--max-tokens each, EOS ignored) and the token ids are compared. With --batch-invariant any
difference fails. Otherwise a verify forward over several tokens may round differently from a
one-token forward, so a difference is accepted as a near tie (float rounding) only if, at the
first differing token, the speculative token's logit under the plain target is within
--tie-tolerance of the plain target's top logit (the top-2 margin is shown too); any other
difference fails.

sampling (--temperature > 0): --samples seeded requests per prompt; the joint distribution of
their first two tokens (the second is the one speculation verifies) is tested against the
target's exact p(t1) p(t2 | t1) under the same temperature, top-p and top-k: a chi-square test
(cells with fewer than 5 expected samples pooled) and a total-variation bound. Each prompt's
tests run at --alpha / prompts (Bonferroni), so an exact configuration fails with probability
at most --alpha. A sample in a token top-k/top-p removes fails too. With --server, samples
with speculation off replace the exact distribution (a two-sample chi-square): the API returns
only the 20 likeliest tokens' logprobs.

An adaptive configuration (a named model's own drafter) is checked at its fixed largest k: the
policy only chooses how many drafts each step verifies, and every k is verified the same way.
"""


def add_audit_parser(sub: argparse._SubParsersAction) -> None:
    """The `verify` subcommand's options."""
    audit = sub.add_parser(
        "verify", help="check that speculative decoding of a configuration is exact",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_model_options(audit, max_tokens=DEFAULT_TOKENS)
    audit.add_argument("--speculative-config", default=None, metavar="JSON",
                       help="speculative decoding as vLLM's JSON object (instead of "
                       "--method/--draft/--k)")  # fmt: skip
    check = audit.add_argument_group("the check")
    check.add_argument("--prompts", default=None, metavar="FILE",
                       help='JSONL, one {"prompt": TEXT} or {"messages": [...]} a line (an '
                       '"id" optional); default: the shipped chat workload for a chat model, '
                       "else the code workload")  # fmt: skip
    check.add_argument("--num-prompts", type=int, default=None, metavar="N",
                       help=f"prompts to check (greedy {DEFAULT_PROMPTS['greedy']}, sampling "
                       f"{DEFAULT_PROMPTS['sampling']}; with --prompts: all)")  # fmt: skip
    check.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, metavar="N",
                       help=f"sampling: samples per prompt ({DEFAULT_SAMPLES})")  # fmt: skip
    check.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="sampling: significance level of the verdict (0.01)",
    )
    check.add_argument("--tie-tolerance", type=float, default=None, metavar="NATS",
                       help="greedy: largest top-2 logit margin a rounding difference may flip "
                       "(float32 0.001, float16 0.03, bfloat16 0.25)")  # fmt: skip
    check.add_argument("--server", default=None, metavar="URL",
                       help="check a running verispec serve (its own model and drafter) "
                       'instead: requests with "speculative": false are the plain '
                       "reference; --batch-invariant says the server runs so")  # fmt: skip
    check.add_argument(
        "--api-key", default=None, help="--server: its API key (default: $VERISPEC_API_KEY)"
    )
    check.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (all cores; 1 is much faster on a busy machine)",
    )
    check.add_argument("--json", default=None, metavar="PATH",
                       help="also write the report as JSON")  # fmt: skip
    audit.set_defaults(local_defaults={f: audit.get_default(_dest(f)) for f in SERVER_EXCLUSIVE})


def _dest(flag: str) -> str:
    """The attribute argparse stores a long option under."""
    return flag[2:].replace("-", "_")


def run_audit(args: argparse.Namespace) -> int:
    """Run the check; print the report; 0 when exact, 1 otherwise."""
    from verispec.audit.report import DEFAULT_ALPHA

    started = time.perf_counter()
    params = sampling_params(args)
    mode = "greedy" if params.greedy else "sampling"
    alpha = DEFAULT_ALPHA if args.alpha is None else args.alpha
    num_prompts = _check_numbers(args, mode, alpha)
    json_path = Path(args.json) if args.json else None
    if json_path is not None and not json_path.parent.is_dir():
        raise ValueError(f"--json: directory {json_path.parent} does not exist")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.server is not None:
        report = _audit_server(args, params, mode, num_prompts, alpha)
    else:
        report = _audit_local(args, params, mode, num_prompts, alpha)
    report.seconds = time.perf_counter() - started
    report.decide()
    print(report.text(), flush=True)
    if json_path is not None:
        report.write_json(json_path)
    return report.exit_code


def _check_numbers(args: argparse.Namespace, mode: str, alpha: float) -> int | None:
    """Refuse counts and levels out of range; the number of prompts asked for (None: all of
    a --prompts file)."""
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.samples < 20:
        raise ValueError(f"--samples must be >= 20 (a chi-square needs counts), got "
                         f"{args.samples}")  # fmt: skip
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha must be in (0, 1), got {alpha}")
    if args.tie_tolerance is not None and not args.tie_tolerance >= 0:
        raise ValueError(f"--tie-tolerance must be >= 0, got {args.tie_tolerance}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.num_prompts is not None or args.prompts is not None:
        return args.num_prompts
    return DEFAULT_PROMPTS[mode]


def audit_spec(args: argparse.Namespace) -> tuple[SpecConfig, str | None]:
    """The configuration's SpecConfig with the adaptive policy off (and a note saying so);
    ValueError when it decodes plainly, leaving nothing to audit."""
    from verispec.cli.options import spec_config

    spec = spec_config(args)  # resolved: "auto" is the model's own drafter, adaptive
    if spec is None:
        raise ValueError(
            "this configuration decodes plainly (no drafter), so there is nothing "
            "to verify; give --draft, --method or a model with its own drafter"
        )
    note = None
    if spec.adaptive:
        spec = replace(spec, adaptive=False)
        note = (f"off for the check (k fixed at {spec.num_speculative_tokens}: the policy only "
                "chooses how many drafts a step verifies)")  # fmt: skip
    return spec, note


def _audit_local(
    args: argparse.Namespace, params: SamplingParams, mode: str, num_prompts: int | None,
    alpha: float,
) -> Report:  # fmt: skip
    from verispec.audit import local_check
    from verispec.audit.prompts import choose_prompts, read_prompts
    from verispec.audit.report import Check, Report
    from verispec.bench.workloads import prompt_token_ids

    check_arguments(args)
    spec, note = audit_spec(args)
    given = read_prompts(args.prompts) if args.prompts else None
    llm = _load(args, spec, mode)
    has_template = bool(getattr(llm.tokenizer, "chat_template", None))
    prompts, source = choose_prompts(args.prompts, given, has_template, num_prompts)
    ids = [(p.id, prompt_token_ids(llm.tokenizer, p)) for p in prompts]
    dtype = str(llm.engine.model.dtype).removeprefix("torch.")
    check = Check(params, args.samples, alpha, _tolerance(args, dtype), args.batch_invariant)
    settings = _local_settings(args, llm, spec, note)
    settings |= {"prompts": f"{len(prompts)} ({source})", **check.settings()}
    report = Report(mode, "plain decoding of the same engine", settings)
    print(f"checking {len(prompts)} prompts ({mode}) ...", file=sys.stderr, flush=True)
    report.add(*local_check.run(llm, ids, check))
    return report


def _load(args: argparse.Namespace, spec: SpecConfig, mode: str) -> LLM:
    """The configuration's LLM; for sampling, one that decodes many short requests at once and
    computes the shared prompt's KV once (prefix caching, exact)."""
    from verispec import LLM
    from verispec.cli.options import from_draft_flag

    options: dict[str, Any] = {}
    if mode == "sampling":
        tokens = SAMPLING_BATCH * (1 + spec.num_speculative_tokens) + 512  # every k fits a step
        options = {"max_num_seqs": SAMPLING_BATCH, "max_num_batched_tokens": tokens,
                   "enable_prefix_caching": True}  # fmt: skip
    print(f"loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    return LLM(model=args.model, dtype=args.dtype, device=args.device,
               max_model_len=args.max_model_len, progress=True, speculative=spec,
               batch_invariant=args.batch_invariant,
               quantization=from_draft_flag(args.quantization), compile=args.compile,
               **options)  # fmt: skip


def _local_settings(
    args: argparse.Namespace, llm: LLM, spec: SpecConfig, note: str | None
) -> dict[str, Any]:
    from verispec.models.catalog.hub import DEFAULT_MODEL
    from verispec.models.kernels.quantization import numerics_name

    engine = llm.engine
    settings = {
        "model": args.model or f"{DEFAULT_MODEL} (the default)",
        "dtype": str(engine.model.dtype).removeprefix("torch."), "device": str(engine.device),
        "speculation": describe_spec(spec), "adaptive policy": note,
        "batch-invariant": args.batch_invariant,
        "numerics": numerics_name(engine.config.quantization),
        "compile": args.compile,
    }  # fmt: skip
    return {k: v for k, v in settings.items() if v is not None}


SERVER_EXCLUSIVE = ("--model", "--dtype", "--device", "--max-model-len", "--quantization",
                    "--draft", "--method", "--k", "--prompt-lookup-min", "--prompt-lookup-max",
                    "--tree-topk", "--tree-depth", "--prompt-lookup-tokens",
                    "--draft-quantization", "--draft-vocab-size", "--compile",
                    "--speculative-config")  # fmt: skip
"""Options that choose a local engine: the server's own configuration is the one checked."""


def _audit_server(
    args: argparse.Namespace, params: SamplingParams, mode: str, num_prompts: int | None,
    alpha: float,
) -> Report:  # fmt: skip
    from verispec.audit import server_check
    from verispec.audit.client import ServerClient
    from verispec.audit.prompts import choose_prompts, read_prompts
    from verispec.audit.report import Check, Report

    local = [f for f, default in args.local_defaults.items() if getattr(args, _dest(f)) != default]
    if local:
        raise ValueError(f"--server checks the server's own model and drafter; drop "
                         f"{', '.join(local)}")  # fmt: skip
    api_key = args.api_key if args.api_key is not None else os.environ.get("VERISPEC_API_KEY")
    client = ServerClient(args.server, api_key)
    given = read_prompts(args.prompts) if args.prompts else None
    name = server_check.model_name(client)
    chat = server_check.takes_chat(client)
    prompts, source = choose_prompts(args.prompts, given, chat, num_prompts)
    check = Check(params, args.samples, alpha, _tolerance(args, "float32"), args.batch_invariant)
    settings = {"server": client.url, "model": name, "batch-invariant": args.batch_invariant,
                "prompts": f"{len(prompts)} ({source})", **check.settings()}  # fmt: skip
    report = Report(mode, 'the same server with "speculative": false', settings)
    report.add(*server_check.run(client, prompts, check))
    return report


def _tolerance(args: argparse.Namespace, dtype: str) -> float:
    from verispec.audit.report import TIE_TOLERANCE

    if args.tie_tolerance is not None:
        return float(args.tie_tolerance)
    return TIE_TOLERANCE.get(dtype, TIE_TOLERANCE["float32"])


def describe_spec(spec: SpecConfig) -> str:
    """'eagle, k=14 (tree 4x6, prompt lookup 6), draft PATH' and the like."""
    parts = [f"{spec.method}, k={spec.num_speculative_tokens}"]
    if (spec.tree_topk or 1) > 1:
        lookup = f", prompt lookup {spec.prompt_lookup_tokens}" if spec.prompt_lookup_tokens else ""
        parts.append(f" (tree {spec.tree_topk}x{spec.tree_depth or 6}{lookup})")
    if spec.model:
        parts.append(f", draft {spec.model}")
    return "".join(parts)
