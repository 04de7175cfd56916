"""What a patch may touch: only regular text files inside the upstream tree it targets."""

from __future__ import annotations

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
    if path.parts[:1] == (".git",) or ".git" in path.parts:
        return f"path inside .git {name!r}"
    return None


def _leaves_tree(tree: Path, name: str) -> bool:
    """True if ``name`` resolves (through any symlink in the tree) outside ``tree``."""
    root = tree.resolve()
    resolved = (tree / name).resolve()
    return os.path.commonpath([root, resolved]) != str(root)


def problems(patch: Patch, tree: Path | None = None) -> list[str]:
    """Every reason to refuse the patch's paths; empty when it is safe to apply."""
    found: list[str] = []
    for patched in patch.diff:
        for raw in (patched.source_file, patched.target_file):
            if raw == "/dev/null" or raw is None:
                continue
            name = raw[2:] if raw[:2] in ("a/", "b/") else raw
            problem = _path_problem(name)
            if problem:
                found.append(problem)
            elif tree is not None and _leaves_tree(tree, name):
                found.append(f"{name!r} leads outside the tree through a symlink")
        info = str(patched.patch_info)
        for mode, what in ((SYMLINK_MODE, "a symlink"), (GITLINK_MODE, "a submodule")):
            if f"mode {mode}" in info:
                found.append(f"{patched.path}: creates or changes {what}")
        if patched.is_binary_file or "GIT binary patch" in info:
            found.append(f"{patched.path}: binary content")
    return sorted(set(found))
