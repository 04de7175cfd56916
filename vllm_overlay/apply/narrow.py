"""A staging tree checked out narrow while the series is applied, and widened to the whole upstream meanwhile.

A first apply writes the upstream's 8,500 files, then ``git am`` rewrites the index once per
patch; right after the checkout git takes most of those files for racily clean and reads them
again. Checked out with git's sparse checkout to only the files the series touches, the patches
are applied, classified and committed by the same git commands with the same commit ids (their
checks read only those files and the directories on their way).

Every other file is written by ``git checkout-index`` from a private index of the checked-out
commit less the touched paths, started as the series starts (``widened``): it and the series
never write the same path, so one core writes the tree while the other applies the series, each
with one process (two checkout workers on one tree cost this machine's file system more CPU than
one: docs/speed.md). After both, the private index is brought to the series' last commit (its
files as written keep their stat data, the touched ones are written from HEAD) and becomes the
tree's: a plain clone, no sparse setting, no pattern file, no skip-worktree entry.

While narrowed, the tree's index is split (``core.splitIndex``): the checkout writes all its
entries once, as the shared index, and each later write (the series' check on a copy, every
step of ``git am``) writes only the entries that changed; the finish leaves a whole index, with
its cache tree, written after the second of the last file (``settle_index``): the user's first
``git status`` hashes no file again.

The sparse settings live in a file of their own that the clone's config includes, so that one
``git config`` adds them and one removes them; the private index is made from the listing of the
commit that ``narrow`` reads anyway (``update-index --index-info``), not from its trees again.

Where a path is one a pattern could not name exactly (a character that sparse patterns read as
special), or the upstream holds a link or a file on a touched path's way (``narrow``), nothing is
narrowed: the tree is checked out whole, as before.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from vllm_overlay import git as gitcmd
from vllm_overlay.apply import paths
from vllm_overlay.series import Patch

# Characters a sparse-checkout pattern (gitignore syntax) reads literally anywhere in a path.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_.,+=@%~/-]+")
_LINK_MODES = (b"120000", b"160000")  # a symlink, a submodule
# Patterns read as plain gitignore lines (not cone mode); no lstat of every skipped entry at each
# index read (git checks there whether a skipped file appeared): nothing writes them meanwhile.
# The index split: the checkout writes every entry once (the shared index), and each later write
# (the series' check on a copy, every step of ``git am``) only the entries that changed.
# The objects the series adds (its blobs, trees and commits, a few hundred) are written stored,
# not deflated: the check and ``git am`` write them, and the cache reads them all again to keep
# the build (``kept_builds``); about 1 MB more in the published tree's git directory.
_SETTINGS = (
    ("core.sparseCheckout", "true"),
    ("core.sparseCheckoutCone", "false"),
    ("sparse.expectFilesOutsideOfPatterns", "true"),
    ("core.splitIndex", "true"),
    ("core.looseCompression", "0"),
)
# The widening's private index is never split: its every entry changes as its files are written,
# and it becomes the tree's index (above the settings: ``-c`` wins over an included file).
_WHOLE_INDEX = ("-c", "core.splitIndex=false")
# The widening's writer: one process whatever the settings say (the other core applies the series).
_WRITER = ("-c", "checkout.workers=1", *_WHOLE_INDEX, "checkout-index", "--all", "--force", "-u")


def touched_paths(patches: Iterable[Patch]) -> list[str] | None:
    """Every path git reads or writes for ``patches`` (``paths.written_paths``); None where one is
    not safe to apply or not plainly nameable (the tree is then checked out whole)."""
    found: dict[str, None] = {}
    for patch in patches:
        if paths.problems(patch):
            return None
        for patched in patch.diff:
            for name in paths.written_paths(patched):
                if not _PLAIN_PATH.fullmatch(name):
                    return None
                found[name] = None
    return list(found) or None


def _pattern_file(tree: Path) -> Path:
    return tree / ".git" / "info" / "sparse-checkout"


def _write_patterns(tree: Path, touched: list[str]) -> None:
    """The sparse patterns naming exactly ``touched`` (plain names: ``touched_paths``), one a line."""
    pattern_file = _pattern_file(tree)
    pattern_file.parent.mkdir(parents=True, exist_ok=True)
    pattern_file.write_text("".join(f"/{name}\n" for name in sorted(touched)))


def _patterned_paths(tree: Path) -> list[str]:
    """The paths ``_write_patterns`` named."""
    return [line.removeprefix("/") for line in _pattern_file(tree).read_text().splitlines()]


# In the clone's git directory while it is narrowed: the sparse settings (included by its config)
# and the entries of the checked-out commit outside the narrowing (``ls-tree -r -z`` lines).
_SETTINGS_FILE = "vllm-overlay-sparse.config"
_UNTOUCHED_FILE = "vllm-overlay-untouched"


def _settings_text() -> str:
    """``_SETTINGS`` as a git config file (constant names and values: nothing to quote)."""
    sections: dict[str, list[str]] = {}
    for key, value in _SETTINGS:
        section, name = key.split(".")
        sections.setdefault(section, []).append(f"\t{name} = {value}\n")
    return "".join(f"[{section}]\n" + "".join(lines) for section, lines in sections.items())


def untouched_entries(listing: bytes, touched: list[str]) -> bytes | None:
    """The entries of ``listing`` (``git ls-tree -r -z``) outside ``touched``, as listed; None where
    a touched path is a symlink or submodule, or an entry lies on a touched path's way (``narrow``)."""
    touched_set = {name.encode() for name in touched}  # plain ASCII names (touched_paths)
    ancestors = {str(p).encode() for name in touched for p in PurePosixPath(name).parents if str(p) != "."}
    untouched: list[bytes] = []
    for entry in listing.split(b"\0")[:-1]:
        meta, _, name = entry.partition(b"\t")
        if name in ancestors or (name in touched_set and meta.startswith(_LINK_MODES)):
            return None
        if name not in touched_set:
            untouched.append(entry + b"\0")
    return b"".join(untouched)


