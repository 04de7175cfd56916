"""What a package index lists, and the error of an index that cannot be read.

Apart from ``indexes`` (which reads the indexes) and ``index_pages`` (which parses their pages)
so that each imports these without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass


class IndexReadError(RuntimeError):
    """No configured index could be read."""


@dataclass(frozen=True)
class IndexEntry:
    """One file as an index lists it."""

    filename: str
    url: str
    sha256: str
    size: int | None
    upload_time: str | None
