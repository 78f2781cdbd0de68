"""llama.cpp, through llama-cpp-python, as a benchmark engine on a GGUF file's own weights.

Plain decoding, and llama.cpp's prompt-lookup decoding (LlamaPromptLookupDecoding: the latest
n-gram of up to prompt_lookup_max tokens, down to 1, matched in the context) reported as method
ngram. It is fed the same token ids as the other engines and runs with torch's thread count
(which the bench sets to --threads). It computes with the quantized weights, so its greedy ids
are reported but never compared with the other engines'.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from verispec.bench.engines import BatchRun, MethodSpec, RequestRun, Sampling, gaps
from verispec.drafters.registry import PLAIN, takes_draft_model
from verispec.types.stats import SpecStats

INSTALL_HINT = "pip install 'verispec[llamacpp]'"


def llama_cpp_missing() -> str | None:
    """Why llama-cpp-python cannot run here, or None when it can (the bench then skips it)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: the shared library failed to load
        return f"llama-cpp-python is not importable ({type(e).__name__}: {e}); {INSTALL_HINT}"
    return None


def lookup_stats(calls: list[tuple[int, int]], num_tokens: int) -> SpecStats:
    """Acceptance counters from the draft calls of one request: (tokens out so far, tokens
    drafted) per call, and the request's final output length. A step emits its accepted drafts
    plus one token before the next call, so accepted = emitted - 1 (at most the drafts).
    E.g. calls [(1, 3), (4, 2), (5, 0)], 6 tokens: steps of 3 drafts/2 kept, 2/0 (the empty
    draft is no verify step): 5 drafted, 2 accepted."""
    stats = SpecStats()
    ends = [out for out, _ in calls[1:]] + [num_tokens]
    for (out, drafted), end in zip(calls, ends, strict=True):
        stats.record(drafted, max(0, min(drafted, end - out - 1)))
    return stats


class _CountingLookup:
    """llama.cpp's prompt lookup, recording (output tokens so far, drafted) at each call."""

    def __init__(self, lookup: Any, prompt_len: int = 0) -> None:
        self.lookup = lookup
        self.prompt_len = prompt_len
        self.calls: list[tuple[int, int]] = []

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        draft = self.lookup(input_ids, **kwargs)
        self.calls.append((len(input_ids) - self.prompt_len, len(draft)))
        return draft


class LlamaCppEngine:
    """llama-cpp-python's Llama.generate on a GGUF file: plain, or prompt lookup with k drafts."""

    engine = "llamacpp"
    reference: ClassVar[str | None] = None
    note: ClassVar[str] = "llama.cpp computes with the GGUF file's quantized weights"
    drafts_with_models: ClassVar[bool] = False

    def __init__(
        self, target: Path, draft: Path | None, spec: MethodSpec, dtype: str, device: str = "cpu"
    ) -> None:
        if target.suffix != ".gguf" or not target.is_file():
            raise ValueError(f"engine llamacpp runs a GGUF file; {target} is not one")
        if device != "cpu" or takes_draft_model(spec.method):
            raise ValueError(f"engine llamacpp runs plain decoding or ngram on the CPU, not "
                             f"{spec.method} on {device}")  # fmt: skip
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.method, self.k = spec.method, spec.k
        self.lookup = None
        if spec.method != PLAIN:
            self.lookup = _CountingLookup(
                LlamaPromptLookupDecoding(spec.prompt_lookup_max, num_pred_tokens=spec.k)
            )
        threads = torch.get_num_threads()
        self.llm = Llama(
            model_path=str(target), n_ctx=0, n_threads=threads, n_threads_batch=threads,
            draft_model=self.lookup, verbose=False,
        )  # fmt: skip

    def run(self, prompts: list[list[int]], sampling: Sampling, concurrency: int) -> BatchRun:
        if concurrency != 1:
            raise ValueError("llama.cpp's generate takes one prompt at a time")
        started = time.perf_counter()
        runs = [self._one(p, sampling, sampling.seed + i) for i, p in enumerate(prompts)]
        return BatchRun(runs, time.perf_counter() - started)

    def _one(self, prompt: list[int], sampling: Sampling, seed: int) -> RequestRun:
        import llama_cpp

        self.llm.reset()  # prefill every prompt anew: no KV cache reuse across requests
        self.llm.set_seed(seed)
        if self.lookup is not None:
            self.lookup.prompt_len, self.lookup.calls = len(prompt), []
        greedy = sampling.temperature == 0
        options = dict(temp=sampling.temperature, top_k=0, top_p=1.0 if greedy else sampling.top_p,
                       min_p=0.0, repeat_penalty=1.0)  # fmt: skip
        vocab = self.llm._model.vocab
        tokens: list[int] = []
        times: list[tuple[float, int]] = []
        started = time.perf_counter()
        for token in self.llm.generate(prompt, **options):
            times.append((time.perf_counter(), 1))
            tokens.append(token)
            if llama_cpp.llama_vocab_is_eog(vocab, token) or len(tokens) >= sampling.max_tokens:
                break
        stats = SpecStats()
        if self.lookup is not None:
            stats = lookup_stats(self.lookup.calls, len(tokens))
        return RequestRun(tokens, times[0][0] - started, gaps(times)[: len(tokens) - 1], stats)
