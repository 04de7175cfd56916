# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A run's reuse: after patch k changed only k..n are re-applied, on the output's spare or a kept build; a tree
changed by hand is built from upstream; every reuse gives the tree a full apply gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import git

from tests.tool.helpers.apply_runs import apply_json as apply
from tests.tool.helpers.apply_runs import apply_locked
from tests.tool.helpers.releases import lock_a_local_release
from tests.tool.helpers.repos import IDENTITY, reword, rewrite_keeping_stat
from tests.tool.helpers.repos import stacked_patches as series_of
from vllm_overlay import cli, series
from vllm_overlay.apply import kept_builds
from vllm_overlay.apply import record as apply_record
from vllm_overlay.apply import run as apply_run
from vllm_overlay.upstream import trees as upstream_trees


def test_after_patch_k_changed_only_k_to_n_are_re_applied_and_the_tree_is_a_full_applys(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    patches = series_of(make_patch, upstream_dir, 3)
    out = tmp_path / "out"
    apply(project, upstream_dir, out)
    reword(patches[2], "Reworded the last.")
    apply(project, upstream_dir, out)  # the first tree is now the spare
    before = apply_record.load(tmp_path / ".out.spare")
    reword(patches[1], "Reworded.")
    with monkeypatch.context() as patched:
        starts = track_re_applies(patched)
        result = apply(project, upstream_dir, out)
    assert result["code"] == 0 and not result["unchanged"] and result["published"]
    assert starts == [1]  # patches 2 and 3 applied, on the spare's patch 1
    assert result["patches"][0]["commit"] == before["results"][0]["commit"]  # reused
    assert result["patches"][1]["commit"] != before["results"][1]["commit"]  # re-applied
    assert "Reworded." in git.Repo(out).commit(result["patches"][1]["commit"]).message
    full = tmp_path / "full"
    reference = apply(project, upstream_dir, full)
    assert [p["commit"] for p in reference["patches"]] == [p["commit"] for p in result["patches"]]
    assert git.Repo(out).head.commit.tree.hexsha == git.Repo(full).head.commit.tree.hexsha
    assert git.Repo(out).git.status("--porcelain") == ""
    assert apply(project, upstream_dir, out)["unchanged"]


def track_re_applies(monkeypatch) -> list[int]:
    """Fail any checkout of an upstream from now on; return the list of the patch index each
    re-apply on a spare starts at (0-based), filled as runs go."""
    starts: list[int] = []

    def no_checkout(*args, **kwargs):
        raise AssertionError("checked out the upstream although the spare holds a prefix of the series")

    real_reset = apply_run._reset_spare

    def reset_spare(area, output, shared):
        starts.append(len(shared))
        return real_reset(area, output, shared)

    monkeypatch.setattr(upstream_trees, "checkout", no_checkout)
    monkeypatch.setattr(apply_run, "_reset_spare", reset_spare)
    return starts


def test_a_refused_patch_after_the_reused_prefix_leaves_the_output_as_it_was(
    project, make_patch, upstream_dir, store_env, tmp_path
):
    patches = series_of(make_patch, upstream_dir, 2)
    out = tmp_path / "out"
    apply(project, upstream_dir, out)
    head = git.Repo(out).head.commit.hexsha
    # The last patch now needs a line upstream does not have: it conflicts.
    text = patches[1].read_text().replace("-line_10 = 10", "-line_10 = 99")
    patches[1].write_text(text)
    result = apply(project, upstream_dir, out)
    assert result["code"] == 1 and not result["published"]
    assert git.Repo(out).head.commit.hexsha == head
    assert "line_10 = 101" in (out / "vllm" / "core.py").read_text()


def built(project: Path, make_patch, upstream: Path, tmp_path: Path, count: int) -> tuple[list[Path], Path, Path]:
    """``count`` patches applied into tmp_path/out: the patches, the output and where its spare goes."""
    patches = series_of(make_patch, upstream, count)
    out = tmp_path / "out"
    apply(project, upstream, out)
    return patches, out, tmp_path / ".out.spare"


def test_the_replaced_tree_is_kept_as_the_spare_and_the_next_changed_patch_starts_from_it(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    patches, out, spare = built(project, make_patch, upstream_dir, tmp_path, 3)
    assert not spare.exists()  # nothing was replaced
    first_inode = out.stat().st_ino
    reword(patches[2], "Reworded once.")
    assert apply(project, upstream_dir, out)["code"] == 0  # no spare yet: built from upstream
    assert spare.stat().st_ino == first_inode  # the tree it replaced, kept
    second_inode = out.stat().st_ino
    reword(patches[2], "Reworded twice.")
    with monkeypatch.context() as patched:
        starts = track_re_applies(patched)
        result = apply(project, upstream_dir, out)
    assert starts == [2] and result["code"] == 0 and result["published"] and not result["unchanged"]
    assert spare.stat().st_ino == second_inode  # the spare became the output; the output the spare
    assert out.stat().st_ino == first_inode
    reference = apply(project, upstream_dir, tmp_path / "full")
    assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]]
    assert git.Repo(out).git.status("--porcelain", "--ignored") == ""
    assert apply(project, upstream_dir, out)["unchanged"]


