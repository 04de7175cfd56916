"""The cache directory: downloads, imported upstream trees, test environments, verdicts.

One ``Store`` owns the cache root and takes an exclusive lock around every mutation, so two
concurrent runs (a developer's shell and an editor's test run) never interleave half-written
entries. Everything in it can be deleted at any time; it is rebuilt on demand.

The Store is the one place that names the cache's folders (a property each; ``folders`` lists
them with what they hold): every module asks it for its folder, and ``scripts/cache`` asks it
what the cache holds, so a new folder cannot be left out of the listing.
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
VERDICT_SECRET = ".secret"  # inside verdicts/: the key every verdict entry is signed with


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
        return _plain_child(self.downloads, filename, "the cache's downloads")

    @property
    def upstreams_git(self) -> Path:
        """Bare repository holding every imported upstream as a tagged root commit."""
        return self.root / "upstreams.git"

    @property
    def envs(self) -> Path:
        """Test environments and the CPU runtime: one link per key to a hidden build directory."""
        return self.root / "envs"

    @property
    def kept_builds(self) -> Path:
        """Packs of the patch commits earlier applies made (vllm_overlay.apply.kept_builds)."""
        return self.root / "kept-builds"

    @property
    def verdicts(self) -> Path:
        """The verdict store: one folder (scope) per test environment and runner version, and e2e/."""
        return self.root / "verdicts"

    def verdict_scope(self, scope: str) -> Path:
        """``verdicts/<scope>``, refused unless ``scope`` is a plain name that stays inside the cache."""
        return _plain_child(self.verdicts, scope, "the cache's verdicts")

    @property
    def verdict_secret(self) -> Path:
        """The cache's own key that signs every verdict entry (made on first use, owner-readable only)."""
        return self.verdicts / VERDICT_SECRET

    @property
    def dependencies(self) -> Path:
        """Python sources of the dependency releases the audit compares (vllm_overlay.audit.dependencies)."""
        return self.root / "dependencies"

    @property
    def ci(self) -> Path:
        """The image checks' stand-ins: Debian root filesystems, container storage, Docker's data root."""
        return self.root / "ci"

    @property
    def oracle_examples(self) -> Path:
        """hypothesis's example databases, one folder per series, so a failing example is replayed first."""
        return self.root / "oracle-examples"

    @property
    def baselines(self) -> Path:
        """Where results were kept before the verdict store; only ``scripts/cache --prune`` touches it."""
        return self.root / "baselines"

    def folders(self) -> dict[Path, str]:
        """Every folder of the cache, with what it holds (the kind ``scripts/cache`` lists it as)."""
        return {
            self.downloads: "downloads",
            self.upstreams_git: "upstream trees",
            self.envs: "environments",
            self.kept_builds: "kept builds",
            self.verdicts: "verdicts",
            self.dependencies: "dependency code",
            self.ci: "CI stand-ins",
            self.oracle_examples: "oracle examples",
            self.baselines: "old baselines",
        }

    def present(self) -> list[tuple[Path, str]]:
        """The folders the cache root holds now, with what each holds.

        A folder no property names (left by another version of the tool, or made by hand) is listed
        too, as such, so nothing in the cache goes unseen.
        """
        if not self.root.is_dir():
            return []
        named = self.folders()
        found = []
        for path in sorted(self.root.iterdir()):
            if not path.is_dir():
                continue
            if path in named:
                found.append((path, named[path]))
            elif path.name.startswith(UNPACK_PREFIX):
                found.append((path, "half-unpacked"))
            else:
                found.append((path, "unknown folder"))
        return found

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


def _plain_child(folder: Path, name: str, where: str) -> Path:
    """``folder/name``, refused (``OutsideCacheError``) unless ``name`` is a plain name that stays inside."""
    plain = name and name not in (".", "..") and not any(c in name for c in "/\\\0")
    path = folder / name
    if not plain or not path.resolve().is_relative_to(folder.resolve()):
        raise OutsideCacheError(f"{name!r} is not a plain file name inside {where}")
    return path
