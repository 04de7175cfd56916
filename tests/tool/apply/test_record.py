# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Re-applies that reuse what the output holds: unchanged (nothing rebuilt), incremental (k..n only).

Every reuse must give the tree a full apply gives (same commit ids), and anything done to the
output by hand must make the run build from upstream as before.
"""

from __future__ import annotations

import subprocess
import sys

import git

from tests.tool.helpers.apply_runs import apply_json as apply
from tests.tool.helpers.apply_runs import apply_locked
from tests.tool.helpers.releases import lock_a_local_release
from tests.tool.helpers.repos import IDENTITY, rewrite_keeping_stat
from tests.tool.helpers.repos import stacked_patches as series_of
from vllm_overlay.apply import record as apply_record
from vllm_overlay.upstream import trees as upstream_trees


def test_an_unchanged_re_apply_rebuilds_nothing_and_reports_the_recorded_statuses(
    project, make_patch, upstream_dir, store_env, tmp_path
):
    series_of(make_patch, upstream_dir)
    out = tmp_path / "out"
    first = apply(project, upstream_dir, out)
    assert first["code"] == 0 and not first["unchanged"]
    inode = out.stat().st_ino  # a rebuild publishes a new directory (another inode) at the path
    again = apply(project, upstream_dir, out)
    assert again["code"] == 0 and again["unchanged"] and again["published"]
    assert out.stat().st_ino == inode
    assert [p["status"] for p in again["patches"]] == [p["status"] for p in first["patches"]]
    assert [p["commit"] for p in again["patches"]] == [p["commit"] for p in first["patches"]]


def test_any_hand_change_to_the_output_is_rebuilt_from_upstream(project, make_patch, upstream_dir, store_env, tmp_path):
    series_of(make_patch, upstream_dir)
    out = tmp_path / "out"
    apply(project, upstream_dir, out)
    head = git.Repo(out).head.commit.hexsha
    core = out / "vllm" / "core.py"
    pristine = core.read_text()

    def edited(change) -> dict:
        change()
        return apply(project, upstream_dir, out, "--discard-unexported")

    for name, hand_change in {
        "edit": lambda: core.write_text(pristine + "x = 1\n"),
        "new file": lambda: (out / "vllm" / "scratch.py").write_text("y = 2\n"),
        "staged": lambda: (core.write_text(pristine + "z = 3\n"), git.Repo(out).git.add("vllm/core.py")),
        "deleted": lambda: core.unlink(),
        "other branch": lambda: git.Repo(out).git.checkout("-q", "-b", "mine"),
    }.items():
        result = edited(hand_change)
        assert result["code"] == 0 and not result["unchanged"], name
        assert core.read_text() == pristine and not (out / "vllm" / "scratch.py").exists(), name
        assert git.Repo(out).head.commit.hexsha == head and git.Repo(out).active_branch.name == "patched", name
        assert apply(project, upstream_dir, out)["unchanged"], name  # rebuilt: reusable again

    # A commit made by hand: HEAD is not the recorded one.
    repo = git.Repo(out)
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("--allow-empty", "-qm", "mine")
    assert apply(project, upstream_dir, out, "--discard-unexported")["unchanged"] is False
    assert git.Repo(out).head.commit.hexsha == head


def test_other_inputs_are_never_answered_from_the_record(project, make_patch, upstream_dir, store_env, tmp_path):
    series_of(make_patch, upstream_dir, 1)
    out = tmp_path / "out"
    apply(project, upstream_dir, out)
    assert apply(project, upstream_dir, out, "--allow-offset")["unchanged"] is False  # other options
    assert apply(project, upstream_dir, out, "--allow-offset")["unchanged"] is True
    lock = project / "upstream.lock"
    lock.write_text(lock.read_text().replace(':v0.33.0"', ':v0.33.0-local"', 1))
    relocked = apply(project, upstream_dir, out, "--allow-offset")
    assert relocked["code"] == 0 and relocked["unchanged"] is False  # a lock that says something else
    record = apply_record.load(out)
    assert record is not None and record["head"] == git.Repo(out).head.commit.hexsha


def test_an_unchanged_re_apply_of_the_locked_upstream_reads_no_upstream(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    index = lock_a_local_release(project, tmp_path)
    series_of(make_patch, upstream_dir)
    out = tmp_path / "out"
    first = apply_locked(project, index, out)
    assert first["code"] == 0 and not first["unchanged"] and first["upstream"]["kind"] == "locked"

    def no_obtain(*args, **kwargs):
        raise AssertionError("the upstream was obtained for a run that builds nothing")

    with monkeypatch.context() as patched:
        patched.setattr(upstream_trees, "obtain", no_obtain)
        again = apply_locked(project, index, out)
    assert again["code"] == 0 and again["unchanged"] and again["upstream"] == first["upstream"]
    assert [p["commit"] for p in again["patches"]] == [p["commit"] for p in first["patches"]]


def test_the_record_alone_never_answers_for_a_changed_output_patch_or_cache(
    project, make_patch, upstream_dir, store_env, tmp_path
):
    index = lock_a_local_release(project, tmp_path)
    patches = series_of(make_patch, upstream_dir, 2)
    out = tmp_path / "out"
    apply_locked(project, index, out)
    head = git.Repo(out).head.commit.hexsha
    core = out / "vllm" / "core.py"
    pristine = core.read_text()
    for name, hand_change in {
        "edit": lambda: core.write_text(pristine + "x = 1\n"),
        "edit, size and mtime kept": lambda: rewrite_keeping_stat(
            core, pristine.replace("line_1 = 1\n", "line_1 = 7\n")
        ),
        "new file": lambda: (out / "vllm" / "scratch.py").write_text("y = 2\n"),
        "staged": lambda: (core.write_text(pristine + "z = 3\n"), git.Repo(out).git.add("vllm/core.py")),
        "other branch": lambda: git.Repo(out).git.checkout("-q", "-b", "mine"),
    }.items():
        hand_change()
        result = apply_locked(project, index, out, "--discard-unexported")
        assert result["code"] == 0 and not result["unchanged"], name
        assert core.read_text() == pristine and git.Repo(out).head.commit.hexsha == head, name
        assert apply_locked(project, index, out)["unchanged"], name
    patches[1].write_bytes(patches[1].read_bytes().replace(b"\n---\n", b"\nReworded.\n---\n", 1))
    assert apply_locked(project, index, out)["unchanged"] is False  # other patch bytes
    assert apply_locked(project, index, out, "--rebuild")["unchanged"] is False
    for recorded in (store_env / "downloads").glob("*.imported"):
        recorded.unlink()  # the cache lost its import: the run obtains (and verifies) it again
    result = apply_locked(project, index, out)
    assert result["code"] == 0 and result["unchanged"] and any((store_env / "downloads").glob("*.imported"))


def test_an_unchanged_re_apply_never_imports_the_apply_engines_heavy_modules(
    project, make_patch, upstream_dir, store_env, tmp_path
):
    index = lock_a_local_release(project, tmp_path)
    series_of(make_patch, upstream_dir)
    out = tmp_path / "out"
    assert apply_locked(project, index, out)["code"] == 0
    argv = ["apply-patches", "--project", str(project), "--index-url", index, "-o", str(out)]
    heavy = ("git", "unidiff", "email.policy", "packaging", "urllib.request", "html.parser", "tarfile", "ctypes")
    probe = (
        f"import sys; from vllm_overlay import cli; code = cli.main({argv!r}); "
        f"print(code, sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[-2] == "0 []", done.stdout + done.stderr
    assert "unchanged" in done.stdout
