"""Engine and cache configuration dataclasses; validation raises ValueError, never asserts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from verispec.drafters.registry import DEFAULT_METHOD, HEAD_METHOD, MODEL_FREE_METHOD, method
from verispec.drafters.self_draft import check_skip_option
from verispec.drafters.suffix import SuffixConfig
from verispec.models.catalog.default import shipped_head
from verispec.models.catalog.hub import DEFAULT_MODEL, NAMED_MODELS
from verispec.models.kernels.backends import LinearBackend
from verispec.models.kernels.compiled import check_compile
from verispec.models.kernels.quantization import AUTO_DRAFT, check_quantization

MAX_SPECULATIVE_TOKENS = 16
MAX_TREE_NODES = 64


@dataclass(slots=True)
class CacheConfig:
    """Paged KV cache geometry."""

    block_size: int = 16
    """Tokens per KV block."""
    num_blocks: int | None = None
    """Blocks in the cache; None = enough for max_num_seqs sequences of max_model_len tokens."""

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if self.num_blocks is not None and (
            not isinstance(self.num_blocks, int) or self.num_blocks < 1
        ):
            raise ValueError(f"num_blocks must be an integer >= 1 or None, got {self.num_blocks!r}")


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
    seed: int = 0
    """Seed for requests that bring none of their own."""
    linear_backend: LinearBackend = "auto"
    """Kernel for linear layers: auto, torch, onednn (prepacked), fp16 (float16-stored
    weights, float32 compute; only for weights float16 holds exactly) or native (verispec's
    own packed kernel, float16-stored where exact; built with the system's C compiler); the
    last three float32 on CPU only. auto picks native on Intel CPUs (also when compiling),
    elsewhere fp16, else onednn, per weight on a float32 CPU, else torch."""
    quantization: str | None = None
    """Round the target's linear weights at load: None (off), fp16, int8 (per channel) or q8_0
    (GGUF's 8-bit blocks of 32; the native kernel streams them in 1.25 bytes a value). Output
    is then lossless with respect to the quantized target, not the checkpoint."""
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
    prompts; on by default in `verispec serve`. Ignored with an EAGLE head, which needs the
    target's features of every position."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    speculative: SpecConfig | Literal["auto"] | None = "auto"
    """Speculative decoding; None = plain autoregressive decoding; "auto" = a named model's own
    drafter (prompt lookup for the default chat model, the embedded draft for embedded-code),
    plain decoding for any other model (see default_speculative)."""

    def __post_init__(self) -> None:
        check_quantization(self.quantization)
        check_compile(self.compile, self.batch_invariant)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 2
        ):
            raise ValueError(
                f"max_model_len must be an integer >= 2 or None, got {self.max_model_len!r}"
            )
        if isinstance(self.speculative, str):
            if self.speculative != "auto":
                raise ValueError(
                    f"speculative must be a SpecConfig, None or 'auto'; got {self.speculative!r}"
                )
            self.speculative = default_speculative(self.model)
            if self.speculative is not None:
                self.speculative.adaptive = True


@dataclass(slots=True)
class SpecConfig:
    """Speculative decoding settings; key names follow vLLM's speculative_config."""

    method: str = DEFAULT_METHOD
    """Where drafts come from (the registry in verispec/drafters/registry.py lists them)."""
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
    times inputs rounded to 8-bit blocks), or "auto": for a draft model w8a8 where the native
    kernel runs it on AVX-512 VNNI, else as stored (quantization.draft_quantization; heads as
    stored). A named model's own draft runs "auto". Never affects the output, only how often
    drafts are accepted and how fast the draft runs."""
    tree_topk: int | None = None
    """Methods that draft trees: children expanded per node (EAGLE-2); None or 1 = a chain of
    num_speculative_tokens tokens."""
    tree_depth: int | None = None
    """Methods that draft trees: levels of the tree (default 6 when tree_topk >= 2; Medusa
    drafts at most one level per head, so it cuts deeper trees and chains to its heads)."""
    prompt_lookup_tokens: int | None = None
    """Tree methods that also look up the prompt (eagle): graft a prompt-lookup chain of up to
    this many tokens onto each tree (its nodes count in num_speculative_tokens; None = off).
    The head drafts what is new, the lookup what is copied; the target checks both at once."""
    adaptive: bool = False
    """Choose each step how many tokens to draft per request, up to num_speculative_tokens
    (a tree: its node budget), from a measured cost model of this engine and each request's
    acceptance, so speculation turns itself off under load (engine/spec_policy.py);
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
        traits = method(self.method)  # ValueError listing the methods for an unknown name
        self._check_self_draft(traits.drafts_with_own_layers)
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {self.adaptive!r}")
        check_quantization(self.quantization, "speculative quantization", (AUTO_DRAFT,))
        self._check_tree(traits.takes_tree, traits.own_tree)
        k = self.num_speculative_tokens
        tree = (self.tree_topk or 1) > 1 or traits.own_tree
        limit = MAX_TREE_NODES if tree else MAX_SPECULATIVE_TOKENS
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limit:
            drafts_trees = traits.takes_tree or traits.own_tree
            trees = f" (a tree's node budget: [1, {MAX_TREE_NODES}])" if drafts_trees else ""
            raise ValueError(
                f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}]"
                f"{trees}, got {k!r}"
            )
        if traits.takes_model and not self.model:
            raise ValueError(f"method {self.method!r} needs model= (a draft checkpoint or hub "
                             "id; for a head method, the head's directory)")  # fmt: skip
        grafting = self._check_grafting(traits.grafts_lookup)
        looks_up = traits.takes_prompt_lookup or grafting
        self._refuse_unused(traits.takes_model, looks_up, traits.takes_suffix)
        if traits.takes_suffix:
            self._fill_suffix()
        if looks_up:
            lo = 2 if self.prompt_lookup_min is None else self.prompt_lookup_min
            hi = 4 if self.prompt_lookup_max is None else self.prompt_lookup_max
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ValueError(
                    "prompt_lookup_min and prompt_lookup_max must be integers with "
                    f"1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r} and {hi!r}"
                )
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi

    def _check_tree(self, takes_tree: bool, own_tree: bool) -> None:
        """Tree options: integers >= 1, only for methods that draft trees of that shape."""
        given = [f for f in ("tree_topk", "tree_depth") if getattr(self, f) is not None]
        if given and not takes_tree:
            shape = "trees of its own shape" if own_tree else "chains only"
            raise ValueError(
                f"method {self.method!r} drafts {shape} and does not use {', '.join(given)}"
            )
        for name in given:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if (self.tree_topk or 1) > 1 and self.tree_depth is None:
            self.tree_depth = 6
        if self.tree_depth is not None and (self.tree_topk or 1) == 1:
            raise ValueError("tree_depth needs tree_topk >= 2 (a chain's depth is "
                             "num_speculative_tokens)")

    def _check_grafting(self, grafts_lookup: bool) -> bool:
        """prompt_lookup_tokens: an integer >= 1 below the node budget, for a method that
        grafts lookups onto its trees, with a tree to graft onto. Returns whether it is on."""
        n = self.prompt_lookup_tokens
        if n is None:
            return False
        if not grafts_lookup:
            raise ValueError(f"method {self.method!r} does not graft prompt lookups onto trees; "
                             "drop prompt_lookup_tokens")  # fmt: skip
        if (self.tree_topk or 1) == 1:
            raise ValueError("prompt_lookup_tokens needs a tree (tree_topk >= 2) to graft onto")
        k = self.num_speculative_tokens
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n < k:
            raise ValueError(
                f"prompt_lookup_tokens must be an integer in [1, num_speculative_tokens - 1] "
                f"(the tree keeps at least one node of its own), got {n!r} with "
                f"num_speculative_tokens={k}"
            )
        return True

    def _fill_suffix(self) -> None:
        """suffix_decoding_* options: the defaults filled in, and checked (SuffixConfig)."""
        defaults = SuffixConfig()
        for name in SuffixConfig.__dataclass_fields__:
            if getattr(self, f"suffix_decoding_{name}") is None:
                setattr(self, f"suffix_decoding_{name}", getattr(defaults, name))
        try:
            self.suffix_config()
        except ValueError as e:
            raise ValueError(f"suffix_decoding_{e}") from None

    def suffix_config(self) -> SuffixConfig:
        """The suffix_decoding_* options as the suffix drafter's SuffixConfig."""
        return SuffixConfig(**{name: getattr(self, f"suffix_decoding_{name}")
                               for name in SuffixConfig.__dataclass_fields__})  # fmt: skip

    def _check_self_draft(self, drafts_with_own_layers: bool) -> None:
        """self_skip_layers (distinct indices >= 0, sorted) or self_calibration (a path), not
        both; only for the method that skips layers, refused for any other."""
        fields = ("self_skip_layers", "self_calibration")
        given = [f for f in fields if getattr(self, f) is not None]
        if given and not drafts_with_own_layers:
            raise ValueError(
                f"method {self.method!r} does not use {', '.join(given)}; drop "
                f"{'it' if len(given) == 1 else 'them'} or choose a method that does"
            )
        if len(given) == 2:
            raise ValueError("give self_skip_layers or self_calibration, not both: a calibration "
                             "file holds its own skip set")  # fmt: skip
        self.self_skip_layers = check_skip_option(self.self_skip_layers)
        if self.self_calibration is not None and (
            not isinstance(self.self_calibration, str) or not self.self_calibration
        ):
            raise ValueError(f"self_calibration must be a file path (a string), got "
                             f"{self.self_calibration!r}")  # fmt: skip

    def _refuse_unused(
        self, takes_model: bool, takes_prompt_lookup: bool, takes_suffix: bool
    ) -> None:
        """Options the method would ignore are errors, never silently dropped."""
        unused = []
        if not takes_suffix:
            unused += [f"suffix_decoding_{name}" for name in SuffixConfig.__dataclass_fields__
                       if getattr(self, f"suffix_decoding_{name}") is not None]  # fmt: skip
        if not takes_model:
            unused += [f for f in ("model", "quantization") if getattr(self, f) is not None]
        if not takes_prompt_lookup:
            unused += [
                f for f in ("prompt_lookup_min", "prompt_lookup_max")
                if getattr(self, f) is not None
            ]  # fmt: skip
        if unused:
            raise ValueError(
                f"method {self.method!r} does not use {', '.join(unused)}; drop "
                f"{'it' if len(unused) == 1 else 'them'} or choose a method that does"
            )


