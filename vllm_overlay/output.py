"""All user-facing messages go through here: one place decides stream and format."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def result(message: str) -> None:
    """Results (reports, tables) go to stdout so they can be piped."""
    print(message, flush=True)


def waiting_for(path: Path) -> Callable[[int | None], None]:
    """An ``on_wait`` for a lock on ``path``: says whose run the command waits for."""
    return lambda pid: info(
        f"waiting for {'pid ' + str(pid) if pid else 'another process'}, which is writing {path} "
        "(--no-wait to give up instead)"
    )
