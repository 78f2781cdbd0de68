"""verispec: lossless speculative decoding for large language models."""

from verispec.api.llm import LLM
from verispec.api.outputs import RequestMetrics, RequestOutput, StreamDelta, TokenLogprobs
from verispec.api.sampling_params import SamplingParams, StructuredOutputsParams
from verispec.config import SpecConfig

__all__ = [
    "LLM", "RequestMetrics", "RequestOutput", "SamplingParams", "SpecConfig", "StreamDelta",
    "StructuredOutputsParams", "TokenLogprobs",
]  # fmt: skip
__version__ = "0.1.0"
