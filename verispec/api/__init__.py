"""What a Python user holds: LLM (llm), streaming (stream), the outputs, SamplingParams and chat
templating. `from verispec import LLM, SamplingParams, ...` re-exports the main names."""
