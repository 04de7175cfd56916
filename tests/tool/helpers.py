"""Shared helpers of the tool tests: a tiny upstream tree, git with a fixed identity, patch text.

Imported by the tests and by conftest.py's fixtures; nothing here imports vLLM.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

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


PatchMaker = Callable[..., Path]


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))
