"""The output directory's life: one run at a time, work beside it, publish in one step.

Beside an output directory OUTPUT (say build/patched) live:

    .patched.lock              the output's lock: held (flock) by the run that writes OUTPUT; it
                               holds that run's pid, so a second run can say whom it waits for
    .patched.staging-PID/      one run's staging area:
        owner                  held (flock) for as long as the run lives
        mails/                 the patch mails exactly as every git step reads them
        tree/                  the clone the series is applied in
    .patched.spare/            the tree the last publish replaced, kept for the next run

Publishing exchanges ``tree/`` and OUTPUT in one ``renameat2(RENAME_EXCHANGE)``: at every instant
OUTPUT is either the old tree or the new one, never missing and never half of either. The old
tree lands in the staging area; when it is a tree this tool published (it carries an apply
record) it is kept as the spare, else it is removed with the area. A run killed at any point
leaves at most a staging area whose owner lock nobody holds; the next run (under the output lock)
removes it.

Why an exchange and not a symlink swap: OUTPUT stays a real directory at its own path, so users'
shells, ``git -C build/patched``, export-patches and everything that resolves the path keep seeing
one plain git repository, and ``rm -rf build/patched`` still removes all of it (its spare is
``.patched.spare`` beside it). Where the kernel or the file system cannot exchange (not Linux,
some network file systems) publishing falls back to two renames; a run killed between them leaves
the old tree in its staging area as ``retired``, and the next run puts it back before anything else.

Why a spare: the replaced tree differs from the next build in the few files the last patches
touch, so a re-apply after a patch changed starts from it (reset to the last patch it still
shares, instead of checking out 8,500 files), and publishing never has to delete a whole tree.
It costs one more tree of disk beside the output; removing it is always safe (the next such run
builds from upstream instead). Only a run holding the output's lock moves it, and it is used only
where its own record names the run's inputs (``apply._spare_prefix``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import atomicfile, faults, interrupts
from vllm_overlay import git as gitcmd
from vllm_overlay.errors import InputError

OWNER_FILE = "owner"
# Written into the git directory of every tree this tool publishes: the proof that a directory at
# the output's path is the tool's to replace. Anything else there is the user's and is never touched.
PUBLISHED_MARKER = "vllm-overlay-published"
# Trees published before the marker existed carry this key in their git config (apply writes it).
_LEGACY_CONFIG_KEY = "vllm-overlay"
RETIRED = "retired"  # the old tree, while the two-rename fallback publishes
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class OutputBusy(InputError, RuntimeError):
    """Another run holds the output's lock (and we were asked not to wait)."""

    def __init__(self, output: Path, holder: int | None) -> None:
        who = f"pid {holder}" if holder else "another process"
        super().__init__(f"{output} is being written by {who} (another run of this tool); try again when it is done")
        self.output = output
        self.holder = holder


class OutputNotOurs(InputError, RuntimeError):
    """The output path holds something this tool did not publish: replacing it would destroy it."""

    def __init__(self, output: Path, why: str) -> None:
        super().__init__(
            f"{output} {why}, which this tool did not publish: refusing to replace it (nothing was touched). "
            "Pass an absent or empty directory, or one an earlier run published."
        )
        self.output = output


def _published_by_tool(tree: Path) -> bool:
    git_dir = tree / ".git"
    if (git_dir / PUBLISHED_MARKER).is_file():
        return True
    config = git_dir / "config"
    try:
        text = config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return f"[{_LEGACY_CONFIG_KEY}]" in text and "upstream =" in text


def check_replaceable(output: Path) -> None:
    """Raise OutputNotOurs unless ``output`` is absent, an empty directory, or a tree this tool published."""
    if not output.exists() and not output.is_symlink():
        return
    if output.is_symlink() or not output.is_dir():
        raise OutputNotOurs(output, "is not a directory" if not output.is_symlink() else "is a symbolic link")
    try:
        empty = next(output.iterdir(), None) is None
    except OSError as exc:
        raise OutputNotOurs(output, f"cannot be read ({exc.strerror})") from None
    if not empty and not _published_by_tool(output):
        raise OutputNotOurs(output, "holds files")


