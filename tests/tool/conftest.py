"""Fixtures for the tool tests: a tiny upstream tree, a project around it, and patch makers.

Nothing here imports vLLM: the tool's behaviour does not depend on what the files contain, so a
small synthetic upstream (a ``vllm/`` package of a few files) exercises every code path quickly.
The plain helpers the fixtures use live in helpers/ (one module per fixture family), which tests import directly.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.installs import fake_wheel_record
from tests.tool.helpers.repos import (
    BODY,
    MAINTAINERS_TOML,
    REPO_ROOT,
    SPDX_HEADER,
    TRAILERS,
    PatchMaker,
    change_line_20,
    git,
    write_upstream,
)
from vllm_overlay.env import wheel_record
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock


@pytest.fixture(autouse=True)
def store_env(tmp_path: Path) -> Iterator[Path]:
    """The tool's cache of this test: every test gets its own, so none writes into the developer's
    (an upstream imported from a test's directory stayed there for good, and every later clone
    of the cache linked it). Set by a MonkeyPatch of its own: a test's ``monkeypatch.undo()``
    undoes the test's changes, not this one; a test may still point the variable elsewhere."""
    cache = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as own:
        own.setenv("VLLM_OVERLAY_CACHE", str(cache))
        yield cache


@pytest.fixture(autouse=True)
def no_wheel_download(monkeypatch: pytest.MonkeyPatch) -> None:
    """upstream.lock's wheels stand in for the 340 MB download: when the cache holds no RECORD of one,
    its RECORD is the fake install's (helpers.make_site). Any other wheel, or one a test put in the
    cache (helpers.seed_wheel_record), goes the real way: cache, download, sha256 check."""
    real = wheel_record.fetched
    locked = {(a.filename, a.sha256) for a in lock.load(REPO_ROOT / "upstream.lock").wheels.values()}

    def fetched(store: Store, project: str, version: str, filename: str, sha256: str) -> wheel_record.WheelRecord:
        cached = store.downloads / (filename + wheel_record.SUFFIX)
        if (filename, sha256) in locked and not cached.exists():
            return wheel_record.WheelRecord(filename, sha256, fake_wheel_record())
        return real(store, project, version, filename, sha256)

    monkeypatch.setattr(wheel_record, "fetched", fetched)


@pytest.fixture
def upstream_dir(tmp_path: Path) -> Path:
    return write_upstream(tmp_path / "upstream-a")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project checkout: upstream.lock, maintainers.toml, an empty series, and the test files patches name."""
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "upstream.lock", root / "upstream.lock")
    (root / "maintainers.toml").write_text(MAINTAINERS_TOML)
    (root / "patches" / "series").write_text("")
    return root


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


@pytest.fixture
def built(project, make_patch, upstream_dir, store_env):
    """A project whose build/patched holds the applied one-patch series (apply-patches' tests)."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    return project
