"""A private copy of a published tree that shares its unchanged files with it, made in a fraction
of a checkout's time (the incremental re-apply builds on it).

Working-tree files and git's objects are hard links to the published tree's; the rest of ``.git``
(index, refs, config, logs) is copied. Sharing is safe because git never writes a tracked file or
an object in place: ``git reset``, ``git am`` and ``git apply`` write a new file and rename it over
the old path (checked for git 2.39), so a file the copy changes gets a new inode and the
published tree keeps its own; objects are immutable. A hard link changes a file's ctime, so the
copy's repository is set to ``core.trustctime=false`` (git's advice when something outside git
changes ctime): its ``git status`` then decides by size, mtime and inode, and does not re-read
every file once. Where hard links cannot be made (another file system, a restricted one) the
caller builds the tree the slow way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def link_copy(source: Path, dest: Path) -> None:
    """Make ``dest`` (absent) a copy of the git working tree ``source`` sharing its files by hard links.

    Raises OSError where a link cannot be made; ``dest`` may then hold part of the copy.
    """
    top = os.path.realpath(source)
    shutil.copytree(
        source,
        dest,
        symlinks=True,
        copy_function=os.link,
        ignore=lambda directory, names: {".git"} if os.path.realpath(directory) == top else set(),
    )
    git_dir = source / ".git"
    shutil.copytree(
        git_dir,
        dest / ".git",
        symlinks=True,
        ignore=lambda directory, names: {"objects"} if Path(directory) == git_dir else set(),
    )
    shutil.copytree(git_dir / "objects", dest / ".git" / "objects", symlinks=True, copy_function=os.link)