def check_tool_directory(path: Path, names: frozenset[str], patterns: tuple[str, ...] = ()) -> None:
    """Raise OutputNotOurs unless ``path`` is absent, empty, or holds only what the tool writes there.

    For the directories a command empties or replaces whole that are not git trees (the image's
    build context, test-patches' work directory): ``names`` are the entries the tool makes in it,
    ``patterns`` glob patterns of the same (a staging area's ``.NAME.staging-PID``). Anything else is
    the user's: the command stops before touching it.
    """
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise OutputNotOurs(path, "is not a directory" if not path.is_symlink() else "is a symbolic link")
    try:
        entries = sorted(entry.name for entry in os.scandir(path))
    except OSError as exc:
        raise OutputNotOurs(path, f"cannot be read ({exc.strerror})") from None
    foreign = [n for n in entries if n not in names and not any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise OutputNotOurs(path, f"holds {', '.join(foreign[:3])}{more}")


def mark_published(tree: Path, head: str | None = None) -> None:
    """Mark ``tree`` (about to be published, or just exported) as this tool's, so a later run may replace it.

    The marker records the HEAD commit whose work patches/ holds (the one published, or the one
    export-patches wrote out): a later HEAD means the user committed there since. ``head``: that
    commit, where the caller just read it (None: read here).
    """
    head = head or gitcmd.git(tree, "rev-parse", "--verify", "HEAD^{commit}").strip()
    text = f"published by vllm-overlay; the next run may replace this tree\nhead {head}\n"
    atomicfile.write_bytes(tree / ".git" / PUBLISHED_MARKER, text.encode())


def published_head(tree: Path) -> str | None:
    """The HEAD commit this tool published at ``tree`` (None: unknown, e.g. a tree of an older version)."""
    try:
        text = (tree / ".git" / PUBLISHED_MARKER).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("head ") and len(line) > 5:
            return line[5:].strip()
    return None


def lock_path(output: Path) -> Path:
    return output.parent / f".{output.name}.lock"


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    return int(text) if text.isdigit() else None


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def output_lock(
    output: Path, *, wait: bool = True, on_wait: Callable[[int | None], None] | None = None
) -> Iterator[None]:
    """Hold ``output``'s lock. If another run holds it: wait (telling ``on_wait`` its pid) or raise OutputBusy."""
    fd = os.open(lock_path(output), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            if not wait:
                raise OutputBusy(output, holder) from None
            if on_wait is not None:
                on_wait(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _write_pid(fd)
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass
class StagingArea:
    root: Path
    owner_fd: int

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def mails(self) -> Path:
        return self.root / "mails"

    def remove(self) -> None:
        """Remove the area (and the old tree an exchange left in it), then give up its ownership.

        Ctrl-C may cut the removal short: what is left has no owner then, and the next run removes it.
        """
        try:
            shutil.rmtree(self.root, ignore_errors=True)
        finally:
            os.close(self.owner_fd)


def spare_path(output: Path) -> Path:
    return output.parent / f".{output.name}.spare"


def take_spare(area: StagingArea, output: Path) -> bool:
    """Move ``output``'s spare tree into ``area`` as its tree (False: there is none). Needs the output lock."""
    try:
        os.rename(spare_path(output), area.tree)
    except FileNotFoundError:
        return False
    return True


def keep_spare(old_tree: Path, output: Path) -> None:
    """Keep ``old_tree`` (the tree a publish just replaced, in its staging area) as ``output``'s spare.

    A spare already there moves into the staging area, to be removed with it. Needs the output lock.
    """
    spare = spare_path(output)
    if spare.exists():
        os.rename(spare, old_tree.parent / "old-spare")
    os.rename(old_tree, spare)


def staging_prefix(output: Path) -> str:
    return f".{output.name}.staging-"


def create_staging(output: Path) -> StagingArea:
    """A fresh staging area beside ``output``, owned by this process. Call with the output's lock held."""
    root = output.parent / f"{staging_prefix(output)}{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)  # an earlier process with this pid died here
    root.mkdir()
    fd = os.open(root / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _write_pid(fd)
    (root / "mails").mkdir()
    return StagingArea(root, fd)


def _owner_alive(area: Path) -> bool:
    """True while the process that made ``area`` lives (it holds the owner file's lock)."""
    try:
        fd = os.open(area / OWNER_FILE, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        # No owner file: made by a run that died before writing it (or by an older version of
        # the tool). Areas are only made under the output lock, which the caller holds.
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def remove_leftovers(output: Path) -> list[Path]:
    """Remove what killed runs left beside ``output``; return what was removed. Needs the output lock.

    Staging areas whose owner is gone go (a published run's old tree is inside its area); a tree
    retired by an interrupted two-rename publish is first put back if ``output`` is missing.
    Trees retired by earlier versions of the tool (``.NAME.retired-PID``) are treated the same.
    """
    parent = output.parent
    stale = [p for p in parent.glob(f"{staging_prefix(output)}*") if p.is_dir() and not _owner_alive(p)]
    legacy = sorted(parent.glob(f".{output.name}.retired-*"))
    retired = [p / RETIRED for p in stale if (p / RETIRED).is_dir()] + legacy
    if retired and not output.exists():
        os.rename(retired[0], output)
    removed = [p for p in stale + legacy if p.exists()]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; False where the kernel or file system cannot."""
    import ctypes  # here: only a publish needs it

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def publish(area: StagingArea, output: Path, head: str | None = None) -> Path | None:
    """Make ``area.tree`` the ``output`` directory in one step; the old tree is left in the area.
    ``head``: the tree's HEAD commit, where the caller knows it (``mark_published``).

    Returns where the old tree now lies (None: there was none). SIGINT and SIGTERM wait until the
    step is done, so an interrupted run either published or did not, and says which.
    """
    with interrupts.deferred():
        faults.phase("publish")
        mark_published(area.tree, head)
        if not output.exists():
            os.rename(area.tree, output)
            old = None
        elif _renameat2_exchange(area.tree, output):
            old = area.tree
        else:
            os.rename(output, area.root / RETIRED)
            faults.phase("publish-retired")
            os.rename(area.tree, output)
            old = area.root / RETIRED
        faults.phase("published")
        return old
