"""Lay patched files over an installed vllm package without modifying the installation.

The shared test environment must never be edited in place: a crash or Ctrl-C mid-run would leave
it corrupted for every later run. Instead a *shadow package* is built: a fresh directory holding a
symlink to every file of the installed package, except the files a patch step replaced, which are
real copies taken from the patched tree. Putting the shadow's parent first on PYTHONPATH makes
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


def build_shadow(installed: Path, replacements: dict[str, Path], dest: Path) -> Path:
    """Build ``dest/vllm``: symlinks to ``installed`` plus real copies of ``replacements``.

    ``replacements`` maps a path relative to the package parent (``vllm/x/y.py``) to the file that
    replaces it. A replacement for a file the installation lacks is added (a patch may add files).
    Returns ``dest`` (the directory to put on PYTHONPATH).
    """
    root = dest / PACKAGE
    if root.exists():
        shutil.rmtree(root)
    for dirpath, dirnames, filenames in os.walk(installed):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = Path(dirpath).relative_to(installed)
        target_dir = root / rel
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            (target_dir / name).symlink_to(Path(dirpath) / name)
    for rel_path, source in sorted(replacements.items()):
        parts = Path(rel_path).parts
        if not parts or parts[0] != PACKAGE or ".." in parts:
            raise ValueError(f"replacement outside the {PACKAGE} package: {rel_path}")
        target = dest / rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
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
