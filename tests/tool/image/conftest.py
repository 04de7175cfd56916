"""Fixtures of the image tests: a project holding the Dockerfile and overlay, at the locked upstream version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.tool.helpers.installs import LOCKED
from tests.tool.helpers.repos import REPO_ROOT, write_upstream


@pytest.fixture
def upstream_dir(tmp_path: Path) -> Path:  # the locked version, so staging accepts it
    return write_upstream(tmp_path / "upstream-a", extra={"vllm/_version.py": LOCKED})


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def store_env(_module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One store for this module: apply-patches imports the locked sdist once, not per test."""
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(_module_cache))
    return _module_cache


@pytest.fixture
def image_project(project: Path) -> Path:
    shutil.copy(REPO_ROOT / "Dockerfile", project / "Dockerfile")
    shutil.copytree(REPO_ROOT / "overlay", project / "overlay", ignore=shutil.ignore_patterns("__pycache__"))
    return project
