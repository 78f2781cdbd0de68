"""verispec: lossless speculative decoding for large language models."""

from verispec.config import SpecConfig
from verispec.llm import LLM
from verispec.outputs import RequestMetrics, RequestOutput, StreamDelta, TokenLogprobs
from verispec.sampling_params import SamplingParams

__all__ = [
    "LLM", "RequestMetrics", "RequestOutput", "SamplingParams", "SpecConfig", "StreamDelta",
    "TokenLogprobs",
]  # fmt: skip
__version__ = "0.1.0"
