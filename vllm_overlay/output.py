"""All user-facing messages go through here: one place decides stream and format."""

from __future__ import annotations

import sys


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def result(message: str) -> None:
    """Results (reports, tables) go to stdout so they can be piped."""
    print(message, flush=True)