def test_an_output_changed_by_hand_is_seen_while_the_spare_is_reset_and_a_refusal_keeps_the_spare(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    """The output's git status runs beside the spare's reset: an edit in the output still stops the
    run before anything replaces it, and the spare it had started from stays for the next run."""
    patches, out, spare = built(project, make_patch, upstream_dir, tmp_path, 3)
    reword(patches[2], "Reworded once.")
    assert apply(project, upstream_dir, out)["code"] == 0  # the first replace: a spare from now on
    core = out / "vllm" / "core.py"
    pristine, head = core.read_text(), git.Repo(out).head.commit.hexsha
    core.write_text(pristine.replace("line_40 = 40\n", "line_40 = 400\n"))
    reword(patches[2], "Reworded twice.")
    where = ["--project", str(project), "--upstream", str(upstream_dir), "-o", str(out)]
    with monkeypatch.context() as patched:
        starts = track_re_applies(patched)
        assert cli.main(["apply-patches", *where]) == 2  # unexported work: refused
    assert starts == [2]  # the spare was reset while the output was read
    assert "line_40 = 400" in core.read_text() and git.Repo(out).head.commit.hexsha == head
    assert apply_record.load(spare) is not None  # kept, reset to a commit its record names
    core.write_text(pristine)
    with monkeypatch.context() as patched:
        starts = track_re_applies(patched)
        result = apply(project, upstream_dir, out)
    assert starts == [2] and result["code"] == 0 and not result["unchanged"]
    reference = apply(project, upstream_dir, tmp_path / "full")
    assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]]
    assert git.Repo(out).git.status("--porcelain", "--ignored") == ""


def test_a_spare_changed_by_hand_still_gives_a_full_applys_tree(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    patches, out, spare = built(project, make_patch, upstream_dir, tmp_path, 3)
    core = spare / "vllm" / "core.py"
    for round, hand_change in enumerate(
        [
            lambda: core.write_text(core.read_text() + "x = 1\n"),
            lambda: rewrite_keeping_stat(core, core.read_text().replace("line_1 = 1\n", "line_1 = 7\n")),
            lambda: rewrite_keeping_stat(core, core.read_text().replace("line_2 = 2\n", "line_2 = 8\n")),
            lambda: (spare / "vllm" / "scratch.py").write_text("y = 2\n"),
            lambda: ((spare / "build").mkdir(), (spare / ".git" / "info" / "exclude").write_text("build/\n")),
            lambda: (core.write_text("staged\n"), git.Repo(spare).git.add("vllm/core.py")),
            lambda: (core.unlink(), git.Repo(spare).git.commit("-qam", "mine", env=IDENTITY)),
        ]
    ):
        reword(patches[2], f"Reworded, round {round}.")
        apply(project, upstream_dir, out)  # makes (or renews) the spare
        hand_change()
        reword(patches[2], f"Reworded again, round {round}.")
        with monkeypatch.context() as patched:
            starts = track_re_applies(patched)
            result = apply(project, upstream_dir, out)
        assert starts == [2] and result["code"] == 0 and result["published"], round
        full = tmp_path / f"full-{round}"
        reference = apply(project, upstream_dir, full)
        assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]], round
        assert git.Repo(out).git.status("--porcelain", "--ignored") == "", round
        assert (out / "vllm" / "core.py").read_text() == (full / "vllm" / "core.py").read_text(), round


def test_a_spare_of_other_inputs_or_off_its_branch_is_not_used(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    patches, out, spare = built(project, make_patch, upstream_dir, tmp_path, 2)
    reword(patches[1], "Reworded.")
    apply(project, upstream_dir, out)
    # The spare alone: where it is not used, the build is from upstream (the cache's kept builds,
    # which would serve it otherwise, are tests/tool/apply/test_kept_builds.py's).
    monkeypatch.setattr(kept_builds, "best", lambda *args: None)
    checkouts = []
    real_checkout = upstream_trees.checkout
    monkeypatch.setattr(upstream_trees, "checkout", lambda *a: (checkouts.append(True), real_checkout(*a))[1])
    git.Repo(spare).git.checkout("-q", "-b", "mine")
    reword(patches[1], "Reworded again.")
    assert apply(project, upstream_dir, out)["code"] == 0 and checkouts == [True]  # the spare is off its branch
    reword(patches[1], "Reworded a third time.")
    assert apply(project, upstream_dir, out, "--allow-offset")["code"] == 0  # other options: from upstream
    reword(patches[1], "Reworded a fourth time.")
    result = apply(project, upstream_dir, out, "--allow-offset")
    assert result["code"] == 0 and checkouts == [True, True, True]  # the spare is of the options before
    reference = apply(project, upstream_dir, tmp_path / "full", "--allow-offset")
    assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]]


