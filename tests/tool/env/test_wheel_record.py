"""The locked wheel's RECORD: read from a wheel checked against its sha256, cached, never guessed."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay.env import wheel_record
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

RECORD = "vllm/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\nvllm-0.33.0.dist-info/RECORD,,\n"


def make_wheel(path: Path, record_text: str = RECORD) -> str:
    """A wheel archive holding vllm/__init__.py and its dist-info; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        archive.writestr("vllm-0.33.0.dist-info/RECORD", record_text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[lock.Lock, list[str]]:
    """A lock pinning a wheel the 'index' (a file:// URL) serves; the list collects each download."""
    wheel = tmp_path / "index" / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    sha256 = make_wheel(wheel)
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    the_lock = dataclasses.replace(the_lock, wheels={"x86_64": lock.Artifact(wheel.name, sha256)})
    fetched: list[str] = []

    def release_files(project: str, version: str) -> list[upstream_trees.IndexFile]:
        fetched.append(f"{project} {version}")
        return [upstream_trees.IndexFile(wheel.name, wheel.as_uri(), sha256, wheel.stat().st_size)]

    monkeypatch.setattr(upstream_trees, "release_files", release_files)
    return the_lock, fetched


def test_the_record_is_read_from_the_checked_wheel_once_then_cached(served, store_env: Path) -> None:
    the_lock, fetched = served
    found = wheel_record.locked(the_lock, Store(), "x86_64")
    assert found.text == RECORD and found.wheel_sha256 == the_lock.wheels["x86_64"].sha256
    assert not (Store().downloads / found.wheel).exists()  # only its RECORD is kept
    assert wheel_record.locked(the_lock, Store(), "x86_64") == found and fetched == ["vllm 0.33.0"]


def test_an_edited_cached_record_is_not_believed(served, store_env: Path) -> None:
    the_lock, fetched = served
    found = wheel_record.locked(the_lock, Store(), "x86_64")
    cached = Store().downloads / (found.wheel + wheel_record.SUFFIX)
    cached.write_text(RECORD.replace("47DEQ", "AAAAA"))
    assert wheel_record.locked(the_lock, Store(), "x86_64").text == RECORD and len(fetched) == 2


def test_a_wheel_that_is_not_the_locked_one_is_refused(served, store_env: Path) -> None:
    the_lock, _ = served
    other = dataclasses.replace(
        the_lock, wheels={"x86_64": lock.Artifact(the_lock.wheels["x86_64"].filename, "0" * 64)}
    )
    with pytest.raises(wheel_record.WheelRecordError, match="the lock pins 0000"):
        wheel_record.locked(other, Store(), "x86_64")
    name = the_lock.wheels["x86_64"].filename
    assert not (Store().downloads / name).exists()  # nothing downloaded, nothing cached as that wheel's
    sidecar = Store().downloads / (name + wheel_record.SUFFIX + ".sha256")
    assert not sidecar.exists() or not sidecar.read_text().startswith("0" * 64)


def test_no_wheel_for_this_machine_says_which_the_lock_has(served) -> None:
    the_lock, _ = served
    with pytest.raises(wheel_record.WheelRecordError, match=r"no vllm wheel for riscv64 \(it has: x86_64\)"):
        wheel_record.wheel_for(the_lock, "riscv64")


def test_a_wheel_without_one_record_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
    with pytest.raises(wheel_record.WheelRecordError, match="0 dist-info RECORD files"):
        wheel_record.read_from_wheel(wheel)
    make_wheel(wheel, record_text="")
    with pytest.raises(wheel_record.WheelRecordError, match="its RECORD is empty"):
        wheel_record.read_from_wheel(wheel)
