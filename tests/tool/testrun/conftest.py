"""Fixtures of the per-patch runner tests: a project of fake patches over a fake installed vllm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tool.helpers.installs import seed_wheel_record
from tests.tool.helpers.patch_tests import UPSTREAM_TEST, fake_env
from tests.tool.helpers.repos import PatchMaker, write_upstream
from vllm_overlay.env import testenv
from vllm_overlay.upstream import lock


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
    # The fake vllm stands for the locked wheel's install: its RECORD, as written, is the wheel's.
    wheel = next(env.glob("lib/python*/site-packages/vllm-*.dist-info/RECORD")).read_text()
    (env / "wheel-RECORD").write_text(wheel)
    seed_wheel_record(store_env, lock.load(project / "upstream.lock"), wheel)
    return {"upstream": upstream, "env": env, "project": project, "make_patch": make_patch}
