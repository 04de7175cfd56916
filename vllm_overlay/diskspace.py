"""Whether a file system is full: git says "failed to write new configuration file ...config.lock"
or "could not write to ..." where the disk is full, and a person must be told the disk is full."""

from __future__ import annotations

import os
from pathlib import Path

# Below this many free bytes a failed write is put down to the full file system. A staging tree's
# clone, git's objects and its lock files need far more than this, so a run that failed with less
# left ran out of space; with more left, git's own words are all the message says.
LOW = 16 << 20
NO_SPACE = os.strerror(28)  # ENOSPC's text, as git prints it ("No space left on device")


def free_bytes(path: Path) -> int | None:
    """Free bytes (for an unprivileged writer) on the file system of ``path`` or its nearest existing
    ancestor; None where none can be asked."""
    for where in (path, *path.parents):
        try:
            stat = os.statvfs(where)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        return stat.f_bavail * stat.f_frsize
    return None


def full(path: Path, said: str = "") -> str | None:
    """'the file system holding PATH is full (N KiB free)' where a write there just failed for want of
    space (``said``: what the failed step printed); None where it was not that."""
    free = free_bytes(path)
    if free is None or (free >= LOW and NO_SPACE not in said):
        return None
    return f"the file system holding {path} is full ({free // 1024:,} KiB free)"
