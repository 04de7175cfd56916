"""linkcopy: a copy of a git working tree whose files and objects are hard links to the source's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tool.helpers import change_line_20, git, write_upstream
from vllm_overlay import linkcopy


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = write_upstream(tmp_path / "source", extra={"docs/readme.txt": "hello\n"})
    (root / "vllm" / "link.py").symlink_to("core.py")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "upstream")
    change_line_20(root)
    git(root, "commit", "-qam", "line 20")
    return root


def _inode(path: Path) -> int:
    return os.lstat(path).st_ino


def test_working_files_and_objects_are_shared_the_rest_of_git_is_copied(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    linkcopy.link_copy(source, dest)
    for rel in ("vllm/core.py", "vllm/_version.py", "docs/readme.txt"):
        assert _inode(dest / rel) == _inode(source / rel), rel
    objects = [p for p in (source / ".git" / "objects").rglob("*") if p.is_file()]
    assert objects and all(_inode(dest / p.relative_to(source)) == _inode(p) for p in objects)
    for rel in (".git/index", ".git/HEAD", ".git/config", ".git/refs/heads/main"):
        assert (dest / rel).read_bytes() == (source / rel).read_bytes(), rel
        assert _inode(dest / rel) != _inode(source / rel), rel
    assert (dest / "vllm" / "link.py").is_symlink() and os.readlink(dest / "vllm" / "link.py") == "core.py"
    assert git(dest, "rev-parse", "HEAD") == git(source, "rev-parse", "HEAD")


def test_the_copy_is_clean_and_git_writes_there_never_reach_the_source(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    linkcopy.link_copy(source, dest)
    git(dest, "config", "core.trustctime", "false")  # as the incremental re-apply sets it
    assert git(dest, "status", "--porcelain") == ""
    before = (source / "vllm" / "core.py").read_bytes()
    git(dest, "reset", "-q", "--hard", "HEAD~1")  # git rewrites core.py in the copy
    assert "line_20 = 20\n" in (dest / "vllm" / "core.py").read_text()
    assert (source / "vllm" / "core.py").read_bytes() == before
    assert _inode(dest / "vllm" / "core.py") != _inode(source / "vllm" / "core.py")
    assert _inode(dest / "docs" / "readme.txt") == _inode(source / "docs" / "readme.txt")  # untouched: still shared
    assert git(source, "status", "--porcelain") == ""
    assert git(source, "log", "--format=%s") == "line 20\nupstream\n"


def test_an_existing_destination_is_refused(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    dest.mkdir()
    with pytest.raises(FileExistsError):
        linkcopy.link_copy(source, dest)
    assert list(dest.iterdir()) == []
