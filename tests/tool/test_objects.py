# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The store's imported upstream is proven, every run, to be the verified sdist's content."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import zlib
from pathlib import Path

import git
import pytest

from tests.tool.helpers import REPO_ROOT, write_upstream
from vllm_overlay import lock, upstream_trees
from vllm_overlay.store import Store

VERSION = "9.9.9"


def _cached_release(tmp_path: Path) -> None:
    """An sdist of a tiny upstream in the cache's downloads, with its recorded sha256 (no index needed)."""
    tree = write_upstream(tmp_path / "src" / f"vllm-{VERSION}", extra={"vllm/other.py": "other = 1\n"})
    downloads = Store().downloads
    downloads.mkdir(parents=True)
    archive = downloads / f"vllm-{VERSION}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=f"vllm-{VERSION}")
    (downloads / f"{archive.name}.sha256").write_text(hashlib.sha256(archive.read_bytes()).hexdigest() + "\n")


def _obtain() -> upstream_trees.Upstream:
    return upstream_trees.obtain(VERSION, lock.load(REPO_ROOT / "upstream.lock"), Store())


def _rewrite_loose(oid: str, content: bytes) -> Path:
    """Rewrite the loose object file ``oid`` with other content under the same name."""
    path = Store().upstreams_git / "objects" / oid[:2] / oid[2:]
    path.parent.mkdir(exist_ok=True)
    if path.exists():
        path.chmod(0o644)
        path.unlink()
    path.write_bytes(zlib.compress(b"blob %d\0" % len(content) + content))
    return path


def _blob(upstream: upstream_trees.Upstream, rel: str) -> str:
    return git.Repo(Store().upstreams_git).git.rev_parse(f"{upstream.commit}:{rel}")


def test_a_rewritten_blob_is_detected_on_the_next_run(tmp_path, store_env):
    _cached_release(tmp_path)
    first = _obtain()
    oid = _blob(first, "vllm/core.py")
    _rewrite_loose(oid, b"import os; os.system('injected')\n")
    with pytest.raises(upstream_trees.SourceError, match=rf"{oid} \(vllm/core\.py\) holds other content"):
        _obtain()
    with pytest.raises(upstream_trees.SourceError, match="is not what was imported"):
        _obtain()  # and on every run after it, not only once


def test_a_pack_holding_another_object_of_the_same_name_is_detected(tmp_path, store_env):
    """git reads a packed object before a loose one: a planted pack is as good as a rewrite."""
    _cached_release(tmp_path)
    first = _obtain()
    oid = _blob(first, "vllm/other.py")
    objects_dir = Store().upstreams_git / "objects"
    original = (objects_dir / oid[:2] / oid[2:]).read_bytes()
    _rewrite_loose(oid, b"other = 'injected'\n")
    subprocess.run(
        ["git", "--git-dir", str(Store().upstreams_git), "pack-objects", "-q", str(objects_dir / "pack" / "pack")],
        input=(oid + "\n").encode(),
        check=True,
        capture_output=True,
    )
    (objects_dir / oid[:2] / oid[2:]).unlink()
    (objects_dir / oid[:2] / oid[2:]).write_bytes(original)  # the loose file is intact again
    with pytest.raises(upstream_trees.SourceError, match=rf"{oid} \(vllm/other\.py\) holds other content"):
        _obtain()


def test_an_object_planted_before_the_import_is_overwritten(tmp_path, store_env):
    """git add skips an object it already holds: the import writes every object anew."""
    _cached_release(tmp_path)
    content = (tmp_path / "src" / f"vllm-{VERSION}" / "vllm" / "core.py").read_bytes()
    oid = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    git.Repo.init(Store().upstreams_git, bare=True)
    _rewrite_loose(oid, b"injected = True\n")
    upstream = _obtain()
    shown = subprocess.run(
        ["git", "--git-dir", str(Store().upstreams_git), "cat-file", "blob", f"{upstream.commit}:vllm/core.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert shown == content


def test_a_changed_object_file_is_hashed_again_then_the_record_renewed(tmp_path, store_env):
    """A benign change of the object files (a copied cache: new inodes) costs one rehash, then the
    cheap check holds again; the record is renewed."""
    _cached_release(tmp_path)
    first = _obtain()
    objects_dir = Store().upstreams_git / "objects"
    for path in list(objects_dir.glob("??/*")):
        data = path.read_bytes()
        path.chmod(0o644)
        path.unlink()
        path.write_bytes(data)  # same content, a new inode and ctime
    marker = Store().downloads / f"vllm-{VERSION}.tar.gz.imported"
    before = marker.read_text()
    assert _obtain().commit == first.commit
    renewed = marker.read_text()
    assert renewed != before
    assert _obtain().commit == first.commit
    assert marker.read_text() == renewed  # the cheap check holds: nothing hashed, nothing rewritten


def test_clones_of_the_store_cost_no_rehash(tmp_path, store_env):
    """Every checkout hard-links the store's object files (and removing it unlinks them): that moves
    their ctime, never their content, so it must not make the next run hash every object again."""
    _cached_release(tmp_path)
    first = _obtain()
    marker = Store().downloads / f"vllm-{VERSION}.tar.gz.imported"
    before = marker.read_text()
    clone = tmp_path / "clone"
    upstream_trees.checkout(Store(), first, clone)
    assert _obtain().commit == first.commit
    shutil.rmtree(clone)
    assert _obtain().commit == first.commit
    assert marker.read_text() == before  # nothing hashed again, nothing renewed


def test_a_tag_moved_to_another_commit_is_refused(tmp_path, store_env):
    _cached_release(tmp_path)
    first = _obtain()
    repo = git.Repo(Store().upstreams_git)
    other = repo.git.commit_tree(f"{first.commit}^{{tree}}", "-m", "other")
    repo.git.tag("--force", first.tag, other)
    # the moved tag is not the import: it is imported again from the verified sdist
    again = _obtain()
    assert again.commit == first.commit
