"""verispec: lossless speculative decoding for large language models."""

from verispec.api.llm import LLM
from verispec.config import SpecConfig
from verispec.types.outputs import RequestMetrics, RequestOutput, StreamDelta, TokenLogprobs
from verispec.types.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "LLM", "RequestMetrics", "RequestOutput", "SamplingParams", "SpecConfig", "StreamDelta",
    "StructuredOutputsParams", "TokenLogprobs",
]  # fmt: skip
__version__ = "0.1.0"
