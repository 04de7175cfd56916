"""A local release archive, a file index that lists it, and a lock of it."""

from __future__ import annotations

import hashlib
import re
import tarfile
from pathlib import Path

from tests.tool.helpers.repos import REPO_ROOT, write_upstream
from vllm_overlay.upstream import lock


def release_archive(tmp_path: Path, version: str) -> Path:
    """An sdist of ``write_upstream``'s tree (its vllm/_version.py says 9.9.9, gdeadbeef)."""
    tree = write_upstream(tmp_path / "src" / f"vllm-{version}")
    archive = tmp_path / f"vllm-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=f"vllm-{version}")
    return archive


def file_index(root: Path, archive: Path) -> str:
    """A PEP 503 index in a directory, as `pip download -d` plus a static page generator make."""
    (root / "files").mkdir(parents=True)
    target = root / "files" / archive.name
    target.write_bytes(archive.read_bytes())
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    page = root / "simple" / "vllm" / "index.html"
    page.parent.mkdir(parents=True)
    link = f'<a href="../../files/{archive.name}#sha256={digest}">{archive.name}</a>'
    page.write_text(f"<html><body>{link}</body></html>")
    return (root / "simple").as_uri()


def lock_text_for(archive: Path, version: str, commit: str) -> str:
    """The project's upstream.lock, saying ``archive`` is release ``version`` at ``commit``."""
    text = (REPO_ROOT / "upstream.lock").read_text()
    text = text.replace('version = "0.33.0"', f'version = "{version}"').replace("vllm-0.33.0.tar.gz", archive.name)
    text = text.replace("vllm-0.33.0-cp38", f"vllm-{version}-cp38")  # the wheels of that release (lock.parse checks)
    text = text.replace('commit = "g4ba787ec9"', f'commit = "{commit}"')
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    return re.sub(r'(\[artifacts\.sdist\]\nfilename = "[^"]+"\nsha256 = ")[0-9a-f]{64}', rf"\g<1>{digest}", text)


def lock_for(archive: Path, version: str, commit: str) -> lock.Lock:
    return lock.parse(lock_text_for(archive, version, commit))


def lock_a_local_release(project: Path, tmp_path: Path) -> str:
    """Make ``project`` lock release 9.9.9, served by a file index; return the index's URL (--index-url)."""
    archive = release_archive(tmp_path / "release", "9.9.9")
    (project / "upstream.lock").write_text(lock_text_for(archive, "9.9.9", "gdeadbeef"))
    return file_index(tmp_path / "index", archive)
