"""A format-patch mail saved with CRLF line endings applies as plain ``git am`` applies it."""

from __future__ import annotations

import shutil
from pathlib import Path

import git as gitpython

from tests.tool.helpers.apply_runs import run_apply, statuses
from tests.tool.helpers.repos import change_line_20, git, replace_line, write_upstream
from vllm_overlay import series
from vllm_overlay.apply import patched_repo


def to_crlf(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))


def plain_git_am_tree(tree: Path, mail: Path, work: Path, *flags: str, objects: Path | None = None) -> tuple[int, str]:
    """Exit status of plain ``git am`` of ``mail`` on a repository of ``tree``, and the tree it leaves.

    ``objects``: a repository whose tags are fetched first (where a 3-way merge finds its base blobs).
    """
    shutil.copytree(tree, work)
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "upstream")
    if objects is not None:
        git(work, "fetch", "-q", str(objects), "refs/tags/*:refs/tags/*")
    repo = gitpython.Repo(work)
    status, _out, _err = repo.git.am(*flags, str(mail), with_extended_output=True, with_exceptions=False)
    return status, repo.git.rev_parse("HEAD^{tree}")


def patched_tree(project: Path) -> str:
    return gitpython.Repo(project / "build" / "patched").git.rev_parse("HEAD^{tree}")


def test_crlf_mail_parses_like_the_lf_mail(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    lf = series.load_patch(project / "patches", "demo/core-change-line-20.patch")
    to_crlf(path)
    crlf = series.load_patch(project / "patches", "demo/core-change-line-20.patch")
    assert (crlf.subject, crlf.message, crlf.trailers) == (lf.subject, lf.message, lf.trailers)
    assert str(crlf.diff) == str(lf.diff)


def test_crlf_mail_applies_as_plain_git_am(project, make_patch, upstream_dir, store_env, tmp_path):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    to_crlf(path)
    code, report = run_apply(project, upstream_dir)
    assert (code, statuses(report)) == (0, ["clean"])
    assert plain_git_am_tree(upstream_dir, path, tmp_path / "plain") == (0, patched_tree(project))


def test_crlf_mail_merged_3way_commits_what_it_classified(project, make_patch, upstream_dir, store_env, tmp_path):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    to_crlf(path)
    drifted = write_upstream(tmp_path / "drifted")
    replace_line(drifted / "vllm" / "core.py", "line_17 = 17\n", "x = 17\n")
    code, report = run_apply(project, drifted, "--3way", base=upstream_dir)
    assert (code, statuses(report)) == (0, ["merged-3way"])
    plain = plain_git_am_tree(drifted, path, tmp_path / "plain", "--3way", objects=store_env / "upstreams.git")
    assert plain == (0, patched_tree(project))


def test_bump_marks_a_crlf_mail_with_its_file_before_the_diff(project, make_patch, upstream_dir):
    """bump re-applies each patch with a Patch-File trailer; a CRLF mail must get it in its message."""
    from vllm_overlay import bump

    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    lf = bump.with_patch_file_trailer(series.load_patch(project / "patches", "demo/core-change-line-20.patch"))
    to_crlf(path)
    crlf = bump.with_patch_file_trailer(series.load_patch(project / "patches", "demo/core-change-line-20.patch"))
    assert crlf == lf
    head, sep, diff = crlf.decode().partition("\n---\n")
    assert sep and head.endswith(f"\n{patched_repo.PATCH_FILE_TRAILER}: demo/core-change-line-20.patch")
    assert "diff --git a/vllm/core.py b/vllm/core.py" in diff
