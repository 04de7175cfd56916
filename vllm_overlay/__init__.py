"""vllm-overlay: a pinned upstream vLLM plus ordered patch series, proven patch by patch."""

__version__ = "0.1.0"
