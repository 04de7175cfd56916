"""Reading a response to its end within an overall deadline.

A socket timeout bounds each read, not the transfer: an index or a mirror that sends a byte every
few seconds never times out, and the run waits for ever. Every download and index page is read in
blocks of what has arrived, and the transfer stops once its deadline has passed, saying so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Protocol

DEADLINE_ENV = "VLLM_OVERLAY_DOWNLOAD_DEADLINE"
# A 3.4 GB runtime wheel at 2 MB/s takes half an hour; an index page is a few hundred KiB.
FILE_DEADLINE_S = 3600.0
PAGE_DEADLINE_S = 300.0


class TooSlow(TimeoutError):
    """The transfer did not finish within its deadline."""


class Readable(Protocol):
    def read1(self, size: int = ...) -> bytes: ...


def deadline_seconds(default: float) -> float:
    """``$VLLM_OVERLAY_DOWNLOAD_DEADLINE`` seconds where set (a slower link), else ``default``."""
    value = os.environ.get(DEADLINE_ENV, "")
    try:
        seconds = float(value)
    except ValueError:
        return default
    return seconds if seconds > 0 and seconds != float("inf") else default


def blocks(response: Readable, seconds: float, what: str, size: int = 1 << 20) -> Iterator[bytes]:
    """The response's bytes as they arrive, ending at its end; TooSlow once ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    received = 0
    while True:
        block = response.read1(size)
        if not block:
            return
        received += len(block)
        yield block
        if time.monotonic() > deadline:
            raise TooSlow(
                f"{what} did not finish within {seconds:g} s ({received:,} bytes received); "
                f"${DEADLINE_ENV} gives a slow link more seconds"
            )