def reword_description(patch: Path, words: str) -> None:
    """Reword the patch's DEP-3 Description: its message still ends in its trailer block."""
    text = patch.read_bytes()
    assert b"\nDescription: " in text
    patch.write_bytes(text.replace(b"\nDescription: ", f"\nDescription: ({words}) ".encode(), 1))


def locked_with_a_spare(project, make_patch, upstream, tmp_path, count, reworded):
    """``count`` patches applied from a locked local release into tmp_path/out, then patch 2 reworded
    (``reworded(patch, words)``) and applied again, so the output has a spare: (index, patches, out)."""
    index = lock_a_local_release(project, tmp_path)
    patches = series_of(make_patch, upstream, count)
    out = tmp_path / "out"
    assert apply_locked(project, index, out)["code"] == 0
    reworded(patches[1], "reworded")
    assert apply_locked(project, index, out)["code"] == 0  # the first replace: no spare yet
    return index, patches, out


def test_a_re_apply_of_the_locked_upstream_on_the_spare_obtains_no_upstream_and_one_without_verifies_it(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    index, patches, out = locked_with_a_spare(project, make_patch, upstream_dir, tmp_path, 2, reword)
    obtained: list[str] = []
    real_obtain = upstream_trees.obtain
    monkeypatch.setattr(upstream_trees, "obtain", lambda *a: (obtained.append("obtain"), real_obtain(*a))[1])
    reword(patches[1], "Reworded again.")
    with monkeypatch.context() as patched:
        starts = track_re_applies(patched)
        on_spare = apply_locked(project, index, out)
    assert starts == [1] and on_spare["code"] == 0 and not on_spare["unchanged"] and obtained == []
    reference = apply_locked(project, index, tmp_path / "full")
    assert on_spare["upstream"] == reference["upstream"]
    assert [p["commit"] for p in on_spare["patches"]] == [p["commit"] for p in reference["patches"]]
    # A spare that cannot be used (off its branch): the run checks out the upstream, verified first.
    git.Repo(tmp_path / ".out.spare").git.checkout("-q", "-b", "mine")
    obtained.clear()
    reword(patches[1], "Reworded a third time.")
    again = apply_locked(project, index, out)
    assert again["code"] == 0 and obtained == ["obtain"] and again["upstream"] == reference["upstream"]
    assert apply_locked(project, index, out)["unchanged"]


def test_a_re_apply_on_the_spare_never_imports_gitpython(project, make_patch, upstream_dir, store_env, tmp_path):
    """Reset, clean, the stretch's check and its git am are plain git processes: GitPython's import
    is a third of such a run's time. Without it the run cannot have checked out the upstream."""
    index, patches, out = locked_with_a_spare(project, make_patch, upstream_dir, tmp_path, 2, reword_description)
    reword_description(patches[1], "reworded again")
    argv = ["apply-patches", "--project", str(project), "--index-url", index, "-o", str(out)]
    probe = (
        f"import sys; from vllm_overlay import cli; code = cli.main({argv!r}); "
        "print(code, 'git' in sys.modules, 'tempfile' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[-2] == "0 False False", done.stdout + done.stderr
    assert "(reworded again)" in git.Repo(out).git.log("-1", "--format=%B")


def test_a_build_into_a_new_output_that_a_kept_build_serves_parses_no_patch(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    index = lock_a_local_release(project, tmp_path)
    series_of(make_patch, upstream_dir, 3)
    first = apply_locked(project, index, tmp_path / "first")
    assert first["code"] == 0
    parsed: list[str] = []
    real_parse = series.parse_mail
    monkeypatch.setattr(series, "parse_mail", lambda raw, name: (parsed.append(name), real_parse(raw, name))[1])
    second = apply_locked(project, index, tmp_path / "second")
    assert second["code"] == 0 and parsed == []
    assert second["patches"] == first["patches"]  # the kept build's results, subjects included
    third = apply_locked(project, index, tmp_path / "third", "--rebuild")
    assert third["code"] == 0 and parsed == [p["name"] for p in first["patches"]]  # --rebuild parses all


def test_a_re_apply_on_the_spare_parses_only_the_patches_after_the_ones_it_holds(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    index, patches, out = locked_with_a_spare(project, make_patch, upstream_dir, tmp_path, 3, reword_description)
    parsed: list[str] = []
    real_parse = series.parse_mail
    monkeypatch.setattr(series, "parse_mail", lambda raw, name: (parsed.append(name), real_parse(raw, name))[1])
    reword_description(patches[1], "reworded again")
    with monkeypatch.context() as patched:
        starts = track_re_applies(patched)
        result = apply_locked(project, index, out)
    assert starts == [1] and result["code"] == 0
    names = [p["name"] for p in result["patches"]]
    assert parsed == names[1:]  # the spare holds the first: its bytes are never parsed
    reference = apply_locked(project, index, tmp_path / "full")
    assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]]
    assert result["patches"][0] == reference["patches"][0]
