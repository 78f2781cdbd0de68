"""Engine and cache configuration dataclasses; validation raises ValueError, never asserts."""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.models.linear import LinearBackend


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
    """Checkpoint directory or hub id; None = the embedded default model."""
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
    """Kernel for linear layers: auto, torch, or onednn (prepacked; float32 on CPU only)."""
    cache: CacheConfig = field(default_factory=CacheConfig)

    def __post_init__(self) -> None:
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
