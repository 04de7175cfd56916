"""Fixtures of the per-patch runner tests: a project of fake patches over a fake installed vllm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tool.helpers import UPSTREAM_TEST, PatchMaker, fake_env, write_upstream
from vllm_overlay import testenv


@pytest.fixture
def fake_project(tmp_path: Path, store_env: Path, project: Path, make_patch: PatchMaker, monkeypatch) -> dict:
    pytest.importorskip("pytest_timeout")
    monkeypatch.setattr(testenv, "REQUIRED_MODULES", ("pytest", "pytest_timeout"))
    upstream = write_upstream(
        tmp_path / "upstream",
        extra={"tests/__init__.py": "", "tests/test_core_upstream.py": UPSTREAM_TEST, "pyproject.toml": ""},
    )
    version = json.loads(json.dumps(__import__("tomllib").loads((project / "upstream.lock").read_text())))
    env = fake_env(tmp_path / "venv", upstream, version["upstream"]["version"])
    return {"upstream": upstream, "env": env, "project": project, "make_patch": make_patch}
