"""End to end on CPU: real vLLM servers, pristine beside patched (see vllm_overlay.e2e.suite)."""
