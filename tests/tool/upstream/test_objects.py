# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The store's imported upstream is proven, every run, to be the verified sdist's content."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import zlib
from pathlib import Path

import git
import pytest

from tests.tool.helpers.repos import REPO_ROOT, write_upstream
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock, objects
from vllm_overlay.upstream import trees as upstream_trees

VERSION = "9.9.9"
PLANTED = r"the pack pack-\w+\.pack holds objects other than their names"


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


def _write_loose(objects_dir: Path, oid: str, content: bytes) -> Path:
    """Write ``content`` as the loose object file named ``oid`` in ``objects_dir`` (git never checks the name)."""
    path = objects_dir / oid[:2] / oid[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(0o644)
        path.unlink()
    path.write_bytes(zlib.compress(b"blob %d\0" % len(content) + content))
    return path


def _pack(objects_dir: Path, oids: list[str]) -> tuple[Path, Path]:
    """Pack the loose objects ``oids`` of ``objects_dir`` (and nothing else); return the pack and its index."""
    (objects_dir / "pack").mkdir(exist_ok=True)
    name = (
        subprocess.run(
            ["git", "--git-dir", str(Store().upstreams_git), "pack-objects", "-q", str(objects_dir / "pack" / "pack")],
            input="".join(f"{oid}\n" for oid in oids).encode(),
            env=dict(os.environ, GIT_OBJECT_DIRECTORY=str(objects_dir)),
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )
    return objects_dir / "pack" / f"pack-{name}.pack", objects_dir / "pack" / f"pack-{name}.idx"


def _import_pack() -> tuple[Path, Path]:
    (pack,) = (Store().upstreams_git / "objects" / "pack").glob("*.pack")
    return pack, pack.with_suffix(".idx")


def _rewrite_in_pack(tmp_path: Path, oid: str, content: bytes) -> None:
    """Rewrite the import's pack in place (same file names) with ``content`` under the object name ``oid``."""
    pack, idx = _import_pack()
    loose = tmp_path / "unpacked"
    loose.mkdir()
    subprocess.run(
        ["git", "--git-dir", str(Store().upstreams_git), "unpack-objects", "-q"],
        stdin=pack.open("rb"),
        env=dict(os.environ, GIT_OBJECT_DIRECTORY=str(loose)),
        check=True,
        capture_output=True,
    )
    oids = [sub.name + item.name for sub in loose.glob("??") for item in sub.iterdir()]
    assert oid in oids
    _write_loose(loose, oid, content)
    forged_pack, forged_idx = _pack(loose, oids)
    for forged, original in ((forged_pack, pack), (forged_idx, idx)):
        original.chmod(0o644)
        os.replace(forged, original)


def _blob(upstream: upstream_trees.Upstream, rel: str) -> str:
    return git.Repo(Store().upstreams_git).git.rev_parse(f"{upstream.commit}:{rel}")


def test_an_import_is_one_pack_and_leaves_no_loose_object(tmp_path, store_env):
    """A clone of the store links a few packs, not one file per object."""
    _cached_release(tmp_path)
    upstream = _obtain()
    objects_dir = Store().upstreams_git / "objects"
    assert not list(objects_dir.glob("??/*"))
    pack, idx = _import_pack()
    assert pack.is_file() and idx.is_file()
    assert _blob(upstream, "vllm/core.py") in objects.packed_objects(Store().upstreams_git)


def test_loose_copies_of_packed_objects_are_removed_at_an_import(tmp_path, store_env):
    """A cache of the loose-object format: its objects are never read again once packed, and a clone
    would still link every one of them."""
    _cached_release(tmp_path)
    content = (tmp_path / "src" / f"vllm-{VERSION}" / "vllm" / "core.py").read_bytes()
    oid = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    git.Repo.init(Store().upstreams_git, bare=True)
    loose = _write_loose(Store().upstreams_git / "objects", oid, content)
    unrelated = _write_loose(Store().upstreams_git / "objects", "0" * 40, b"")  # not in any pack: kept
    _obtain()
    assert not loose.exists()
    assert unrelated.exists()


def test_a_rewritten_blob_is_detected_on_the_next_run(tmp_path, store_env):
    _cached_release(tmp_path)
    first = _obtain()
    oid = _blob(first, "vllm/core.py")
    _rewrite_in_pack(tmp_path, oid, b"import os; os.system('injected')\n")
    with pytest.raises(upstream_trees.SourceError, match=rf"{oid} \(vllm/core\.py\) holds other content"):
        _obtain()
    with pytest.raises(upstream_trees.SourceError, match="is not what was imported"):
        _obtain()  # and on every run after it, not only once


def _plant_pack(tmp_path: Path, oid: str, content: bytes) -> None:
    """Add a pack to the store holding ``content`` under the object name ``oid`` (and nothing else)."""
    planted = tmp_path / "planted"
    _write_loose(planted, oid, content)
    pack_dir = Store().upstreams_git / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    for path in _pack(planted, [oid]):
        shutil.move(path, pack_dir / path.name)


def test_a_pack_holding_another_object_of_the_same_name_is_detected(tmp_path, store_env):
    """Which of two packs naming an object a git process reads depends on that process's earlier
    reads: a planted pack is refused whether or not the check happened to read its copy."""
    _cached_release(tmp_path)
    first = _obtain()
    oid = _blob(first, "vllm/other.py")
    _plant_pack(tmp_path, oid, b"other = 'injected'\n")
    with pytest.raises(upstream_trees.SourceError, match=PLANTED):
        _obtain()


def test_a_pack_planted_before_the_import_is_refused_at_the_import(tmp_path, store_env):
    """git skips writing an object it already holds: a pack naming one of the release's objects
    before the import is proven there."""
    _cached_release(tmp_path)
    content = (tmp_path / "src" / f"vllm-{VERSION}" / "vllm" / "core.py").read_bytes()
    oid = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    git.Repo.init(Store().upstreams_git, bare=True)
    _plant_pack(tmp_path, oid, b"injected = True\n")
    with pytest.raises(upstream_trees.SourceError, match=PLANTED):
        _obtain()


def test_a_loose_object_planted_before_the_import_is_never_read(tmp_path, store_env):
    """git add skips an object it already holds: the import writes every object anew, into its pack."""
    _cached_release(tmp_path)
    content = (tmp_path / "src" / f"vllm-{VERSION}" / "vllm" / "core.py").read_bytes()
    oid = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    git.Repo.init(Store().upstreams_git, bare=True)
    _write_loose(Store().upstreams_git / "objects", oid, b"injected = True\n")
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
    for path in _import_pack():
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


def test_a_pack_git_freshened_costs_no_rehash(tmp_path, store_env):
    """git moves a pack's mtime whenever it would write an object the pack holds (in the cache, or in
    any clone through the hard link): that says nothing of its content and must not make the next
    run hash every object again."""
    _cached_release(tmp_path)
    first = _obtain()
    marker = Store().downloads / f"vllm-{VERSION}.tar.gz.imported"
    before = marker.read_text()
    content = (tmp_path / "src" / f"vllm-{VERSION}" / "vllm" / "core.py").read_bytes()
    subprocess.run(  # writes an object the pack holds: git freshens the pack instead
        ["git", "--git-dir", str(Store().upstreams_git), "hash-object", "-w", "--stdin"],
        input=content,
        check=True,
        capture_output=True,
    )
    pack, _idx = _import_pack()
    moved = pack.stat().st_mtime_ns
    assert not list((Store().upstreams_git / "objects").glob("??/*"))  # no loose copy: the pack was freshened
    os.utime(pack, ns=(moved + 10**9, moved + 10**9))  # and again, a second later
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


def test_the_fingerprint_sees_each_listed_loose_object_file_and_no_other(tmp_path):
    """The fingerprint lists the fan-out directories instead of looking each object up: a loose file
    of a listed object that appears, is rewritten (new inode or mtime) or goes away still changes
    it, in a directory that held none before too; a loose file of an object not listed does not."""
    repo = tmp_path / "repo.git"
    (repo / "objects" / "pack").mkdir(parents=True)
    listed = ["ab" + "1" * 38, "ab" + "2" * 38, "cd" + "3" * 38]
    empty = objects.fingerprint(repo, listed)
    assert objects.fingerprint(repo, listed) == empty

    unlisted = _write_loose(repo / "objects", "ab" + "9" * 38, b"not listed\n")
    assert objects.fingerprint(repo, listed) == empty  # the same directory, another object

    first = _write_loose(repo / "objects", listed[2], b"listed\n")  # a directory that held none
    with_first = objects.fingerprint(repo, listed)
    assert with_first != empty
    assert objects.fingerprint(repo, listed) == with_first

    _write_loose(repo / "objects", listed[2], b"listed\n")  # the same bytes, a new file
    rewritten = objects.fingerprint(repo, listed)
    assert rewritten != with_first
    moved = first.stat().st_mtime_ns + 10**9
    os.utime(first, ns=(moved, moved))  # the same file, another mtime
    assert objects.fingerprint(repo, listed) != rewritten

    first.unlink()
    unlisted.unlink()
    assert objects.fingerprint(repo, listed) == empty  # gone again: as before it came
