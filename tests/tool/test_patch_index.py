"""README's patch index: written from the patches' trailers, and lint-patches names every stale row."""

from __future__ import annotations

from pathlib import Path

from tests.tool.helpers.repos import FORWARDED, REPO_ROOT, change_line_20
from vllm_overlay import cli, lint, patch_index, series

BUG = "https://github.com/vllm-project/vllm/issues/2"
README_TEXT = f"# demo\n\nThe patches:\n\n{patch_index.BEGIN}\n{patch_index.END}\n\nMore text.\n"


def _loaded(patches_dir: Path) -> list[series.Patch]:
    patches = series.load_series(patches_dir)
    series.parse_all_trailers(patches)
    return patches


def _indexed_project(project: Path, make_patch, upstream_dir: Path) -> Path:
    """The project with one patch and a README whose index lint-patches --write-readme-index wrote."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    readme = project / "README.md"
    readme.write_text(README_TEXT)
    assert cli.main(["lint-patches", "--project", str(project), "--write-readme-index"]) == 0
    return readme


def test_the_readme_index_matches_the_real_patches():
    assert patch_index.problems(REPO_ROOT / "README.md", _loaded(REPO_ROOT / "patches")) == []


def test_the_real_readme_has_one_row_per_patch_in_series_order():
    patches = _loaded(REPO_ROOT / "patches")
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    rows = lines[lines.index(patch_index.BEGIN) + 3 : lines.index(patch_index.END)]
    assert [row.split("`")[1] for row in rows] == [patch.name.removesuffix(".patch") for patch in patches]


def test_write_fills_the_index_from_the_trailers_and_leaves_the_rest(project, make_patch, upstream_dir):
    readme = _indexed_project(project, make_patch, upstream_dir)
    text = readme.read_text()
    assert text.startswith("# demo\n\nThe patches:\n\n") and text.endswith(f"{patch_index.END}\n\nMore text.\n")
    assert (
        "| `demo/core-change-line-20` | core: change line 20 | not forwarded: a test patch | the test ends |"
    ) in text.splitlines()
    assert lint.lint(project, project / "patches") == []


def test_a_second_write_changes_nothing(project, make_patch, upstream_dir, capsys):
    readme = _indexed_project(project, make_patch, upstream_dir)
    before = readme.read_bytes()
    assert cli.main(["lint-patches", "--project", str(project), "--write-readme-index"]) == 0
    assert readme.read_bytes() == before
    assert "README.md: patch index already up to date (1 patches)" in capsys.readouterr().err


def test_an_edited_row_fails_lint_naming_the_line(project, make_patch, upstream_dir, capsys):
    readme = _indexed_project(project, make_patch, upstream_dir)
    lines = readme.read_text().splitlines()
    number = next(n for n, line in enumerate(lines, start=1) if line.startswith("| `demo/"))
    edited = lines[number - 1].replace("the test ends", "never")
    lines[number - 1] = edited
    readme.write_text("\n".join(lines) + "\n")
    found = lint.lint(project, project / "patches")
    assert len(found) == 1
    assert found[0].startswith(f"README.md:{number}: patch index row {edited!r} is stale; the patches say ")
    assert "scripts/lint-patches --write-readme-index rewrites it" in found[0]
    assert cli.main(["lint-patches", "--project", str(project)]) == 1
    assert f"README.md:{number}:" in capsys.readouterr().out


def test_a_changed_trailer_makes_the_row_stale(project, make_patch, upstream_dir):
    readme = _indexed_project(project, make_patch, upstream_dir)
    patch = project / "patches" / "demo" / "core-change-line-20.patch"
    patch.write_text(patch.read_text().replace(FORWARDED, "Forwarded: https://github.com/vllm-project/vllm/pull/1"))
    found = lint.lint(project, project / "patches")
    assert len(found) == 1 and "forwarded: https://github.com/vllm-project/vllm/pull/1" in found[0], found
    assert cli.main(["lint-patches", "--project", str(project), "--write-readme-index"]) == 0
    assert "| upstream releases https://github.com/vllm-project/vllm/pull/1 |" in readme.read_text()


def test_a_new_patch_without_a_row_and_a_row_without_a_patch_are_named(project, make_patch, upstream_dir):
    readme = _indexed_project(project, make_patch, upstream_dir)
    make_patch(upstream_dir, lambda tree: (tree / "vllm" / "new.py").write_text("x = 1\n"), "core: add new")
    end = readme.read_text().splitlines().index(patch_index.END) + 1
    found = lint.lint(project, project / "patches")
    assert len(found) == 1
    assert found[0].startswith(f"README.md:{end}: patch index lacks the row '| `demo/core-add-new` |")
    text = readme.read_text().replace(f"{patch_index.END}\n", f"| `demo/gone` | x | y | z |\n{patch_index.END}\n")
    readme.write_text(text)
    assert cli.main(["lint-patches", "--project", str(project), "--write-readme-index"]) == 0
    assert "gone" not in readme.read_text() and lint.lint(project, project / "patches") == []


def test_a_readme_without_the_markers_is_reported_and_not_written(project, make_patch, upstream_dir, capsys):
    readme = _indexed_project(project, make_patch, upstream_dir)
    readme.write_text("# demo\n")
    assert lint.lint(project, project / "patches") == [
        f"README.md: no patch index (the lines {patch_index.BEGIN!r} ... {patch_index.END!r}); "
        "scripts/lint-patches --write-readme-index rewrites it after adding them"
    ]
    assert cli.main(["lint-patches", "--project", str(project), "--write-readme-index"]) == 2
    assert "no patch index markers" in capsys.readouterr().err
    assert readme.read_text() == "# demo\n"


def test_bug_applied_upstream_and_pipes_are_rendered(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(
        path.read_text()
        .replace("Description: core: change line 20", "Description: keep a | out of the table")
        .replace(FORWARDED, f"{FORWARDED}\nBug: {BUG}\nApplied-Upstream: 0.34.0")
    )
    row = patch_index.index_lines(_loaded(project / "patches"))[2]
    assert row == (
        "| `demo/core-change-line-20` | keep a \\| out of the table "
        f"| not forwarded: a test patch; bug: {BUG} "
        "| applied upstream in 0.34.0: drop on moving there |"
    )


def test_a_carried_series_is_not_checked_against_the_readme(project, make_patch, upstream_dir):
    """README indexes the project's own series: linting another folder of patches (cpu/patches) skips it."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    (project / "README.md").write_text(README_TEXT)
    carried = project / "cpu" / "patches"
    carried.parent.mkdir()
    (project / "patches").rename(carried)
    assert lint.lint(project, carried) == []
