"""A staging tree checked out narrow while the series is applied, and widened to the whole upstream after.

A first apply writes the upstream's 8,500 files, then ``git am`` rewrites the index once per
patch; right after the checkout git takes most of those files for racily clean and reads them
again. Checked out with git's sparse checkout to only the files the series touches, the patches
are applied, classified and committed by the same git commands with the same commit ids (their
checks read only those files and the directories on their way); ``widen`` then writes every
other file once, from the last commit, and leaves a plain clone: no sparse setting, no pattern
file, no skip-worktree entry.

Where a path is one a pattern could not name exactly (a character that sparse patterns read as
special), or the upstream holds a link or a file on a touched path's way (``narrow``), nothing is
narrowed: the tree is checked out whole, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from vllm_overlay import paths
from vllm_overlay.series import Patch

# Characters a sparse-checkout pattern (gitignore syntax) reads literally anywhere in a path.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_.,+=@%~/-]+")
_LINK_MODES = ("120000", "160000")  # a symlink, a submodule
# Patterns read as plain gitignore lines (not cone mode); no lstat of every skipped entry at each
# index read (git checks there whether a skipped file appeared): nothing writes them meanwhile.
_SETTINGS = (
    ("core.sparseCheckout", "true"),
    ("core.sparseCheckoutCone", "false"),
    ("sparse.expectFilesOutsideOfPatterns", "true"),
)


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


def narrow(tree: Path, commit: str, touched: list[str]) -> bool:
    """Make the clone ``tree`` (not yet checked out) check out only ``touched`` of ``commit``; False
    (nothing changed: the checkout stays whole) where ``commit`` holds a symlink or submodule at a
    touched path, or anything but a directory on a touched path's way.

    Those are the trees where git's own path checks, and the tool's, read more than the touched
    files (a link's target, a file where a patch wants a directory): they are checked out whole.
    """
    from vllm_overlay import patched_repo

    touched_set = set(touched)
    ancestors = {str(parent) for name in touched for parent in PurePosixPath(name).parents if str(parent) != "."}
    listing = patched_repo.git(tree, "ls-tree", "-r", "-z", "--full-tree", commit)
    for entry in listing.split("\0"):
        meta, _, name = entry.partition("\t")
        if name in ancestors or (name in touched_set and meta.startswith(_LINK_MODES)):
            return False
    pattern_file = _pattern_file(tree)
    pattern_file.parent.mkdir(parents=True, exist_ok=True)
    pattern_file.write_text("".join(f"/{name}\n" for name in sorted(touched_set)))
    for key, value in _SETTINGS:
        patched_repo.git(tree, "config", key, value)
    return True


def widen(tree: Path) -> None:
    """Check out every file of ``tree``'s index that its narrowing left out, and drop the narrowing.

    ``read-tree -mu HEAD`` with the pattern that takes every path: the one-tree merge keeps the
    index the series left (it is HEAD's after its last commit) and writes the files it marks
    skipped, with the checkout's own workers. Nothing to do for a tree never narrowed.
    """
    from vllm_overlay import patched_repo

    pattern_file = _pattern_file(tree)
    if not pattern_file.is_file():
        return
    pattern_file.write_text("/*\n")
    patched_repo.git(tree, "read-tree", "-mu", "HEAD")
    for key, _value in _SETTINGS:
        patched_repo.git(tree, "config", "--unset", key)
    pattern_file.unlink()
