"""The image code's input error: what every module of :mod:`vllm_overlay.image` raises for a bad input."""

from __future__ import annotations

from vllm_overlay.errors import InputError


class ImageError(InputError, RuntimeError):
    """The image cannot be staged or built (stale tree, unsupported change, bad Dockerfile...)."""
