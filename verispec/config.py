"""Engine, cache and speculative configuration dataclasses: a leaf, importing only the
numerics' names (types/numerics.py). Each dataclass checks only its own fields (ValueError, never
asserts); each method's options live beside its drafter, which options a method reads is the
registry's, and what "auto" means for a model the resolver's (drafters/registry.py,
spec/resolve.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from verispec.types.numerics import (
    AUTO_DRAFT,
    AUTO_NUMERICS,
    LinearBackend,
    check_compile,
    check_quantization,
    quantization_problem,
)

MAX_SPECULATIVE_TOKENS = 16
MAX_TREE_NODES = 64


@dataclass(slots=True)
class CacheConfig:
    """Paged KV cache geometry."""

    block_size: int = 16
    """Tokens per KV block."""
    num_blocks: int | None = None
    """Blocks in the target's cache; None = as many as kv_cache_memory holds."""
    kv_cache_memory: int | None = None
    """Bytes of the target's KV pool (vLLM's kv_cache_memory_bytes), committed at start so the
    process's memory does not grow under load; it must hold one sequence of max_model_len.
    None = enough for max_num_seqs sequences of max_model_len, but at most a tenth of the
    device's memory (kv/memory.py, DEFAULT_KV_FRACTION) and at least one sequence. A drafter
    with a KV cache of its own sizes it to match (reported beside it: Engine.kv_memory)."""

    def __post_init__(self) -> None:
        if not _positive_int(self.block_size):
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if self.num_blocks is not None and not _positive_int(self.num_blocks):
            raise ValueError(f"num_blocks must be an integer >= 1 or None, got {self.num_blocks!r}")
        memory = self.kv_cache_memory
        if memory is not None and not _positive_int(memory):
            raise ValueError(f"kv_cache_memory must be a number of bytes (an integer >= 1), e.g. "
                             f"2 * 2**30 for 2 GiB, or None for the default; got "
                             f"{memory!r}")  # fmt: skip
        if memory is not None and self.num_blocks is not None:
            raise ValueError("give num_blocks or kv_cache_memory, not both: each sizes the KV "
                             "cache")  # fmt: skip


