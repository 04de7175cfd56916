"""A full file system is named as full: measured on the file system itself (a small tmpfs where one mounts)."""

from __future__ import annotations

import os
import subprocess

import pytest

from vllm_overlay import diskspace


def test_free_bytes_asks_the_nearest_existing_folder(tmp_path):
    expected = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    measured = diskspace.free_bytes(tmp_path / "not" / "made" / "yet")
    assert measured is not None and abs(measured - expected) < 64 << 20  # the same file system, give or take


def test_room_left_or_another_failure_is_not_called_full(tmp_path):
    if (diskspace.free_bytes(tmp_path) or 0) < diskspace.LOW:
        pytest.skip("this machine's temporary folder is itself nearly full")
    assert diskspace.full(tmp_path, "fatal: bad object HEAD") is None
    assert diskspace.full(tmp_path, f"error: write: {diskspace.NO_SPACE}") is not None  # git said so


def test_a_full_tmpfs_is_named_full(tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        with open(mount_point / "filler", "wb") as handle, pytest.raises(OSError):
            handle.write(b"\0" * (2 << 20))
            handle.flush()
        said = diskspace.full(mount_point / "out", "fatal: could not write to '.git/config.lock'")
        assert said == f"the file system holding {mount_point / 'out'} is full (0 KiB free)"
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