def default_speculative(model: str | None) -> SpecConfig | None:
    """What speculative="auto" means. A named model (None = the default model) drafts with its
    shipped EAGLE head where that was measured fastest (NamedModel.auto_head), else with its
    trained draft model, else with prompt lookup (no weights); any other model decodes plainly
    unless asked."""
    named = NAMED_MODELS.get(model or DEFAULT_MODEL)
    if named is None:
        return None
    own_head = own_speculative(model, HEAD_METHOD) if named.auto_head else None
    own_draft = own_speculative(model, DEFAULT_METHOD) if named.auto_draft else None
    return own_head or own_draft or SpecConfig(method=MODEL_FREE_METHOD)


def own_speculative(model: str | None, method: str) -> SpecConfig | None:
    """A named model's own drafter for `method`: its shipped head for the head method (with the
    tree settings the head was tuned with), its trained draft for the draft-model method; None
    when it has none (or the model is not named)."""
    named = NAMED_MODELS.get(model or DEFAULT_MODEL)
    if named is None:
        return None
    if method == HEAD_METHOD and named.head is not None:
        head = shipped_head(named.head)
        if head is not None:
            path, settings = head
            return SpecConfig(method=method, model=str(path), **settings)
    if method == DEFAULT_METHOD and named.draft is not None:
        return SpecConfig(method=method, model=named.draft, quantization=AUTO_DRAFT)
    return None