def narrow(tree: Path, commit: str, touched: list[str]) -> bool:
    """Make the clone ``tree`` (not yet checked out) check out only ``touched`` of ``commit``; False
    (nothing changed: the checkout stays whole) where ``commit`` holds a symlink or submodule at a
    touched path, or anything but a directory on a touched path's way.

    Those are the trees where git's own path checks, and the tool's, read more than the touched
    files (a link's target, a file where a patch wants a directory): they are checked out whole.
    """
    listing = gitcmd.git(tree, "ls-tree", "-r", "-z", "--full-tree", commit, binary=True)
    untouched = untouched_entries(listing, touched)
    if untouched is None:
        return False
    git_dir = tree / ".git"
    (git_dir / _UNTOUCHED_FILE).write_bytes(untouched)  # the widening's private index
    _write_patterns(tree, touched)
    (git_dir / _SETTINGS_FILE).write_text(_settings_text())
    gitcmd.git(tree, "config", "include.path", _SETTINGS_FILE)  # relative to the config file
    return True


# The attributes by which git converts between a file and its blob (convert.c): a file so
# converted may differ from its blob, and hashing it may give another blob.
_CONVERSIONS = ("text", "eol", "crlf", "ident", "filter", "working-tree-encoding")


def _nul_terminated(names: list[str]) -> bytes:
    """``names`` as git's ``-z --stdin`` reads them (plain names: ``touched_paths``)."""
    return b"".join(name.encode() + b"\0" for name in names)


def converted(tree: Path, names: list[str]) -> bool:
    """True where git converts one of ``names`` between file and blob (``git check-attr``: an
    attribute of ``_CONVERSIONS`` set or given a value, not unspecified or unset)."""
    listed = _nul_terminated(names)
    out = gitcmd.git(tree, "check-attr", "-z", "--stdin", *_CONVERSIONS, stdin=listed, binary=True)
    fields = out.split(b"\0")
    return any(value not in (b"unspecified", b"unset") for value in fields[2::3])


# The private index, in the clone's git directory while the tree is widened.
_WIDEN_INDEX = "vllm-overlay-widen-index"


def _private_index(tree: Path) -> Path:
    return tree / ".git" / _WIDEN_INDEX


def _on_private_index(tree: Path) -> dict[str, str]:
    """What a git process adds to its environment to work on the widening's private index."""
    return {"GIT_INDEX_FILE": str(_private_index(tree))}


