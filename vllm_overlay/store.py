"""The cache directory: downloads, imported upstream trees, test environments.

One ``Store`` owns the cache root and takes an exclusive lock around every mutation, so two
concurrent runs (a developer's shell and an editor's test run) never interleave half-written
entries. Everything in it can be deleted at any time; it is rebuilt on demand.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from vllm_overlay import output
from vllm_overlay.errors import InputError

UNPACK_PREFIX = ".unpack-"  # sdists being unpacked for import


def default_root() -> Path:
    """$VLLM_OVERLAY_CACHE, else $XDG_CACHE_HOME/vllm-overlay, else ~/.cache/vllm-overlay."""
    explicit = os.environ.get("VLLM_OVERLAY_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "vllm-overlay"


class OutsideCacheError(InputError, ValueError):
    """A name that would make a cache path lead out of the cache (``..``, a separator, a symlink)."""


class CacheBusy(InputError, RuntimeError):
    """Another run holds one of the cache's locks, and this run was asked not to wait (--no-wait)."""


class Store:
    def __init__(self, root: Path | None = None, *, wait: bool = True) -> None:
        """``wait=False``: a lock another run holds is an error (``CacheBusy``), never a silent wait."""
        self.root = (root or default_root()).resolve()
        self.wait = wait

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    def download(self, filename: str) -> Path:
        """``downloads/<filename>``, refused unless it is a plain name that stays inside the cache.

        Every name comes from a lock or an index page; a ``..`` or a separator in one would read an
        archive elsewhere and write its ``.imported``/``.sha256`` records beside it.
        """
        plain = filename and filename not in (".", "..") and not any(c in filename for c in "/\\\0")
        path = self.downloads / filename
        if not plain or not path.resolve().is_relative_to(self.downloads.resolve()):
            raise OutsideCacheError(f"{filename!r} is not a plain file name inside the cache's downloads")
        return path

    @property
    def upstreams_git(self) -> Path:
        """Bare repository holding every imported upstream as a tagged root commit."""
        return self.root / "upstreams.git"

    @property
    def envs(self) -> Path:
        return self.root / "envs"

    @contextlib.contextmanager
    def exclusive(self, name: str = ".lock") -> Iterator[None]:
        """Hold the store's lock, or another named one.

        Held by another run: with ``wait`` this says once, on stderr, whose run it waits for (a wait
        of minutes while a test environment is built must not look like a hang); without it, raise
        ``CacheBusy`` at once. The holder's pid is written into the lock file for that line.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
                who = f"pid {text}" if text.isdigit() else "another process"
                if not self.wait:
                    raise CacheBusy(
                        f"the cache {self.root} is in use by {who} (its lock {path.name}); "
                        "try again when that run is done (--no-wait gave up instead of waiting)"
                    ) from None
                output.info(f"waiting for {who}, which holds the cache's lock {path} (--no-wait to give up instead)")
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def remove_leftovers(self) -> list[Path]:
        """Delete what killed runs left: partial downloads, half-unpacked sdists, git lock files of the
        upstream repository. Call with the lock held.

        Every write into upstreams.git happens under the store's lock, so a ``*.lock`` file there
        (``refs/tags/upstream/<v>.lock``, ``packed-refs.lock``, ``index.lock``) while we hold it was left
        by a killed git; git itself would refuse every later ref update until it is gone.
        """
        found = sorted(self.downloads.glob(".*.part")) if self.downloads.is_dir() else []
        found += sorted(self.root.glob(f"{UNPACK_PREFIX}*")) if self.root.is_dir() else []
        if self.upstreams_git.is_dir():
            found += sorted((self.upstreams_git / "refs").rglob("*.lock"))
            found += sorted(p for p in self.upstreams_git.glob("*.lock") if p.is_file())
        for path in found:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return found
