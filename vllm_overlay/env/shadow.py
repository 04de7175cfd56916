"""Lay patched files over an installed vllm package without modifying the installation.

The shared test environment must never be edited in place: a crash or Ctrl-C mid-run would leave
it corrupted for every later run. Instead a *shadow package* is built: a fresh directory that resolves
to the installed package through symlinks, except the files a patch step replaced, which are real
copies taken from the patched tree. Putting the shadow's parent first on PYTHONPATH makes
``import vllm`` resolve to it. The replaced file set is exactly the set the image's layers copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "vllm"


def installed_package_dir(python: str | os.PathLike[str]) -> Path:
    """Return the installed vllm package directory of an interpreter, without importing vllm."""
    code = (
        "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); "
        "print(s.submodule_search_locations[0] if s else '')"
    )
    out = subprocess.run(
        [os.fspath(python), "-c", code, PACKAGE], check=True, capture_output=True, text=True
    ).stdout.strip()
    if not out:
        raise FileNotFoundError(f"{python} has no installed '{PACKAGE}' package")
    return Path(out)


def _pyc_source(name: str) -> str:
    return name.split(".", 1)[0] + ".py"


def build_shadow(installed: Path, replacements: dict[str, Path], deleted: Iterable[str], dest: Path) -> Path:
    """Build ``dest/vllm``: the installed package with ``replacements`` copied in, ``deleted`` absent.

    ``replacements`` maps a path relative to the package parent (``vllm/x/y.py``) to the file that
    replaces it (a patch may add files too). Returns ``dest``, the directory to put on PYTHONPATH.

    Only the directories on the way to a replaced or deleted file are real; every other entry
    (file or whole directory) is one symlink to the installed one, instead of one symlink per
    file (~9,000 for vLLM): milliseconds instead of seconds. In real directories ``__pycache__``
    holds symlinks to the installed bytecode of the untouched modules, so imports do not
    recompile; callers set PYTHONDONTWRITEBYTECODE, so nothing is ever written through a symlink
    into the installation.
    """
    package = PACKAGE
    root = dest / package
    if root.exists() or root.is_symlink():
        shutil.rmtree(root) if not root.is_symlink() else root.unlink()
    deleted = list(deleted)
    changed = {*replacements, *deleted}
    for rel in changed:
        parts = Path(rel).parts
        if not parts or parts[0] != package or ".." in parts:
            raise ValueError(f"path outside the {package} package: {rel}")
    real_dirs = {Path(package)}
    for rel in changed:
        for parent in Path(rel).parents:
            if parent != Path("."):
                real_dirs.add(parent)
    for directory in sorted(real_dirs, key=lambda p: len(p.parts)):
        target = dest / directory
        target.mkdir(parents=True, exist_ok=True)
        source = installed / Path(*directory.parts[1:]) if directory.parts[1:] else installed
        if not source.is_dir():
            continue
        for entry in sorted(os.listdir(source)):
            child = directory / entry
            if entry == "__pycache__" or child in real_dirs or child.as_posix() in changed:
                continue
            if entry.endswith(".pyc"):
                continue
            (target / entry).symlink_to(source / entry)
        cache = source / "__pycache__"
        if cache.is_dir():
            for name in sorted(os.listdir(cache)):
                if name.endswith(".pyc") and (directory / _pyc_source(name)).as_posix() not in changed:
                    (target / "__pycache__").mkdir(exist_ok=True)
                    (target / "__pycache__" / name).symlink_to(cache / name)
    for rel, source in sorted(replacements.items()):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return dest


def replacements_from_tree(tree: Path, changed: Iterable[str]) -> dict[str, Path]:
    """Map the changed package files of a patched tree to their paths in that tree."""
    result: dict[str, Path] = {}
    for rel in changed:
        if Path(rel).parts[:1] == (PACKAGE,):
            source = tree / rel
            if source.is_file():
                result[rel] = source
    return result


def pythonpath_with(shadow_parent: Path, existing: str | None) -> str:
    """PYTHONPATH that puts the shadow package first."""
    return os.pathsep.join([os.fspath(shadow_parent), *([existing] if existing else [])])
