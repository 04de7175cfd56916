# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every command that replaces or removes a directory leaves alone one it did not make."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tool.helpers import write_upstream
from tests.tool.test_image import apply_no_patches, do_stage, image_project, upstream_dir  # noqa: F401 (fixtures)
from vllm_overlay import cache, cli, lock
from vllm_overlay.image import build_context
from vllm_overlay.store import Store


def _users_files(directory: Path) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notes.txt").write_text("the user's notes\n")
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "data.bin").write_bytes(b"\0\1\2")
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_image_staging_never_replaces_a_users_directory(image_project, upstream_dir, store_env):  # noqa: F811 (fixtures)
    apply_no_patches(image_project, upstream_dir)
    context = image_project / "build" / "image"
    before = _users_files(context)
    with pytest.raises(build_context.ImageError, match=r"holds notes\.txt, sub.*nothing was touched"):
        do_stage(image_project)
    assert _files(context) == before
    (context / "notes.txt").unlink()
    (context / "sub" / "data.bin").unlink()
    (context / "sub").rmdir()
    do_stage(image_project)  # empty: staged
    do_stage(image_project)  # what an earlier stage wrote: replaced
    assert (context / "Dockerfile").is_file()


def test_test_patches_never_works_in_a_users_directory(project, store_env, tmp_path, capsys):
    workdir = tmp_path / "home-like"
    before = _users_files(workdir)
    (workdir / "steps").mkdir()
    (workdir / "steps" / "000").mkdir()
    (workdir / "steps" / "000" / "keep.txt").write_text("mine\n")
    before = _files(workdir)
    argv = ["test-patches", "--project", str(project), "--workdir", str(workdir), "--no-tool-tests"]
    code = cli.main([*argv, "--upstream", str(write_upstream(tmp_path / "up"))])
    assert code == 2
    assert "holds notes.txt" in capsys.readouterr().err
    assert _files(workdir) == before


def test_cache_prune_never_removes_what_a_link_in_envs_points_at_outside_the_cache(project, store_env, tmp_path):
    store = Store()
    store.envs.mkdir(parents=True)
    outside = tmp_path / "users-venv"
    before = _users_files(outside)
    os.symlink(outside, store.envs / "0123456789abcdef0123")  # a stale key, pointing out of the cache
    built = store.envs / ".fedcba9876543210.1-2"
    built.mkdir()
    (built / "pyvenv.cfg").write_text("home = /usr\n")
    os.symlink(built, store.envs / "fedcba9876543210fedc")  # a stale environment this cache built
    (store.root / "verdicts" / "not-a-scope").mkdir(parents=True)
    (store.root / "verdicts" / "not-a-scope" / "x").write_text("x")
    removed = {entry.path for entry in cache.prune(store, lock.load(project / "upstream.lock"))}
    assert store.envs / "0123456789abcdef0123" in removed and not (store.envs / "0123456789abcdef0123").exists()
    assert _files(outside) == before
    assert not built.exists()
    assert (store.root / "verdicts" / "not-a-scope" / "x").exists()
