"""LLM: the offline API users know from vLLM (`LLM(model=...).generate(prompts, params)`,
`.chat(messages)`), plus streaming of one request (`generate_stream`, `chat_stream`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from tqdm import tqdm

from verispec.api.stream import RequestStream
from verispec.config import CacheConfig, EngineConfig
from verispec.drafters.registry import make_proposer
from verispec.engine.engine import Engine
from verispec.engine.request import Request
from verispec.spec.resolve import DraftRuntime, SpecRequest, resolve
from verispec.types.chat import Conversation, as_conversations, chat_prompt, check_text
from verispec.types.outputs import RequestOutput
from verispec.types.sampling_params import SamplingParams

Prompt = str | list[int]
Params = SamplingParams | Sequence[SamplingParams] | None


class LLM:
    """Load a model once, then generate for batches of prompts or conversations.

    With no model, SmolLM2-135M-Instruct is loaded (fetched once into the cache) and, unless
    speculative=None, decoded with prompt lookup (speculative="auto": a named model's own
    drafter). speculative also takes vLLM's dict form, e.g. {"method": "ngram",
    "num_speculative_tokens": 4}. kv_cache_memory is the KV pool's budget in bytes, committed
    at load (CacheConfig.kv_cache_memory; the engine's kv_memory says what it took).
    """

    def __init__(
        self,
        model: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_memory: int | None = None,
        progress: bool = False,
        speculative: SpecRequest = "auto",
        **engine_options: Any,
    ) -> None:
        if isinstance(model, str) and not model.strip():
            raise ValueError(
                "model must not be empty; give a checkpoint directory or model name, "
                "or None for the default model"
            )
        config = EngineConfig(
            model=model, dtype=dtype, device=device, max_model_len=max_model_len, seed=seed,
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                              kv_cache_memory=kv_cache_memory),
            speculative=None, **engine_options,
        )  # fmt: skip
        resolved = resolve(model, speculative, runtime=DraftRuntime.of(config))  # once, here
        config = replace(config, speculative=resolved)
        drafter = None if resolved is None else partial(make_proposer, resolved)
        self.engine = Engine(config, drafter, progress=progress)

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer of the loaded model."""
        return self.engine.tokenizer.hf

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (enable_prefix_caching); False while requests run."""
        return self.engine.reset_prefix_cache()

    @property
    def model_name(self) -> str:
        """The model as the user named it (or the default model's directory)."""
        return self.engine.config.model or str(self.engine.model_path)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: Params = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is text or a list of token ids."""
        items = [(p, None) for p in _as_prompt_list(prompts)]
        return self._run(self._add_all(items, sampling_params), use_tqdm)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: Params = None,
        use_tqdm: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per conversation: `messages` is one conversation (a list of
        {"role", "content"} dicts) or a list of them, rendered by the model's chat template
        with the assistant's generation prompt; output.prompt is the rendered text."""
        items = [self._chat_item(c, chat_template_kwargs) for c in as_conversations(messages)]
        return self._run(self._add_all(items, sampling_params), use_tqdm)

    def generate_stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> RequestStream:
        """Queue one prompt and stream it: iterate for a StreamDelta after each engine step that
        accepted tokens; the last one carries the RequestOutput. Stop early with close() (or a
        `with` block) to abort the request and free its KV cache."""
        prompts = _as_prompt_list(prompt)
        if len(prompts) != 1:
            raise ValueError(f"generate_stream takes one prompt, got {len(prompts)}")
        return self._stream(prompts[0], None, sampling_params)

    def chat_stream(
        self,
        messages: Conversation,
        sampling_params: SamplingParams | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestStream:
        """Stream the answer to one conversation, as generate_stream does for a prompt."""
        conversations = as_conversations(messages)
        if len(conversations) != 1:
            raise ValueError(f"chat_stream takes one conversation, got {len(conversations)}")
        return self._stream(*self._chat_item(conversations[0], chat_template_kwargs),
                            sampling_params)  # fmt: skip

    def _chat_item(
        self, conversation: Conversation, template_kwargs: Mapping[str, Any] | None
    ) -> tuple[list[int], str]:
        text, ids = chat_prompt(self.tokenizer, conversation, self.model_name, template_kwargs)
        return ids, text

    def _stream(
        self, prompt: Prompt, text: str | None, params: SamplingParams | None
    ) -> RequestStream:
        if params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be one SamplingParams, got {params!r}")
        return RequestStream(self.engine, self._add(prompt, text, params or SamplingParams()))

    def _add(self, prompt: Prompt, text: str | None, params: SamplingParams) -> Request:
        """Queue one prompt; `text` (a chat's rendered template) replaces a token prompt's text."""
        request = self.engine.add_request(prompt, params)
        if text is not None:
            request.prompt = text
        return request

    def _add_all(self, items: list[tuple[Prompt, str | None]], params: Params) -> list[Request]:
        """Queue every (prompt, text) with its params: all of the batch, or none of it."""
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            params_list = [params] * len(items)
        else:
            params_list = list(params)
            if len(params_list) != len(items):
                raise ValueError(
                    f"got {len(params_list)} SamplingParams for {len(items)} prompts; "
                    "pass one, or one per prompt"
                )
        requests: list[Request] = []
        try:
            for (prompt, text), p in zip(items, params_list, strict=True):
                requests.append(self._add(prompt, text, p))
        except Exception:
            for r in requests:
                self.engine.abort_request(r)
            raise
        return requests

    def _run(self, requests: list[Request], use_tqdm: bool) -> list[RequestOutput]:
        """Step the engine until nothing is left; the requests' outputs, in order."""
        with tqdm(total=len(requests), desc="generating", disable=not use_tqdm) as bar:

            def steps() -> None:  # in the engine's compute thread, all of them
                while self.engine.has_unfinished():
                    for r in self.engine.step():
                        bar.update(int(r.finished))

            self.engine.compute(steps)
        return [self.engine.output(r) for r in requests]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """Normalise one prompt or a list of them; a flat list of ints is one prompt of token ids."""
    if isinstance(prompts, str):
        return [check_text(prompts)]
    if isinstance(prompts, bytes | bytearray | memoryview):
        raise ValueError(
            f"a prompt must be text (str) or a list of token ids, got {type(prompts).__name__}; "
            "decode bytes first, e.g. prompt.decode('utf-8')"
        )
    try:
        prompts = list(prompts)
    except TypeError:
        raise ValueError(
            "prompts must be a string, a list of token ids, or a list of those; "
            f"got {type(prompts).__name__}"
        ) from None
    if prompts and all(isinstance(p, int) for p in prompts):
        return [prompts]
    if not prompts:
        raise ValueError("no prompts given; pass a string, a list of token ids, or a list of those")
    for i, p in enumerate(prompts):
        if not isinstance(p, str | list):
            raise ValueError(
                f"a prompt must be a string or a list of token ids, got {type(p).__name__}"
            )
        if isinstance(p, str):
            check_text(p, f"prompt {i}")
    return prompts
