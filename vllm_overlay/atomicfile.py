"""Files written under a temporary name and renamed into place, with the mode the umask gives.

``tempfile.mkstemp`` creates its file 0600 whatever the umask says, so a report or a download
renamed from it stays private where every other file the tool writes is readable as the user's
umask intends. Here the temporary file is created the way ``open()`` creates one (0666 minus the
umask), under a name no other writer uses, and never seen by a reader until it is complete.
"""

from __future__ import annotations

import os
from pathlib import Path


def create_temp(directory: Path, prefix: str, suffix: str = "") -> tuple[int, Path]:
    """Create a new empty file ``directory/prefix<random>suffix``; return its descriptor and path."""
    while True:
        candidate = directory / f"{prefix}{os.urandom(6).hex()}{suffix}"
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), candidate
        except FileExistsError:
            continue


def write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one rename: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(path.parent, f".{path.name}.", ".part")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
