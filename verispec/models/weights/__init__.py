"""Weights into a model: checkpoint and GGUF loading (loader.py), GGUF files read (gguf.py),
their metadata as a config (gguf_config.py), their quantized blocks decoded as affine codes
(gguf_blocks.py), and GGUF metadata converted once into the cache (gguf_cache.py)."""
