"""Series applied before, kept in the cache: a build into a new output checks their commits out.

A full apply into a new output (a second worktree, a fresh clone of the project, an output
removed by hand) re-applies every patch: the check on a private index, ``mailinfo``, the trailers,
one ``git am`` per run of authors, each a git process of its own. Its commits depend only on the
upstream, the patches and the engine (``apply_record``), so after every apply that published the
whole series the cache keeps them:

    <cache>/kept-builds/<head>.json    the published tree's apply record (inputs, results, HEAD)
    <cache>/kept-builds/<head>.pack    the objects of upstream..HEAD (the commits, their new trees
    <cache>/kept-builds/<head>.idx     and blobs): a few hundred, one pack, stored without deltas or deflation

A later apply with the same inputs whose output and spare cannot serve it takes the kept build
that shares the most leading patches with the run (the patch files compared byte for byte, as
the spare's are), clones the upstream as every build does, links the pack into the clone, checks
the last shared commit out and applies only the patches after it. The upstream is the verified
import, as always; the pack is used only once ``git verify-pack`` has hashed every object in it
again (an object's name is the hash of its content, so a whole pack holding the recorded commit
holds exactly the build), and a git step that cannot use it (an object missing) falls back to
the build from upstream. A pack never names an upstream object (it holds what ``upstream..HEAD``
adds), so it cannot stand in for a verified one.

At most ``LIMIT`` builds are kept, the least recently used removed first; removing the folder is
always safe (the next apply re-applies every patch).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import atomicfile
from vllm_overlay import git as gitcmd
from vllm_overlay.apply import record as apply_record
from vllm_overlay.apply.classify import PatchResult
from vllm_overlay.series import Patch
from vllm_overlay.store import Store

LIMIT = 12


@dataclass(frozen=True)
class KeptBuild:
    record: Path
    pack_name: str  # git's name of the pack (``pack-NAME.pack`` in a repository)
    shared: list[PatchResult]  # the leading patches of the run this build holds, as recorded

    @property
    def pack(self) -> Path:
        return self.record.with_suffix(".pack")

    @property
    def index(self) -> Path:
        return self.record.with_suffix(".idx")


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _entries(store: Store) -> list[Path]:
    kept = store.kept_builds
    return sorted(kept.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True) if kept.is_dir() else []


def _remove(record: Path) -> None:
    for suffix in (".json", ".pack", ".idx"):
        record.with_suffix(suffix).unlink(missing_ok=True)


def _prune(store: Store) -> None:
    """Remove all but the ``LIMIT`` most recently used builds (under the cache's lock)."""
    with store.exclusive():
        with contextlib.suppress(OSError):
            for record in _entries(store)[LIMIT:]:
                _remove(record)


def best(
    store: Store, inputs: apply_record.Inputs, patches: list[Patch] | list[tuple[str, bytes]], verify: bool = True
) -> KeptBuild | None:
    """The kept build of ``inputs`` that holds the most leading ``patches`` (None: none holds any;
    ``patches``: parsed, or name and bytes as ``series.read_series_bytes`` reads them).

    With ``verify`` the build's pack is proven whole first (``_pack_intact``); one that is not is
    removed, never used, and the next best is tried. Without, the records alone answer.
    """
    candidates: list[tuple[int, Path, dict]] = []
    for path in _entries(store):  # most recently used first: the first of equal counts wins
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("format") != apply_record.FORMAT:
            continue
        if not apply_record.same_inputs(record, inputs):
            continue
        count = apply_record.same_prefix(record, patches)
        shared = apply_record.results_of(record)[:count]
        if count and all(r.accepted and r.commit for r in shared):
            candidates.append((count, path, record))
    for count, path, record in sorted(candidates, key=lambda candidate: -candidate[0]):
        if verify and not _pack_intact(path):
            with contextlib.suppress(OSError):
                _remove(path)
            continue
        return KeptBuild(path, str(record.get("kept_pack")), apply_record.results_of(record)[:count])
    return None


def _pack_intact(record: Path) -> bool:
    """True when the build's pack is whole: ``git verify-pack`` hashes every object in it again
    (about 10 ms CPU for 15 patches). Its files' dates say nothing: git sets a pack's mtime whenever it
    would write an object the pack holds, and a kept pack is hard-linked into every tree built on it.
    A pack that holds other objects than the build's is whole too; the checkout then misses an
    object and the run builds from upstream (``KeptBuilds.check_out``)."""
    try:
        done = gitcmd.process("verify-pack", str(record.with_suffix(".idx")), capture_output=True, check=False)
    except OSError:
        return False
    return done.returncode == 0


def held(store: Store, inputs: apply_record.Inputs, mails: list[tuple[str, bytes]]) -> int:
    """How many leading patches (``mails``: name and bytes) the best kept build of ``inputs`` records
    (its pack unproven: the build that uses it proves it)."""
    build = best(store, inputs, mails, verify=False)
    return len(build.shared) if build else 0


def link_into(build: KeptBuild, git_dir: Path) -> None:
    """Put ``build``'s pack into the repository at ``git_dir`` (hard links; copies across file systems)."""
    pack_dir = git_dir / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    for source in (build.pack, build.index):  # the index last: git sees a pack once its index is there
        target = pack_dir / f"pack-{build.pack_name}{source.suffix}"
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    _touch(build.record)


class KeptBuilds:
    """The kept builds of one run's inputs, as the apply engine uses them (``apply.apply_series``)."""

    def __init__(
        self,
        store: Store,
        inputs: apply_record.Inputs,
        upstream_commit: str,
        verify_upstream: Callable[[], object] | None = None,
    ) -> None:
        """``verify_upstream``: called before a kept build is checked out, where the run has not yet
        proven the upstream (it raises if the cache's import changed)."""
        self.store = store
        self.inputs = inputs
        self.upstream_commit = upstream_commit
        self.verify_upstream = verify_upstream

    def check_out(self, tree: Path, patches: list[Patch]) -> list[PatchResult] | None:
        """Make ``tree`` (absent) a clone at the last commit the best kept build shares with ``patches``;
        the shared results (None: no build serves, or git could not use it; ``tree`` is then absent).

        Where patches are left to apply, the clone is narrowed to the files they touch (``narrow``):
        the others are written while they are applied (``narrow.widened``).
        """
        from vllm_overlay.apply import narrow, patched_repo
        from vllm_overlay.upstream import trees as upstream_trees

        build = best(self.store, self.inputs, patches)
        if build is None:
            return None
        if self.verify_upstream is not None:
            self.verify_upstream()
        try:
            upstream_trees.clone_at(
                self.store,
                tree,
                build.shared[-1].commit,
                add_objects=lambda git_dir: link_into(build, git_dir),
                only=narrow.touched_paths(patches[len(build.shared) :]),
            )
            patched_repo.record_upstream(tree, self.upstream_commit)
        except (OSError, gitcmd.GitError):  # a pack removed meanwhile, an object missing
            shutil.rmtree(tree, ignore_errors=True)
            return None
        return build.shared

    def keep(self, tree: Path) -> None:
        """Keep the build in ``tree`` (a staging tree whose apply record was just written) in the cache.

        Best effort: a full disk or a git failure keeps nothing and costs the run nothing else.
        """
        record = apply_record.load(tree)
        if record is None or record.get("partial") or not all(r.accepted for r in apply_record.results_of(record)):
            return
        head = str(record["head"])
        kept = self.store.kept_builds
        if (kept / f"{head}.json").is_file():
            _touch(kept / f"{head}.json")
            return
        work = kept / f".keep-{os.getpid()}"  # a killed run's is removed by the next run of its pid
        try:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            # Stored, not deflated: a few hundred objects (1.5 MB for this project's series, 0.47 MB
            # deflated) for 20-25 ms less CPU in the build that keeps them (docs/speed.md, sixth round).
            name = gitcmd.git(
                tree, "-c", "pack.compression=0",
                "pack-objects", "--revs", "--window=0", "--depth=0", "-q", f"{work}/pack",
                stdin=f"{head}\n^{self.upstream_commit}\n".encode(),
            ).strip()  # fmt: skip
            pack, index = kept / f"{head}.pack", kept / f"{head}.idx"
            os.replace(f"{work}/pack-{name}.pack", pack)
            os.replace(f"{work}/pack-{name}.idx", index)
            record["kept_pack"] = name
            atomicfile.write_bytes(kept / f"{head}.json", (json.dumps(record, sort_keys=True) + "\n").encode())
            _prune(self.store)
        except (OSError, gitcmd.GitError):
            pass  # nothing kept: the next build into a new output applies every patch
        finally:
            shutil.rmtree(work, ignore_errors=True)
