# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Builds kept in the cache: a build into a new output re-applies only what no kept build holds.

Every build that starts from a kept one must give the tree a full apply gives (same commit ids,
statuses and record), must not depend on the cache afterwards, and a kept build that is not what
was written, or that git cannot use, must give way to the build from upstream.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import apply_json as apply
from tests.tool.helpers.repos import reword
from tests.tool.helpers.repos import stacked_patches as series_of
from vllm_overlay.apply import engine as apply_engine
from vllm_overlay.apply import kept_builds
from vllm_overlay.apply import record as apply_record
from vllm_overlay.store import Store


def kept_folder() -> Path:
    return Store().kept_builds


def track_starts(monkeypatch) -> list[int]:
    """The index of the first patch each build re-applies (0: a build from upstream), filled as runs go."""
    starts: list[int] = []
    real = apply_engine._apply_each

    def each(repo, area, patches, mails, upstream, options, progress, seed_base, start, head):
        starts.append(start)
        return real(repo, area, patches, mails, upstream, options, progress, seed_base, start, head)

    monkeypatch.setattr(apply_engine, "_apply_each", each)
    return starts


def full_apply(project: Path, upstream: Path, output: Path, *extra: str) -> dict:
    """A build from upstream: the kept builds are set aside for the run, then put back."""
    aside = kept_folder().with_name("kept-builds-aside")
    if kept_folder().exists():
        os.rename(kept_folder(), aside)
    try:
        return apply(project, upstream, output, *extra)
    finally:
        shutil.rmtree(kept_folder(), ignore_errors=True)
        if aside.exists():
            os.rename(aside, kept_folder())


def test_a_build_into_a_new_output_checks_the_kept_build_out_and_re_applies_nothing(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    series_of(make_patch, upstream_dir, 3)
    first = apply(project, upstream_dir, tmp_path / "first")
    assert first["code"] == 0
    assert len(list(kept_folder().glob("*.json"))) == 1
    starts = track_starts(monkeypatch)
    second = apply(project, upstream_dir, tmp_path / "second")
    assert second["code"] == 0 and second["published"] and not second["unchanged"]
    assert starts == [3]  # every patch came from the kept build
    assert [(p["status"], p["commit"]) for p in second["patches"]] == [
        (p["status"], p["commit"]) for p in first["patches"]
    ]
    repo = git.Repo(tmp_path / "second")
    assert repo.head.commit.tree.hexsha == git.Repo(tmp_path / "first").head.commit.tree.hexsha
    assert repo.git.status("--porcelain", "--untracked-files=all") == ""
    assert repo.active_branch.name == "patched"
    record = apply_record.load(tmp_path / "second")
    assert record is not None and "kept_pack" not in record  # the tree's own record, as a full apply writes it
    shutil.rmtree(kept_folder())  # the published tree does not depend on the cache
    subprocess.run(["git", "-C", str(tmp_path / "second"), "fsck", "--strict"], check=True, capture_output=True)
    assert apply(project, upstream_dir, tmp_path / "second")["unchanged"]


def test_a_changed_last_patch_re_applies_only_it_on_the_kept_build_with_a_full_applys_commits(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    patches = series_of(make_patch, upstream_dir, 3)
    apply(project, upstream_dir, tmp_path / "first")
    reword(patches[2], "Reworded the last.")
    with monkeypatch.context() as patched:
        starts = track_starts(patched)
        result = apply(project, upstream_dir, tmp_path / "second")
    assert result["code"] == 0 and starts == [2]
    reference = full_apply(project, upstream_dir, tmp_path / "reference")
    assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]]
    assert "Reworded the last." in git.Repo(tmp_path / "second").head.commit.message
    assert len(list(kept_folder().glob("*.json"))) == 2  # both series kept


