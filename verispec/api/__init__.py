"""What a Python user holds: LLM (llm) and streaming (stream); the plain types it returns live
in verispec.types. `from verispec import LLM, SamplingParams, ...` re-exports the main names."""
