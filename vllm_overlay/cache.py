"""What the cache holds, and removing the test environments no current lock uses.

A test environment is about 10 GB and is keyed by the lock, the pins and the Python version, so
every upstream bump leaves the previous one behind. ``entries`` lists everything under the cache
root with its size; ``prune`` removes the environments (and their build logs) whose key is not the
current one, and hidden build directories that no published environment points to (left by an
interrupted build). The verdict store (``verdicts/``) holds one scope per environment key and
runner version: the scopes other than the current one go with their environment (and the
``baselines/`` folder the store replaced); the end-to-end suite's scope (``verdicts/e2e/``) is kept.
Every other folder the store names (``Store.present``: downloads, the upstream repository, the
kept builds, at most 12, ``kept_builds``, the CI stand-ins, ...) is listed but never pruned here:
they are small or shared across locks.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import output
from vllm_overlay.env import testenv
from vllm_overlay.store import Store
from vllm_overlay.testrun import verdict_store
from vllm_overlay.upstream.lock import Lock

SCOPE_RE = re.compile(r"^[0-9A-Za-z_.-]+-r[0-9]+$")  # verdict_store.scope_name's shape
CURRENT = "current"
STALE = "stale"
ORPHAN = "orphan"
KEPT = "kept"


@dataclass(frozen=True)
class Entry:
    path: Path
    kind: str  # environment, build log, verdicts, or what the store says a cache folder holds
    status: str  # current, stale, orphan, kept
    size: int

    @property
    def removable(self) -> bool:
        return self.status in (STALE, ORPHAN)


def current_key(lock: Lock) -> str:
    return testenv.env_key(lock, testenv.requirements(lock))


def disk_usage(path: Path) -> int:
    """Bytes of the files under ``path``; symbolic links are not followed."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed while walking
                pass
    return total


def _kept_keys(store: Store) -> set[str]:
    """Environments of this checkout other than the test environment: the CPU runtime's
    (cpu/runtime.lock, vllm_overlay.cpu.runtime), where its wheel is in the cache to derive it from."""
    from vllm_overlay.cpu import runtime as cpu_runtime

    key = cpu_runtime.cached_key(store)
    return {key} if key else set()


def _environment_entries(store: Store, key: str) -> list[Entry]:
    if not store.envs.is_dir():
        return []
    keys = {key, *_kept_keys(store)}
    published = {link.resolve() for link in store.envs.iterdir() if link.is_symlink()}
    entries = []
    for path in sorted(store.envs.iterdir()):
        if path.is_symlink():
            status = CURRENT if path.name in keys else STALE
            entries.append(Entry(path, "environment", status, disk_usage(path.resolve())))
        elif path.name.endswith(".build.log"):
            status = CURRENT if path.name.removesuffix(".build.log") in keys else STALE
            entries.append(Entry(path, "build log", status, disk_usage(path)))
        elif path.name.startswith(".") and path.is_dir() and path.resolve() not in published:
            entries.append(Entry(path, "unfinished build", ORPHAN, disk_usage(path)))
    return entries


def _verdict_entries(store: Store, key: str) -> list[Entry]:
    """The old baselines, and the verdict store's scopes: test-patches' current one, its stale ones, the rest kept.

    Only scopes shaped as test-patches makes them are ever stale; any other folder (the end-to-end
    suite's ``e2e``, one made by hand) is listed and kept.
    """
    found = []
    if store.baselines.is_dir():
        found.append(Entry(store.baselines, "old baselines", STALE, disk_usage(store.baselines)))
    if store.verdicts.is_dir():
        current = verdict_store.scope_name(key, Path())
        for path in sorted(store.verdicts.iterdir()):
            if not path.is_dir() or path.is_symlink():
                continue
            if SCOPE_RE.match(path.name):  # only scopes the store made
                status = CURRENT if path.name == current else STALE
            else:
                status = KEPT
            found.append(Entry(path, "verdicts", status, disk_usage(path)))
    return found


def entries(store: Store, lock: Lock) -> list[Entry]:
    """The environments and verdict scopes one by one, then every other folder the store says the cache holds."""
    key = current_key(lock)
    found = _environment_entries(store, key) + _verdict_entries(store, key)
    listed_above = (store.envs, store.verdicts, store.baselines)
    for path, what in store.present():
        if path not in listed_above:
            found.append(Entry(path, what, KEPT, disk_usage(path)))
    return found


def prune(store: Store, lock: Lock, dry_run: bool = False) -> list[Entry]:
    """Remove the stale environments and unfinished builds; return what was (or would be) removed."""
    from vllm_overlay.cpu.runtime import STORE_LOCK

    # No build or check may run while environments are removed (the CPU runtime builds under a lock
    # of its own).
    with store.exclusive(), store.exclusive(STORE_LOCK):
        key = current_key(lock)
        removable = [e for e in _environment_entries(store, key) + _verdict_entries(store, key) if e.removable]
        if dry_run:
            return removable
        current = (store.envs / key).resolve()
        for entry in removable:
            if entry.path.is_symlink():
                target = entry.path.resolve()
                entry.path.unlink()
                if target == current:  # a stray link to the current environment goes, the environment stays
                    continue
                if _built_here(store, target):
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    output.warn(
                        f"{entry.path} pointed at {target}, which this cache did not build: "
                        "removed the link, left the directory as it was"
                    )
            elif entry.path.is_dir():
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                entry.path.unlink(missing_ok=True)
    return removable


def _built_here(store: Store, target: Path) -> bool:
    """True for an environment directory this cache built: a hidden directory right in envs/.

    A link in envs/ may point anywhere (made by hand, or the cache copied); only what the store's
    own builds make (``envs/.<key>.<pid>-<time>``) is ever removed through it.
    """
    return target.parent == store.envs.resolve() and target.name.startswith(".") and not target.is_symlink()
