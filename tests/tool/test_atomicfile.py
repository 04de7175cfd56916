"""Files the tool creates follow the umask, and a killed download's partial file is removed."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import change_line_20
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_json_report_follows_the_umask(project, make_patch, upstream_dir, store_env, umask_022):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    code, _ = run_apply(project, upstream_dir)
    assert code == 0
    assert mode(project / "report.json") == 0o644


def test_download_follows_the_umask(tmp_path, umask_022):
    served = tmp_path / "served.tar.gz"
    served.write_bytes(b"an sdist")
    dest = tmp_path / "downloads" / "vllm-9.9.9.tar.gz"
    upstream_trees.download(served.as_uri(), dest, hashlib.sha256(b"an sdist").hexdigest())
    assert dest.read_bytes() == b"an sdist"
    assert mode(dest) == 0o644
    assert sorted(p.name for p in dest.parent.iterdir()) == ["vllm-9.9.9.tar.gz"]


def test_next_run_removes_a_killed_download_and_import(project, upstream_dir, store_env):
    store = Store()
    store.downloads.mkdir(parents=True)
    leftover = store.downloads / ".vllm-0.33.0.tar.gz.abcd1234.part"  # what a kill mid-download leaves
    leftover.write_bytes(b"half an sdist")
    unpacking = store.root / ".unpack-abcd1234" / "vllm-0.33.0"  # what a kill mid-import leaves
    unpacking.mkdir(parents=True)
    upstream_trees.obtain(str(upstream_dir), lock.load(project / "upstream.lock"), store)
    assert not leftover.exists() and not unpacking.parent.exists()


def test_lock_and_junit_report_follow_the_umask(tmp_path, umask_022):
    """upstream.lock (bump rewrites it) and the JUnit report are read by others: not 0600."""
    from tests.tool.helpers.repos import REPO_ROOT
    from vllm_overlay import junit

    path = tmp_path / "upstream.lock"
    lock.write(lock.load(REPO_ROOT / "upstream.lock"), path)
    assert mode(path) == 0o644 and lock.load(path).version
    report = tmp_path / "reports" / "test-patches.xml"
    junit.write_report([], report)
    assert mode(report) == 0o644 and report.read_bytes().startswith(b"<?xml")
    assert sorted(p.name for p in report.parent.iterdir()) == ["test-patches.xml"]