def _positive_int(value: object) -> bool:
    """An int >= 1 that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine needs besides the requests."""

    model: str | None = None
    """Checkpoint directory, .gguf file, named model (verispec/models/catalog/hub.py) or hub id;
    None = the default model (SmolLM2-135M-Instruct, fetched once)."""
    dtype: str = "auto"
    """auto (float32 on CPU, bfloat16 on GPU), float32, float16 or bfloat16."""
    device: str = "auto"
    """auto (cuda when available, else cpu), cpu, cuda, cuda:N."""
    max_model_len: int | None = None
    """Longest prompt + output in tokens; None = the model's max_position_embeddings."""
    max_num_seqs: int = 8
    """Most requests decoding at once (continuous batching)."""
    max_num_batched_tokens: int = 512
    """Most new tokens in one forward; longer prompts are prefilled in chunks of this size."""
    long_prefill_chunk: int | None = 256
    """A prefill with more tokens left than this, or more than one left past this many tokens
    of context, is long: in a step that also serves other requests it comes after their decodes
    and short prompts, and computes at most this many tokens, fewer when measured step times say
    so (engine/prefill_pace.py: such a step costs about 1.3 times one without it; on a CPU a
    prompt token at a long context costs about a decode step, so a fixed chunk of dozens of
    tokens would multiply every decode step). Alone, it takes up to max_num_batched_tokens in
    steps of about 32 one-token steps' time, so a request arriving meanwhile waits little. 256
    holds a chat turn, which so is never paced. None = no long prompts: prefills in arrival
    order with the whole budget."""
    seed: int = 0
    """Seed for requests that bring none of their own."""
    linear_backend: LinearBackend = "auto"
    """Kernel for linear layers: auto, torch, onednn (prepacked), fp16 (float16-stored
    weights, float32 compute; only for weights float16 holds exactly) or native (verispec's
    own packed kernel, float16-stored where exact; built with the system's C compiler); the
    last three float32 on CPU only. auto picks native on Intel CPUs (also when compiling),
    elsewhere fp16, else onednn, per weight on a float32 CPU, else torch."""
    quantization: str | None = AUTO_NUMERICS
    """The target's numerics. "auto" (the default): "a8" for a GGUF file of quantized blocks on
    the CPU (each product's input rounded to 8-bit blocks, as llama.cpp computes it; the same
    bits on every instruction set), else None (loader.resolve_quantization); the engine's config
    holds what it resolved to. None: exact float inputs, weights as stored. Or round the
    linear weights at load: fp16, int8 (per channel), q8_0 (GGUF's 8-bit blocks of 32), w8a8
    or w4a8. Output is lossless with respect to the model that runs, not the checkpoint."""
    batch_invariant: bool = False
    """Compute every token row on its own so its logits never depend on its batch mates
    (bit-exact greedy equality between speculative and plain decoding; slower)."""
    compile: bool = False
    """Run the target's decoder stack (and a draft model's, an EAGLE head's step) through
    torch.compile: fused elementwise work and fewer operator calls per step, after compiling
    each new step shape (about a minute for the embedded pair, minutes for SmolLM2 on 2 cores;
    inductor caches the result on disk). Needs a C++ compiler on the CPU; falls back to eager
    with a warning when compilation fails. Not with batch_invariant."""
    enable_prefix_caching: bool = False
    """Reuse the KV blocks of prompt prefixes other requests computed (exact: output is the
    same as without; docs/design.md, 5). Off by default in the library, whose benchmarks repeat
    prompts; on by default in `verispec serve`. Works with every drafter: with an EAGLE head a
    prefix hit reuses as many blocks as the head's own cache also holds
    (engine/drafter.py, DrafterPrefix)."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    speculative: SpecConfig | ResolvedSpec | Literal["auto"] | None = "auto"
    """Speculative decoding; None = plain autoregressive decoding; "auto" = a named model's own
    drafter (prompt lookup for the default chat model, the embedded draft for embedded-code),
    plain decoding for any other model. The API layer resolves it once (spec/resolve.py) and
    the engine takes only the ResolvedSpec that says so, or None; its own config then holds
    the SpecConfig that runs."""

    def __post_init__(self) -> None:
        check_quantization(self.quantization, extra=(AUTO_NUMERICS,))
        check_compile(self.compile, self.batch_invariant)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        chunk = self.long_prefill_chunk
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool)
                                  or chunk < 1):  # fmt: skip
            raise ValueError(f"long_prefill_chunk must be an integer >= 1 (the most tokens a "
                             f"long prompt prefills in a step beside other requests) or None "
                             f"for no cap, got {chunk!r}")  # fmt: skip
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 2
        ):
            raise ValueError(
                f"max_model_len must be an integer >= 2 or None, got {self.max_model_len!r}"
            )
        spec = self.speculative
        if spec != "auto" and not isinstance(spec, SpecConfig | ResolvedSpec | None):
            raise ValueError(
                f"speculative must be a SpecConfig, None or 'auto'; got {self.speculative!r}"
            )


@dataclass(slots=True)
class SpecConfig:
    """Speculative decoding settings; key names follow vLLM's speculative_config."""

    method: str = "draft_model"
    """Where drafts come from (the registry in verispec/drafters/registry.py lists them and
    says which of the options below each reads); vLLM's default."""
    model: str | None = None
    """Draft checkpoint directory or hub id (draft_model only)."""
    num_speculative_tokens: int = 4
    """k: draft tokens proposed per step (shrinks near the context and max_tokens limits);
    for a tree, its node budget."""
    prompt_lookup_min: int | None = None
    """Shortest suffix n-gram prompt lookup tries (methods that look up the prompt; default 2)."""
    prompt_lookup_max: int | None = None
    """Longest suffix n-gram prompt lookup tries, first (default 4)."""
    quantization: str | None = None
    """Round the draft's linear weights at load: None (as stored), fp16, int8, q8_0, w8a8 (q8_0
    times inputs rounded to 8-bit blocks), w4a8 (Q4_1's 4-bit codes times such inputs: half the
    bytes), or "auto": for a draft model w8a8 where the native
    kernel runs it in integers, else as stored (quantization.draft_quantization; heads as
    stored), resolved to one of those by resolve_speculative. A named model's own draft runs
    "auto". Never affects the output, only how often drafts are accepted and how fast the draft
    runs."""
    draft_vocab_size: int | None = None
    """draft_model: the draft's LM head keeps only this many token ids (FR-Spec): every
    special, chat-template and byte token, then the most frequent in a sample of text
    (drafters/draft_vocab.py), so each draft step reads a fraction of the head. The draft never
    proposes another token; the target's verification still gives its exact output. None = the
    whole vocabulary (so does the vocabulary's own size)."""
    tree_topk: int | None = None
    """Methods that draft trees: children expanded per node (EAGLE-2); None or 1 = a chain of
    num_speculative_tokens tokens."""
    tree_depth: int | None = None
    """Methods that draft trees: levels of the tree (default 6 when tree_topk >= 2; Medusa
    drafts at most one level per head, so it cuts deeper trees and chains to its heads)."""
    prompt_lookup_tokens: int | None = None
    """Methods that also look up the prompt: eagle grafts a prompt-lookup chain of up to this
    many tokens onto each tree (its nodes count in num_speculative_tokens; None = off), and
    draft_model drafts a request's chain by copying, up to this many tokens, wherever the
    lookup finds a continuation (the draft model then skips that request's step). The model
    drafts what is new, the lookup what is copied; the target checks both alike."""
    adaptive: bool = False
    """Choose each step how many tokens to draft per request, up to num_speculative_tokens
    (a tree: its node budget), from a measured cost model of this engine and each request's
    acceptance, so speculation turns itself off under load (the engine's adaptive policy);
    False = always num_speculative_tokens. speculative="auto" turns it on."""
    suffix_decoding_max_tree_depth: int | None = None
    """suffix: longest run of tokens its tries count, the matched suffix and the drafted path
    below it together (default 24)."""
    suffix_decoding_max_spec_factor: float | None = None
    """suffix: a tree has at most this many times the matched suffix's length in nodes, and
    at most num_speculative_tokens (default 1.0)."""
    suffix_decoding_min_token_prob: float | None = None
    """suffix: smallest empirical probability (from the tries' counts) of a drafted node's
    path (default 0.1)."""
    suffix_decoding_max_cached_requests: int | None = None
    """suffix: finished requests whose outputs it drafts from, oldest evicted (default 10000;
    0 = only the request's own tokens)."""
    self_skip_layers: tuple[int, ...] | None = None
    """self: the target's decoder layers (0-based) its draft leaves out; None = chosen, with k
    (at most num_speculative_tokens), by a calibration on a few prompts at load."""
    self_calibration: str | None = None
    """self: a JSON file holding a calibration's skip set and k: read when it exists, else
    written after calibrating, so only the first run calibrates (SkipChoice.save writes one
    from your own prompts: drafters/skip_search.py)."""

    def __post_init__(self) -> None:
        """Checks the fields that are no method's; each method's options, num_speculative_tokens's
        range and which options a method reads are checked beside its drafter, when resolved
        (drafters/registry.py, check_spec)."""
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"speculative method must be a method name (a string), got "
                             f"{self.method!r}")  # fmt: skip
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {self.adaptive!r}")
        problem = quantization_problem(self.quantization, (AUTO_DRAFT,))
        if problem is not None:
            raise SpecError(SpecField("quantization", "speculative quantization"), f" {problem}")

    def options(self, cls: type[Any]) -> Any:
        """The options of one method's kind (a class beside its drafter, with SPEC_FIELDS: its
        option names -> these fields) that this configuration gives, as that class; their
        defaults fill fields left None."""
        given = {name: getattr(self, spec_field) for name, spec_field in cls.SPEC_FIELDS.items()}
        return cls(**{name: value for name, value in given.items() if value is not None})


