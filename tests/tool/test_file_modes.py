"""Files the tool creates follow the umask, and a killed download's partial file is removed."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from tests.tool.test_apply import change_line_20, run_apply
from vllm_overlay import sources


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


def test_download_follows_the_umask_and_removes_partial_files(tmp_path, umask_022):
    served = tmp_path / "served.tar.gz"
    served.write_bytes(b"an sdist")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    # What a download killed half-way leaves behind.
    leftover = downloads / ".vllm-9.9.9.tar.gz.abcd1234.part"
    leftover.write_bytes(b"an s")
    dest = downloads / "vllm-9.9.9.tar.gz"
    sources.download(served.as_uri(), dest, hashlib.sha256(b"an sdist").hexdigest())
    assert dest.read_bytes() == b"an sdist"
    assert mode(dest) == 0o644
    assert sorted(p.name for p in downloads.iterdir()) == ["vllm-9.9.9.tar.gz"]
