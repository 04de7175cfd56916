"""What a patch may touch: only regular text files inside the upstream tree it targets."""

from __future__ import annotations

import codecs
import os
from pathlib import Path, PurePosixPath

from vllm_overlay.series import Patch

SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"


def _path_problem(name: str) -> str | None:
    if not name:
        return "empty path"
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        return f"absolute path {name!r}"
    if ".." in path.parts:
        return f"path with '..' component {name!r}"
    if any(part in (".", "") for part in name.split("/")):
        # git applies 'vllm/./core.py' to nothing it can find: say so instead of reporting a conflict
        return f"path with a '.' or empty component {name!r} (write it as {path.as_posix()!r})"
    if any(_names_git_dir(part) for part in path.parts):
        return f"path inside .git {name!r} (or a name a file system reads as .git)"
    return None


# Code points HFS+ ignores in a name (git's is_hfs_dotgit): ".g\u200cit" is ".git" there.
_HFS_IGNORED = {*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF}


def _names_git_dir(part: str) -> bool:
    """True where some file system opens ``part`` as ``.git``: any case (``.GIT`` on a case-insensitive
    one), with trailing dots or blanks (NTFS drops them), its 8.3 short name ``git~1``, or with code
    points HFS+ ignores. git itself refuses these names in a tree it checks out; a patch is refused
    before it gets that far."""
    folded = "".join(c for c in part if ord(c) not in _HFS_IGNORED).lower()
    return folded.rstrip(". ") == ".git" or folded == "git~1"


def attribute_files(patch: Patch) -> list[str]:
    """The ``.gitattributes`` files (any case) a patch writes: they would steer how git converts,
    diffs and merges the tree's files, so the series may not carry one (``export`` refuses it too)."""
    return sorted(
        {
            name
            for patched in patch.diff
            for name in written_paths(patched)
            if PurePosixPath(name).name.lower() == ".gitattributes"
        }
    )


def _symlink_on_the_way(tree: Path, name: str) -> str | None:
    """The first directory of ``name``'s way that is a symlink in ``tree`` (None: there is none).

    git's own apply refuses a path beyond a symlink, but a 3-way merge writes through it: the
    commit would change the link's target, another path than the patch names.
    """
    parts = PurePosixPath(name).parts[:-1]
    for depth in range(1, len(parts) + 1):
        way = "/".join(parts[:depth])
        if (tree / way).is_symlink():
            return way
    return None


def _leaves_tree(tree: Path, name: str) -> bool:
    """True if ``name`` resolves (through any symlink in the tree) outside ``tree``."""
    root = tree.resolve()
    resolved = (tree / name).resolve()
    return os.path.commonpath([root, resolved]) != str(root)


def _git_path(name: str) -> str:
    """A path as git means it: git C-quotes unusual names (``"caf\\303\\251.py"``)."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return codecs.escape_decode(name[1:-1].encode("ascii", "backslashreplace"))[0].decode(
            "utf-8", "surrogateescape"
        )
    return name


def _header_paths(line: str) -> list[str]:
    """The two paths of a ``diff --git a/X b/Y`` line, as git reads them (quoted or not)."""
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        end = rest.index('"', 1)
        while rest[end - 1] == "\\":
            end = rest.index('"', end + 1)
        return [_git_path(rest[: end + 1]), _git_path(rest[end + 2 :])]
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[2:half] == rest[half + 3 :]:
        return [rest[:half], rest[half + 1 :]]  # a/N b/N: the usual case, spaces in N included
    first, sep, second = rest.partition(" b/")
    return [first, "b/" + second] if sep else [rest]


def written_paths(patched: object) -> list[str]:
    """Every path git reads or writes for one file of a patch: the ``diff --git`` header, ``---``/``+++``,
    and ``rename``/``copy`` from/to (git writes those, whatever the other lines say)."""
    names: list[str] = []
    for raw in (patched.source_file, patched.target_file):  # type: ignore[attr-defined]
        if raw and raw != "/dev/null":
            names.append(_strip(_git_path(raw)))
    for line in str(patched.patch_info).splitlines():  # type: ignore[attr-defined]
        if line.startswith("diff --git "):
            names.extend(_strip(name) for name in _header_paths(line))
        for key in ("rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(key):
                names.append(_git_path(line[len(key) :]))
    return list(dict.fromkeys(names))


def _strip(name: str) -> str:
    return name[2:] if name[:2] in ("a/", "b/") else name


def _special_modes(patched: object) -> set[str]:
    """File modes a patch's header lines name: ``old/new/deleted file mode`` and the index line's mode."""
    modes = set()
    for line in str(patched.patch_info).splitlines():  # type: ignore[attr-defined]
        words = line.split()
        if line.startswith(("old mode ", "new mode ", "new file mode ", "deleted file mode ")):
            modes.add(words[-1])
        elif line.startswith("index ") and len(words) == 3:
            modes.add(words[2])  # "index A..B 120000": the mode is unchanged, a symlink's target is
    return modes


def problems(patch: Patch, tree: Path | None = None) -> list[str]:
    """Every reason to refuse the patch's paths; empty when it is safe to apply.

    The paths vetted are every path git will read or write (``written_paths``), not unidiff's view
    alone: a ``rename to`` that names another path than the ``+++`` line is vetted too.
    """
    found: list[str] = []
    for patched in patch.diff:
        names = written_paths(patched)
        for name in names:
            problem = _path_problem(name)
            if problem:
                found.append(problem)
            elif tree is not None and _leaves_tree(tree, name):
                found.append(f"{name!r} leads outside the tree through a symlink")
            elif tree is not None and (link := _symlink_on_the_way(tree, name)):
                found.append(f"{name}: lies beyond {link}, a symlink in the tree; the patch would change another path")
            elif tree is not None and (tree / name).is_symlink():
                found.append(f"{name}: is a symlink in the tree; the patch would change or replace it")
        expected = {_strip(_git_path(raw)) for raw in (patched.source_file, patched.target_file) if raw}
        expected.discard("/dev/null")
        other = [name for name in names if name not in expected]
        if other and expected:
            found.append(
                f"{patched.path}: its header names {', '.join(repr(n) for n in other)}, "
                f"not the {', '.join(repr(n) for n in sorted(expected))} its ---/+++ lines name"
            )
        modes = _special_modes(patched)
        for mode, what in ((SYMLINK_MODE, "a symlink"), (GITLINK_MODE, "a submodule")):
            if mode in modes:
                found.append(f"{patched.path}: creates or changes {what}")
        info = str(patched.patch_info)
        if patched.is_binary_file or "GIT binary patch" in info:
            found.append(f"{patched.path}: binary content")
    return sorted(set(found))