@dataclass(frozen=True, slots=True)
class SpecField:
    """A SpecConfig field an error names: written `text` (default: the field's name) by the
    library, and as the flag that sets it by the CLI."""

    name: str
    text: str | None = None


class SpecError(ValueError):
    """A ValueError about speculative options whose message names SpecConfig fields as SpecField
    parts, so that each boundary words them its own way: str() by field, as the library and
    vLLM's dict form name them; worded(flags) by the CLI's flags."""

    def __init__(self, *parts: str | SpecField) -> None:
        self.parts = parts
        super().__init__(self.worded({}))

    def worded(self, names: Mapping[str, str]) -> str:
        """The message with each field written as names gives it (else as the library)."""
        return "".join(p if isinstance(p, str) else names.get(p.name, p.text or p.name)
                       for p in self.parts)  # fmt: skip


def field_list(names: Sequence[str]) -> list[str | SpecField]:
    """Fields joined by commas, as SpecError parts: ["a", "b"] -> [SpecField("a"), ", ",
    SpecField("b")]."""
    parts: list[str | SpecField] = []
    for i, name in enumerate(names):
        parts += [", ", SpecField(name)] if i else [SpecField(name)]
    return parts


@dataclass(frozen=True, slots=True)
class ResolvedSpec:
    """A SpecConfig checked and resolved once, at the API boundary (spec/resolve.py): its
    method's options filled, its draft named, its "auto" decided. The engine takes only this,
    so nothing below the API resolves again; any change (dataclasses.replace of .spec) makes
    a plain SpecConfig that must be resolved anew."""

    spec: SpecConfig
