"""classify: every status a patch can have against a tree, decided by git, with the tree left as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import git as gitpython
import pytest

from tests.tool.helpers.repos import PatchMaker, change_line_20, git, replace_line, write_upstream
from vllm_overlay import series
from vllm_overlay.apply import classify
from vllm_overlay.apply.classify import HunkNote, PatchResult, Status


def _tree(root: Path, edit: Callable[[Path], None] | None = None, *, keep_pristine: bool = True) -> gitpython.Repo:
    """A git tree of the upstream; ``edit`` committed on top (or, without ``keep_pristine``, as its only commit)."""
    write_upstream(root)
    git(root, "init", "-q", "-b", "main")
    if edit is not None and not keep_pristine:
        edit(root)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "upstream")
    if edit is not None and keep_pristine:
        edit(root)
        git(root, "add", "-A")
        git(root, "commit", "-qm", "moved on")
    return gitpython.Repo(root)


def _classify(repo: gitpython.Repo, patch_file: Path, project: Path) -> PatchResult:
    patch = series.load_patch(project / "patches", patch_file.relative_to(project / "patches").as_posix())
    head = repo.head.commit.hexsha
    result = classify.classify(repo, patch, patch_file)
    # "changing nothing": the same commit, no staged or untracked change, no git am in progress.
    assert repo.head.commit.hexsha == head
    assert git(Path(repo.working_tree_dir), "status", "--porcelain", "--untracked-files=all") == ""
    assert not (Path(repo.git_dir) / "rebase-apply").exists()
    return result


@pytest.fixture
def line_20_patch(upstream_dir: Path, make_patch: PatchMaker) -> Path:
    return make_patch(upstream_dir, change_line_20, "Change line 20")


def test_clean_on_the_tree_it_was_made_on(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    result = _classify(_tree(tmp_path / "t"), line_20_patch, project)
    assert result.status is Status.CLEAN
    assert result.hunks == [] and result.accepted is False
    assert (result.name, result.series, result.subject) == ("demo/change-line-20.patch", "demo", "Change line 20")


def test_offset_names_the_hunk_and_its_shift(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    def five_lines_on_top(root: Path) -> None:
        core = root / "vllm" / "core.py"
        core.write_text("".join(f"head_{i} = {i}\n" for i in range(5)) + core.read_text())

    result = _classify(_tree(tmp_path / "t", five_lines_on_top), line_20_patch, project)
    assert result.status is Status.OFFSET
    assert [(h.file, h.hunk, h.recorded_line, h.note) for h in result.hunks] == [("vllm/core.py", 1, 17, "offset +5")]
    assert str(result.hunks[0]) == "vllm/core.py hunk #1 (line 17): offset +5"


def test_already_upstream_when_the_patch_reverse_applies(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    result = _classify(_tree(tmp_path / "t", change_line_20), line_20_patch, project)
    assert result.status is Status.ALREADY_UPSTREAM
    assert "reverse-applies" in result.detail


def test_target_missing_names_the_file(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    result = _classify(_tree(tmp_path / "t", lambda root: (root / "vllm" / "core.py").unlink()), line_20_patch, project)
    assert result.status is Status.TARGET_MISSING
    assert [(h.file, h.note) for h in result.hunks] == [("vllm/core.py", "file does not exist upstream")]


def test_merged_3way_when_a_context_line_changed(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    repo = _tree(
        tmp_path / "t", lambda root: replace_line(root / "vllm" / "core.py", "line_18 = 18\n", "line_18 = 1800\n")
    )
    result = _classify(repo, line_20_patch, project)
    assert result.status is Status.MERGED_3WAY
    assert [(h.file, h.hunk, h.note) for h in result.hunks] == [("vllm/core.py", 1, "does not apply")]
    assert (tmp_path / "t" / "vllm" / "core.py").read_text().count("line_20 = 20\n") == 1  # the trial was undone


def test_fuzz_when_no_3way_is_possible(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    # The tree never held the blob the patch was made on, so git cannot merge: only reduced context works.
    def context_changed(root: Path) -> None:
        replace_line(root / "vllm" / "core.py", "line_18 = 18\n", "line_18 = 1800\n")

    result = _classify(_tree(tmp_path / "t", context_changed, keep_pristine=False), line_20_patch, project)
    assert result.status is Status.FUZZ
    assert len(result.hunks) == 1 and result.hunks[0].note.startswith("fuzz: context reduced to")


def test_conflict_when_the_changed_line_itself_differs(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    repo = _tree(
        tmp_path / "t", lambda root: replace_line(root / "vllm" / "core.py", "line_20 = 20\n", "line_20 = -1\n")
    )
    result = _classify(repo, line_20_patch, project)
    assert result.status is Status.CONFLICT
    assert result.detail == "patch failed at vllm/core.py:17"
    assert [(h.file, h.hunk, h.recorded_line) for h in result.hunks] == [("vllm/core.py", 1, 17)]


def test_a_given_check_is_used_instead_of_running_git_again(tmp_path: Path, project: Path, line_20_patch: Path) -> None:
    repo = _tree(tmp_path / "t")
    patch = series.load_patch(project / "patches", "demo/change-line-20.patch")
    status, err = classify.apply_check(repo, line_20_patch)
    assert status == 0 and "Checking patch vllm/core.py..." in err
    # A failed check handed in is believed: the patch is then judged as git would judge a failure.
    result = classify.classify(repo, patch, line_20_patch, check=(1, "error: patch failed: vllm/core.py:17\n"))
    assert result.status is Status.MERGED_3WAY  # the real 3-way trial succeeds on its own tree
    assert result.hunks == []  # every hunk applies on its own


def test_result_json_carries_the_status_as_its_word() -> None:
    result = PatchResult("s/a.patch", "s", "A", Status.MERGED_3WAY, True, [HunkNote("f.py", 2, 9, "does not apply")])
    data = result.to_json()
    assert data["status"] == "merged-3way" and type(data["status"]) is str
    assert data["hunks"] == [{"file": "f.py", "hunk": 2, "recorded_line": 9, "note": "does not apply"}]
    assert data["accepted"] is True and data["commit"] is None and data["warnings"] == []
