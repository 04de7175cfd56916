"""carry: the carried series' layout, its record of what it was carried from, what it may touch, range-diff.

test_cpu_runtime.py proves the project's own carry (its lock, lint, runtime-only files, staleness);
these drive carry's functions on small hand-made series and trees.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT, PatchMaker, change_line_20, git, replace_line, write_upstream
from vllm_overlay import series
from vllm_overlay.apply import patched_repo
from vllm_overlay.cpu import carry
from vllm_overlay.cpu import runtime as cpu_runtime


def test_carry_project_keeps_its_lock_patches_and_build_under_cpu(tmp_path: Path) -> None:
    proj = carry.CarryProject(tmp_path)
    assert proj.lock_file == tmp_path / "cpu" / "upstream.lock"
    assert proj.patches == tmp_path / "cpu" / "patches"
    assert proj.build == tmp_path / "build" / "cpu"
    assert proj.patched_tree == tmp_path / "build" / "cpu" / "patched"  # the Project property, on the carry's build
    assert proj.runtime_lock == tmp_path / "cpu" / "runtime.lock"
    assert proj.overlay == tmp_path / "overlay"  # one overlay for both series


def test_recorded_source_is_the_first_word_of_carried_from(tmp_path: Path) -> None:
    proj = carry.CarryProject(tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / carry.CARRIED_FROM).write_text("ab12cd  carried on 2026-11-29\nmore lines\n")
    assert carry.recorded_source(proj) == "ab12cd"
    (tmp_path / "cpu" / carry.CARRIED_FROM).write_text("\n")
    with pytest.raises(carry.CarryError, match=r"cpu/carried-from: missing: the carry does not say"):
        carry.recorded_source(proj)


def test_series_digest_follows_the_patch_bytes(project: Path, upstream_dir: Path, make_patch: PatchMaker) -> None:
    path = make_patch(upstream_dir, change_line_20, "Change line 20")
    first = carry.series_digest(project / "patches")
    assert len(first) == 64 and first == carry.series_digest(project / "patches")
    path.write_bytes(path.read_bytes().replace(b"The change.", b"The changes.", 1))
    assert carry.series_digest(project / "patches") != first


def test_runtime_only_problems_see_added_and_deleted_files(
    project: Path, upstream_dir: Path, make_patch: PatchMaker
) -> None:
    make_patch(upstream_dir, lambda root: (root / "vllm" / "_cpu_build.py").write_text("BUILD = 1\n"), "Add a file")
    make_patch(upstream_dir, lambda root: (root / "vllm" / "_version.py").unlink(), "Delete a file")
    make_patch(upstream_dir, change_line_20, "Change line 20")
    patches = series.load_series(project / "patches")
    runtime = dataclasses.replace(
        cpu_runtime.load(REPO_ROOT / "cpu" / "runtime.lock"), runtime_only=("vllm/_cpu_build.py", "vllm/_version.py")
    )
    assert carry.runtime_only_problems(patches, runtime) == [
        f"demo/add-a-file.patch changes vllm/_cpu_build.py, which the {runtime.project} wheel ships its own of",
        f"demo/delete-a-file.patch changes vllm/_version.py, which the {runtime.project} wheel ships its own of",
    ]
    assert carry.runtime_only_problems(patches, dataclasses.replace(runtime, runtime_only=())) == []


def _patched_tree(root: Path, base_edit, edits) -> Path:
    """A tree as apply-patches leaves it: an upstream commit (its id in the git config) and patch commits."""
    write_upstream(root)
    base_edit(root)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "upstream")
    git(root, "config", patched_repo.CONFIG_UPSTREAM, git(root, "rev-parse", "HEAD").strip())
    for subject, edit in edits:
        edit(root)
        git(root, "commit", "-qam", subject)
    return root


def test_range_diff_pairs_the_series_with_its_carry(tmp_path: Path) -> None:
    def change_line_5(root: Path) -> None:
        replace_line(root / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n")

    def change_line_5_differently(root: Path) -> None:
        replace_line(root / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 55\n")

    def older_release(root: Path) -> None:
        replace_line(root / "vllm" / "core.py", "line_40 = 40\n", "line_40 = 39\n")

    main = _patched_tree(
        tmp_path / "main", lambda root: None, [("Change 20", change_line_20), ("Change 5", change_line_5)]
    )
    carried = _patched_tree(
        tmp_path / "carried", older_release, [("Change 20", change_line_20), ("Change 5", change_line_5_differently)]
    )
    lines = carry.range_diff(main, carried).splitlines()
    assert len([line for line in lines if line[:1].isdigit()]) == 2
    assert lines[0].startswith("1:  ") and " = 1:  " in lines[0] and lines[0].endswith(" Change 20")
    assert lines[1].startswith("2:  ") and " ! 2:  " in lines[1] and lines[1].endswith(" Change 5")
    assert "line_5 = 55" in "\n".join(lines)
    assert git(main, "rev-parse", "refs/vllm-overlay/carried") == git(carried, "rev-parse", "HEAD")