class Widening:
    """The untouched files of a narrowed tree, being written by a git process of their own."""

    def __init__(self, tree: Path, owner_fd: int | None) -> None:
        """Start writing every file of ``tree``'s HEAD outside its narrowing, with one process.

        ``owner_fd``, the staging area's owner lock, is held by the writer too: a run killed while
        it writes leaves an area no later run removes under it (``staging.remove_leftovers``).
        """
        self.tree = tree
        private = _on_private_index(tree)
        untouched = (tree / ".git" / _UNTOUCHED_FILE).read_bytes()
        gitcmd.git(tree, *_WHOLE_INDEX, "update-index", "-z", "--index-info", stdin=untouched, env=private)
        self.process = gitcmd.popen(
            "-C",
            str(tree),
            *_WRITER,
            env=private,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # what it failed to write, the last step writes (below)
            pass_fds=(owner_fd,) if owner_fd is not None else (),
        )

    def finish(self) -> None:
        """Wait for the files, then make the tree a plain clone of its HEAD (the series' last commit).

        Where the writer wrote every file (it exits 0: git answers a file it could not write with
        an error status), the private index holds HEAD's every entry but the touched paths, each
        with the stat data the writer recorded, and ``git am`` left each touched path as HEAD has
        it: ``update-index --add`` records the touched files that exist (a deleted one is absent),
        hashing those few and no ``lstat`` of the 8,500 others. That holds only where a file is
        its blob byte for byte: where an attribute converts a touched file (line endings, a
        filter, ``ident``, an encoding: ``converted``), or the writer failed, ``read-tree --reset
        -u HEAD`` instead, as ``git reset --hard`` would: each file is compared with its entry and
        what differs or is missing is written. Either way the index becomes the tree's. It is
        dated a minute ahead first (``patched_repo.date_ahead``): else git takes the files written
        in the index's last moments for racily clean and hashes them again. A file anything else
        wrote since is a new file (git writes a new file and renames it over the path), of another
        inode and date, which git sees without hashing. The narrowed tree's split index goes with
        its shared part: the tree's index is whole, as a clone's, and settled (``settle_index``).
        """
        from vllm_overlay.apply import patched_repo

        wrote_every_file = self.process.wait() == 0
        touched = _patterned_paths(self.tree)
        gitcmd.git(self.tree, "config", "--unset", "include.path")
        git_dir = self.tree / ".git"
        for done_with in (_pattern_file(self.tree), git_dir / _SETTINGS_FILE, git_dir / _UNTOUCHED_FILE):
            done_with.unlink()
        index = _private_index(self.tree)
        if index.exists():  # none where no entry was left to write and the writer failed
            patched_repo.date_ahead(index)
        private = _on_private_index(self.tree)
        written = [name for name in touched if (self.tree / name).is_symlink() or (self.tree / name).is_file()]
        if wrote_every_file and index.exists() and written and not converted(self.tree, written):
            listed = _nul_terminated(written)
            gitcmd.git(self.tree, *_WHOLE_INDEX, "update-index", "--add", "-z", "--stdin", stdin=listed, env=private)
        else:
            gitcmd.git(self.tree, *_WHOLE_INDEX, "read-tree", "--reset", "-u", "HEAD", env=private)
        os.replace(index, self.tree / ".git" / "index")
        for shared in git_dir.glob("sharedindex.*"):  # what the narrowed tree's split index was read with
            shared.unlink()
        settle_index(self.tree)

    def stop(self) -> None:
        """Stop the writer (the run failed or was interrupted: its staging tree is removed next)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()


# How long past the second of the last file written the index is written again: the clock file
# systems date files by may lag the one ``time.time`` reads by a tick.
_SETTLE_MARGIN_S = 0.02


def _index_written_after(index: Path, second: int) -> bool:
    """Whether ``index`` is dated in a second after ``second``, and not ahead of the clock."""
    mtime = index.stat().st_mtime
    return int(mtime) > second and mtime <= time.time()


def settle_index(tree: Path) -> None:
    """Make ``tree``'s index one the user's first git command need not check again.

    Written in the second the last files were, its entries are racily clean (git 2.39 compares
    the index's date with each file's to the second) and git hashes those files again at every
    read until one writes the index in a later second; and an index made by ``update-index``
    has no cache tree (its TREE extension), so ``git status`` compares every entry with HEAD's
    trees. After the finish: wait for the next second (every tracked file was written before
    the index), then ``git write-tree`` records the cache tree, and where it did not write the
    index, ``update-index --force-write-index`` writes it. Both read the index dated a minute
    ahead (``patched_repo.date_ahead``: nothing but git wrote its files, and the tree is not
    published yet), so neither hashes a file; the index they write is dated by the clock, after
    every file, and an edit made after it is seen by its date as in any clone.
    """
    from vllm_overlay.apply import patched_repo

    index = tree / ".git" / "index"
    second = int(index.stat().st_mtime)
    time.sleep(max(0.0, second + 1 + _SETTLE_MARGIN_S - time.time()))
    patched_repo.date_ahead(index)
    gitcmd.git(tree, *_WHOLE_INDEX, "write-tree")
    for _attempt in range(3):  # once, unless the file system's clock still read the last second
        if _index_written_after(index, second):
            return
        patched_repo.date_ahead(index)
        gitcmd.git(tree, *_WHOLE_INDEX, "update-index", "--force-write-index")
        time.sleep(_SETTLE_MARGIN_S)


def start_widening(tree: Path, owner_fd: int | None = None) -> Widening | None:
    """``Widening`` of ``tree``, started; None for a tree never narrowed (it is whole already)."""
    return Widening(tree, owner_fd) if _pattern_file(tree).is_file() else None


@contextlib.contextmanager
def widened(tree: Path, owner_fd: int | None = None) -> Iterator[None]:
    """Write ``tree``'s files outside its narrowing while the body runs; a plain clone after it.

    The body must leave the untouched paths alone (it applies the series that named the touched
    ones). Where it or the finish raises (an interrupt included), the writer is stopped first: the
    tree is left as it is, to be removed.
    """
    widening = start_widening(tree, owner_fd)
    if widening is None:
        yield
        return
    try:
        yield
        widening.finish()
    except BaseException:
        widening.stop()
        raise