def test_a_kept_pack_changed_since_it_was_written_is_removed_and_never_used(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    series_of(make_patch, upstream_dir, 2)
    apply(project, upstream_dir, tmp_path / "first")
    (pack,) = kept_folder().glob("*.pack")
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the objects
    pack.unlink()
    pack.write_bytes(bytes(data))
    starts = track_starts(monkeypatch)
    assert apply(project, upstream_dir, tmp_path / "second")["code"] == 0
    assert starts == [0]  # built from upstream
    assert [p.name for p in kept_folder().glob("*.pack")] == [pack.name]  # and kept anew
    assert pack.read_bytes() != bytes(data)
    assert apply(project, upstream_dir, tmp_path / "third")["code"] == 0
    assert starts == [0, 2]  # which the next build into a new output uses


def test_a_kept_pack_git_freshened_through_a_tree_built_on_it_is_still_used(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    """git sets a pack's mtime whenever it would write an object the pack holds, through every hard
    link: a re-apply on a tree built from the kept build freshens the cache's pack."""
    patches = series_of(make_patch, upstream_dir, 2)
    apply(project, upstream_dir, tmp_path / "first")
    (pack,) = kept_folder().glob("*.pack")
    written = pack.stat().st_mtime_ns
    original = patches[1].read_bytes()
    reword(patches[1], "Reworded the last.")
    assert apply(project, upstream_dir, tmp_path / "first")["code"] == 0  # on the kept build: its pack linked
    assert pack.stat().st_mtime_ns != written  # git am wrote blobs the pack holds: freshened
    patches[1].write_bytes(original)
    starts = track_starts(monkeypatch)
    result = apply(project, upstream_dir, tmp_path / "second")
    assert result["code"] == 0 and starts == [2]  # the kept build of the original series, still used


def test_a_kept_build_git_cannot_use_gives_way_to_the_build_from_upstream(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    series_of(make_patch, upstream_dir, 2)
    first = apply(project, upstream_dir, tmp_path / "first")
    monkeypatch.setattr(kept_builds, "link_into", lambda build, git_dir: None)  # its commits never arrive
    starts = track_starts(monkeypatch)
    second = apply(project, upstream_dir, tmp_path / "second")
    assert second["code"] == 0 and starts == [0]
    assert [p["commit"] for p in second["patches"]] == [p["commit"] for p in first["patches"]]
    assert not list(tmp_path.glob(".second.staging-*"))


def test_a_kept_build_of_other_options_or_a_selection_is_not_used(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    patches = series_of(make_patch, upstream_dir, 2)
    apply(project, upstream_dir, tmp_path / "first")
    starts = track_starts(monkeypatch)
    assert apply(project, upstream_dir, tmp_path / "offset", "--allow-offset")["code"] == 0
    assert starts == [0]
    kept = sorted(kept_folder().glob("*.json"))
    only = f"{patches[0].parent.name}/{patches[0].name}"
    assert apply(project, upstream_dir, tmp_path / "only", "--only", only)["code"] == 0
    assert starts == [0, 0]
    assert sorted(kept_folder().glob("*.json")) == kept  # a selection is never kept


def test_at_most_limit_builds_are_kept_the_least_recently_used_removed_first(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    monkeypatch.setattr(kept_builds, "LIMIT", 2)
    patches = series_of(make_patch, upstream_dir, 2)
    heads = []
    for round_number in range(3):
        if round_number:
            reword(patches[1], f"Reworded {round_number}.")
        out = tmp_path / f"out-{round_number}"
        assert apply(project, upstream_dir, out)["code"] == 0
        heads.append(git.Repo(out).head.commit.hexsha)
    assert sorted(p.stem for p in kept_folder().glob("*.json")) == sorted(heads[1:])
    assert sorted(p.stem for p in kept_folder().glob("*.pack")) == sorted(heads[1:])


@pytest.mark.parametrize("damage", ["unwritable", "not a directory"])
def test_a_cache_that_cannot_keep_a_build_costs_the_run_nothing(
    project, make_patch, upstream_dir, store_env, tmp_path, damage
):
    series_of(make_patch, upstream_dir, 2)
    folder = kept_folder()
    folder.parent.mkdir(parents=True, exist_ok=True)
    if damage == "unwritable":
        folder.mkdir()
        folder.chmod(0o500)
        if os.access(folder, os.W_OK):  # root writes anyway: then a file stands in the way instead
            folder.rmdir()
            folder.write_text("")
    else:
        folder.write_text("")
    try:
        result = apply(project, upstream_dir, tmp_path / "out")
    finally:
        if folder.is_dir():
            folder.chmod(0o700)
    assert result["code"] == 0 and result["published"]
