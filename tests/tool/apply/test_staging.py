# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every command that replaces or removes a directory leaves alone one it did not make."""

from __future__ import annotations

import os

from tests.tool.helpers.repos import tree_files, users_files, write_upstream
from vllm_overlay import cache, cli
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock


def test_test_patches_never_works_in_a_users_directory(project, store_env, tmp_path, capsys):
    workdir = tmp_path / "home-like"
    before = users_files(workdir)
    (workdir / "steps").mkdir()
    (workdir / "steps" / "000").mkdir()
    (workdir / "steps" / "000" / "keep.txt").write_text("mine\n")
    before = tree_files(workdir)
    argv = ["test-patches", "--project", str(project), "--workdir", str(workdir), "--no-tool-tests"]
    code = cli.main([*argv, "--upstream", str(write_upstream(tmp_path / "up"))])
    assert code == 2
    assert "holds notes.txt" in capsys.readouterr().err
    assert tree_files(workdir) == before


def test_cache_prune_never_removes_what_a_link_in_envs_points_at_outside_the_cache(project, store_env, tmp_path):
    store = Store()
    store.envs.mkdir(parents=True)
    outside = tmp_path / "users-venv"
    before = users_files(outside)
    os.symlink(outside, store.envs / "0123456789abcdef0123")  # a stale key, pointing out of the cache
    built = store.envs / ".fedcba9876543210.1-2"
    built.mkdir()
    (built / "pyvenv.cfg").write_text("home = /usr\n")
    os.symlink(built, store.envs / "fedcba9876543210fedc")  # a stale environment this cache built
    (store.root / "verdicts" / "not-a-scope").mkdir(parents=True)
    (store.root / "verdicts" / "not-a-scope" / "x").write_text("x")
    removed = {entry.path for entry in cache.prune(store, lock.load(project / "upstream.lock"))}
    assert store.envs / "0123456789abcdef0123" in removed and not (store.envs / "0123456789abcdef0123").exists()
    assert tree_files(outside) == before
    assert not built.exists()
    assert (store.root / "verdicts" / "not-a-scope" / "x").exists()
