"""Shared helpers of the tool tests, one module per fixture family; nothing here imports vLLM."""
