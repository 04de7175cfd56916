"""A tiny upstream tree, git with a fixed identity, patch text and series made of it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_AUTHOR_DATE": "2026-11-29T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-11-29T00:00:00+0000",
}

# The maintainer of every series of a test project (its maintainers.toml), who authors and signs off
# every patch made there: the identity above.
MAINTAINER = f"{IDENTITY['GIT_AUTHOR_NAME']} <{IDENTITY['GIT_AUTHOR_EMAIL']}>"
MAINTAINERS_TOML = f'default = "{MAINTAINER}"\n'

# vLLM's two SPDX lines, which every file under tests/patches/ carries (lint-patches checks them).
SPDX_HEADER = (
    "# SPDX-License-Identifier: Apache-2.0\n# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)

# The message body lint-patches asks for: five headings, each with its text.
BODY = """Why

Why and how.

How

The change.

Configurations covered

Every configuration.

Tests

The demo test.

Upstream status

Not forwarded.

"""

# The trailers of a patch made in a test project (format them with its subject and series): the last
# one is its maintainer's sign-off.
TRAILERS = f"""Description: {{subject}}
Origin: vendor
Forwarded: no (reason: a test patch; drop when: the test ends)
Last-Update: 2026-11-29
Series: {{series}}
Tests: tests/patches/{{series}}/test_demo.py
Upstream-Tests: tests/test_demo_upstream.py
Targets: vllm.core:value
Signed-off-by: {MAINTAINER}
"""

FORWARDED = next(line for line in TRAILERS.splitlines() if line.startswith("Forwarded:"))

UPSTREAM_FILES = {
    "vllm/__init__.py": b"",
    "vllm/core.py": b"value = 1\n",
    "vllm/utils/math.py": b"def cdiv(a, b):\n    return -(-a // b)\n",
}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    import os

    full_env = dict(os.environ, **IDENTITY, **(env or {}))
    return subprocess.run(["git", *args], cwd=cwd, env=full_env, check=True, capture_output=True, text=True).stdout


def write_upstream(root: Path, lines: int = 40, extra: dict[str, str] | None = None) -> Path:
    """A minimal vLLM-shaped tree: vllm/core.py with numbered lines, vllm/_version.py."""
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(
        "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = 'gdeadbeef'\n"
    )
    (root / "vllm" / "core.py").write_text("".join(f"line_{i} = {i}\n" for i in range(1, lines + 1)))
    for name, text in (extra or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PatchMaker = Callable[..., Path]


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def retarget(path, target):
    path.write_text(path.read_text().replace("Targets: vllm.core:value", f"Targets: {target}"))


def change_line_20(tree: Path) -> None:
    replace_line(tree / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 200\n")


def snapshot(patches_dir):
    return {
        p.relative_to(patches_dir).as_posix(): p.read_bytes() for p in sorted(patches_dir.rglob("*")) if p.is_file()
    }


def users_files(directory: Path) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notes.txt").write_text("the user's notes\n")
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "data.bin").write_bytes(b"\0\1\2")
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def symlinked_upstream(tmp_path: Path, make_patch: PatchMaker) -> tuple[Path, Path]:
    """A patch of vllm/plugins/hook.py made where vllm/plugins is a directory (the base), and an
    upstream where vllm/plugins is a symlink to vllm/real (where it is applied): (base, upstream)."""
    base = write_upstream(tmp_path / "base", extra={"vllm/plugins/hook.py": "hook = 1\n", "vllm/real/hook.py": "x\n"})
    make_patch(base, lambda t: replace_line(t / "vllm" / "plugins" / "hook.py", "hook = 1\n", "hook = 2\n"), "hook")
    linked = write_upstream(tmp_path / "linked", extra={"vllm/real/hook.py": "hook = 1\n"})
    os.symlink("real", linked / "vllm" / "plugins")
    return base, linked


def tree_files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def add_module_and_doc(tree: Path) -> None:
    (tree / "vllm" / "added.py").write_text("ADDED = 1\n")
    (tree / "docs.md").write_text("x\n")


def two_series(make_patch, upstream_dir):
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1", "alpha"
    )
    make_patch(upstream_dir, add_module_and_doc, "a2", "alpha")
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_9 = 9\n", "line_9 = 90\n"), "b1", "beta"
    )


def change_core_line(line: int, to: int) -> Callable[[Path], None]:
    """An edit of an upstream tree (``write_upstream``): vllm/core.py's line ``line`` set to ``to``."""
    return lambda tree: replace_line(tree / "vllm" / "core.py", f"line_{line} = {line}\n", f"line_{line} = {to}\n")


def stacked_patches(make_patch, upstream: Path, count: int = 3) -> list[Path]:
    """``count`` stacked patches: patch i sets line 5(i+1) to 100+i."""
    return [
        make_patch(upstream, change_core_line(5 * (i + 1), 100 + i), f"core: change line {5 * (i + 1)}")
        for i in range(count)
    ]


def reword(patch: Path, words: str) -> None:
    """Add ``words`` to the patch's message (its diff unchanged)."""
    patch.write_bytes(patch.read_bytes().replace(b"\n---\n", f"\n{words}\n---\n".encode(), 1))


def rewrite_keeping_stat(path: Path, text: str) -> None:
    """Rewrite ``path`` in place with text of the same size and put its mtime back (a sloppy editor)."""
    info = path.stat()
    assert len(text) == info.st_size
    with open(path, "r+") as handle:
        handle.write(text)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
