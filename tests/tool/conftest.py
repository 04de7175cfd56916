"""Fixtures for the tool tests: a tiny upstream tree, a project around it, and patch makers.

Nothing here imports vLLM: the tool's behaviour does not depend on what the files contain, so a
small synthetic upstream (a ``vllm/`` package of a few files) exercises every code path quickly.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_AUTHOR_DATE": "2026-11-29T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-11-29T00:00:00+0000",
}
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
TRAILERS = """Description: {subject}
Origin: vendor
Forwarded: no (reason: a test patch; drop when: the test ends)
Last-Update: 2026-11-29
Series: {series}
Tests: tests/patches/{series}/test_demo.py
Upstream-Tests: tests/test_demo_upstream.py
Targets: vllm.core:value
"""
FORWARDED = next(line for line in TRAILERS.splitlines() if line.startswith("Forwarded:"))


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


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(cache))
    return cache


@pytest.fixture
def upstream_dir(tmp_path: Path) -> Path:
    return write_upstream(tmp_path / "upstream-a")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project checkout: upstream.lock, an empty series, and the test files patches name."""
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "upstream.lock", root / "upstream.lock")
    (root / "patches" / "series").write_text("")
    return root


PatchMaker = Callable[..., Path]


@pytest.fixture
def make_patch(tmp_path: Path, project: Path) -> PatchMaker:
    """make_patch(upstream, edit, subject, series) -> path of a new patch added to the project.

    ``edit`` changes a git clone of ``upstream`` (a function of the clone's root); earlier patches
    made by this fixture are applied first, so patches stack like a real series.
    """
    work = tmp_path / "patchwork"
    made: list[Path] = []

    def make(upstream: Path, edit: Callable[[Path], None], subject: str, series: str = "demo") -> Path:
        if not work.exists():
            shutil.copytree(upstream, work)
            git(work, "init", "-q", "-b", "main")
            git(work, "add", "-A")
            git(work, "commit", "-qm", "upstream")
        edit(work)
        git(work, "add", "-A")
        git(work, "commit", "-qm", f"{subject}\n\n" + BODY + TRAILERS.format(subject=subject, series=series))
        text = git(work, "format-patch", "--zero-commit", "--no-signature", "--full-index", "-1", "--stdout")
        name = f"{series}/{re.sub(r'[^a-z0-9]+', '-', subject.lower()).strip('-')}.patch"
        path = project / "patches" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        test_file = project / "tests" / "patches" / series / "test_demo.py"
        test_file.parent.mkdir(parents=True, exist_ok=True)
        test_file.write_text(SPDX_HEADER + "def test_placeholder():\n    assert True\n")
        with open(project / "patches" / "series", "a") as handle:
            handle.write(name + "\n")
        made.append(path)
        return path

    return make


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))
