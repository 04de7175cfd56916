"""Safe tar extraction (vllm_overlay.upstream.safetar): every refusal on both code paths.

"data-filter" is tarfile's own ``data`` filter (Python 3.11.4+, 3.12+; skipped on an interpreter
without it); "own-checks" is the path Debian 12's Python 3.11.2 takes, forced here on any interpreter.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from vllm_overlay.upstream import safetar
from vllm_overlay.upstream import trees as upstream_trees

PATHS = [
    pytest.param(
        True,
        id="data-filter",
        marks=pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="this Python has no data filter"),
    ),
    pytest.param(False, id="own-checks"),
]


@pytest.fixture(params=PATHS)
def path_kind(request, monkeypatch):
    monkeypatch.setattr(safetar, "HAS_DATA_FILTER", request.param)
    return request.param


def _info(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def _archive(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _extract(archive: Path, dest: Path, stream: bool = False) -> None:
    with tarfile.open(archive, "r|gz" if stream else "r:gz") as tar:
        safetar.extract_all(tar, dest)


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "out"


def test_absolute_name_is_refused(path_kind, tmp_path, dest):
    outside = tmp_path / "abs-escape.py"
    archive = _archive(tmp_path / "a.tar.gz", _info("pkg/ok.py"), _info(str(outside), data=b"bad"))
    with pytest.raises(safetar.UnsafeArchive, match="absolute member name"):
        _extract(archive, dest)
    assert not outside.exists()
    assert not (dest / str(outside).lstrip("/")).exists()  # not stripped to a relative name either


def test_dotdot_name_is_refused(path_kind, tmp_path, dest):
    archive = _archive(tmp_path / "a.tar.gz", _info("pkg/ok.py"), _info("pkg/../../escape.py", data=b"bad"))
    with pytest.raises(safetar.UnsafeArchive):
        _extract(archive, dest)
    assert not (tmp_path / "escape.py").exists()


def test_absolute_symlink_is_refused(path_kind, tmp_path, dest):
    archive = _archive(tmp_path / "a.tar.gz", _info("pkg/link", tarfile.SYMTYPE, linkname="/etc/passwd"))
    with pytest.raises(safetar.UnsafeArchive):
        _extract(archive, dest)
    assert not os.path.lexists(dest / "pkg" / "link")


def test_symlink_leaving_the_tree_is_refused(path_kind, tmp_path, dest):
    archive = _archive(tmp_path / "a.tar.gz", _info("pkg/link", tarfile.SYMTYPE, linkname="../../outside"))
    with pytest.raises(safetar.UnsafeArchive):
        _extract(archive, dest)
    assert not os.path.lexists(dest / "pkg" / "link")


def test_name_through_an_extracted_link_is_refused(path_kind, tmp_path, dest):
    """A link that stays inside, then a member whose name climbs out through it."""
    (tmp_path / "victim").mkdir()
    archive = _archive(
        tmp_path / "a.tar.gz",
        _info("pkg/sub", tarfile.DIRTYPE),
        _info("pkg/sub/up", tarfile.SYMTYPE, linkname=".."),  # -> pkg: inside
        _info("pkg/sub/up/../../victim/x.py", data=b"bad"),
    )
    with pytest.raises(safetar.UnsafeArchive):
        _extract(archive, dest)
    assert not (tmp_path / "victim" / "x.py").exists()


def test_hard_link_leaving_the_tree_is_refused(path_kind, tmp_path, dest):
    outside = tmp_path / "secret"
    outside.write_text("secret")
    archive = _archive(tmp_path / "a.tar.gz", _info("pkg/ok.py"), _info("pkg/h", tarfile.LNKTYPE, linkname="../secret"))
    with pytest.raises(safetar.UnsafeArchive):
        _extract(archive, dest)
    assert not (dest / "pkg" / "h").exists()
    assert outside.stat().st_nlink == 1


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE], ids=["char", "block", "fifo"])
def test_device_and_fifo_are_refused(path_kind, tmp_path, dest, kind):
    archive = _archive(tmp_path / "a.tar.gz", _info("pkg/dev", kind, devmajor=1, devminor=3))
    with pytest.raises(safetar.UnsafeArchive):
        _extract(archive, dest)
    assert not os.path.lexists(dest / "pkg" / "dev")


def test_owner_ids_and_high_mode_bits_are_not_taken(path_kind, tmp_path, dest):
    """As root, tarfile would chown to the archive's ids: the tree must stay the extracting user's."""
    owner = {"uid": 4321, "gid": 4321, "uname": "someone", "gname": "someone"}
    archive = _archive(
        tmp_path / "a.tar.gz",
        _info("pkg", tarfile.DIRTYPE, mode=0o777, **owner),
        _info("pkg/tool.sh", data=b"#!/bin/sh\n", mode=0o4777, **owner),
        _info("pkg/data.py", data=b"x = 1\n", mode=0o666, **owner),
        _info("pkg/alias.py", tarfile.SYMTYPE, linkname="data.py", **owner),
    )
    _extract(archive, dest)
    for rel in ("pkg", "pkg/tool.sh", "pkg/data.py", "pkg/alias.py"):
        info = os.lstat(dest / rel)
        assert (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid()), rel
    assert stat.S_IMODE((dest / "pkg" / "tool.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "pkg" / "data.py").stat().st_mode) == 0o644
    assert not stat.S_IMODE((dest / "pkg").stat().st_mode) & 0o022
    assert (dest / "pkg" / "alias.py").read_text() == "x = 1\n"


@pytest.mark.parametrize("stream", [False, True], ids=["random-access", "stream"])
def test_an_ordinary_tree_with_links_extracts(path_kind, tmp_path, dest, stream):
    archive = _archive(
        tmp_path / "a.tar.gz",
        _info("pkg", tarfile.DIRTYPE, mode=0o755),
        _info("pkg/a.py", data=b"a\n"),
        _info("pkg/b.py", tarfile.LNKTYPE, linkname="pkg/a.py"),
        _info("pkg/c.py", tarfile.SYMTYPE, linkname="a.py"),
        _info("pkg/sub/d.py", data=b"d\n"),
    )
    _extract(archive, dest, stream=stream)
    assert (dest / "pkg" / "b.py").read_text() == "a\n"
    assert (dest / "pkg" / "b.py").stat().st_ino == (dest / "pkg" / "a.py").stat().st_ino
    assert os.readlink(dest / "pkg" / "c.py") == "a.py"
    assert (dest / "pkg" / "sub" / "d.py").read_text() == "d\n"


def test_unpack_sdist_reports_a_refusal(path_kind, tmp_path, dest):
    archive = _archive(tmp_path / "vllm-1.tar.gz", _info("vllm-1/ok.py"), _info("../escape.py", data=b"bad"))
    dest.mkdir()
    with pytest.raises(upstream_trees.SourceError, match="refused to unpack"):
        upstream_trees.unpack_sdist(archive, dest)
    assert not (tmp_path / "escape.py").exists()


def test_this_interpreter_takes_the_path_it_can():
    assert safetar.HAS_DATA_FILTER is hasattr(tarfile, "data_filter")
