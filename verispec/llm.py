"""LLM: the offline batch API users know from vLLM (`LLM(model=...).generate(prompts, params)`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from tqdm import tqdm

from verispec.config import CacheConfig, EngineConfig, SpecConfig
from verispec.engine import Engine
from verispec.outputs import RequestOutput
from verispec.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Load a model once, then generate for batches of prompts.

    With no model, the embedded Python-code target is loaded and, unless speculative=None,
    decoded speculatively with the embedded draft (speculative="auto").
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
        progress: bool = False,
        speculative: SpecConfig | Literal["auto"] | None = "auto",
        **engine_options: Any,
    ) -> None:
        config = EngineConfig(
            model=model, dtype=dtype, device=device, max_model_len=max_model_len, seed=seed,
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
            speculative=speculative, **engine_options,
        )  # fmt: skip
        self.engine = Engine(config, progress=progress)

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer of the loaded model."""
        return self.engine.tokenizer.hf

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is text or a list of token ids."""
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"got {len(params_list)} SamplingParams for {len(prompt_list)} prompts; "
                    "pass one, or one per prompt"
                )
        requests = []
        try:
            for prompt, params in zip(prompt_list, params_list, strict=True):
                requests.append(self.engine.add_request(prompt, params))
        except Exception:
            for r in requests:  # queue all of the batch or none of it
                self.engine.abort_request(r)
            raise
        with tqdm(total=len(requests), desc="generating", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                for r in self.engine.step():
                    bar.update(int(r.finished))
        return [self.engine.output(r) for r in requests]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """Normalise one prompt or a list of them; a flat list of ints is one prompt of token ids."""
    if isinstance(prompts, str):
        return [prompts]
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
    for p in prompts:
        if not isinstance(p, str | list):
            raise ValueError(
                f"a prompt must be a string or a list of token ids, got {type(p).__name__}"
            )
    return prompts
