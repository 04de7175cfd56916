"""lint-patches' command module: its flags, the lint call they make, and the upstream-style step.

lint.lint is cheap and runs for real on a fixture project; the upstream-style check runs ruff over
a pristine and a patched tree, so where only the command's choice of tree is asserted the module's
own _upstream_style step is stood in for (a module global, looked up when run calls it).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from tests.tool.helpers.repos import change_line_20
from vllm_overlay import cli, lint
from vllm_overlay.commands import lint_patches

OPTIONS = ("--project", "--tree", "--upstream-style")


@pytest.fixture
def recorded_lint(monkeypatch):
    """lint.lint replaced by a recorder returning ``recorded_lint.problems``."""

    recorder = SimpleNamespace(calls=[], problems=[])

    def fake_lint(root, patches, tree=None):
        recorder.calls.append((root, patches, tree))
        return recorder.problems

    monkeypatch.setattr(lint, "lint", fake_lint)
    return recorder


@pytest.fixture
def styled(monkeypatch):
    """The module's upstream-style step replaced by a recorder of the tree it was given (exit 0)."""
    trees: list[Path] = []
    monkeypatch.setattr(lint_patches, "_upstream_style", lambda tree: trees.append(tree) or 0)
    return trees


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("lint-patches", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "[--upstream-style [TREE]]" in text
    assert "Exit codes: 0 clean; 1 problems found; 2 the upstream-style check cannot run." in text


def test_a_clean_series_is_exit_0(project, make_patch, upstream_dir, capsys):
    """The real lint over a one-patch series made the way the project makes them."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert cli.main(["lint-patches", "--project", str(project)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "patches/: no problems\n"


def test_the_real_lint_names_an_empty_series(project, capsys):
    assert cli.main(["lint-patches", "--project", str(project)]) == 1
    captured = capsys.readouterr()
    assert "series is empty" in captured.out
    assert captured.err.endswith("problem(s) in patches/\n")


def test_project_and_tree_reach_the_lint_call(project, recorded_lint, tmp_path):
    assert cli.main(["lint-patches", "--project", str(project), "--tree", str(tmp_path / "up")]) == 0
    assert cli.main(["lint-patches", "--project", str(project)]) == 0
    root = project.resolve()
    assert recorded_lint.calls == [(root, root / "patches", tmp_path / "up"), (root, root / "patches", None)]


def test_each_problem_is_a_stdout_line_and_the_count_one_error_line(project, recorded_lint, styled, capsys):
    recorded_lint.problems = ["a.patch: no Description", "b.patch: not in series"]
    assert cli.main(["lint-patches", "--project", str(project), "--upstream-style"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "a.patch: no Description\nb.patch: not in series\n"
    assert captured.err == "error: 2 problem(s) in patches/\n"
    assert styled == []  # the style check waits for a clean series


def test_upstream_style_without_a_tree_checks_build_patched(project, recorded_lint, styled):
    assert cli.main(["lint-patches", "--project", str(project), "--upstream-style"]) == 0
    assert styled == [project.resolve() / "build" / "patched"]


def test_upstream_style_of_the_current_directory_checks_it(project, recorded_lint, styled):
    # "." given on purpose must not read as "no TREE" (build/patched).
    assert cli.main(["lint-patches", "--project", str(project), "--upstream-style", "."]) == 0
    assert styled == [Path(".")]


def test_upstream_style_with_a_tree_checks_that_tree(project, recorded_lint, styled, tmp_path):
    assert cli.main(["lint-patches", "--project", str(project), "--upstream-style", str(tmp_path / "mine")]) == 0
    assert styled == [tmp_path / "mine"]


@pytest.mark.parametrize("code", [1, 2])
def test_the_style_steps_code_is_the_exit_code(project, recorded_lint, monkeypatch, code):
    monkeypatch.setattr(lint_patches, "_upstream_style", lambda tree: code)
    assert cli.main(["lint-patches", "--project", str(project), "--upstream-style"]) == code
    assert cli.main(["lint-patches", "--project", str(project)]) == 0  # not asked for: not run


def test_upstream_style_on_a_tree_that_is_no_repository_is_exit_2(project, recorded_lint, tmp_path, capsys):
    """The real step: a tree without git (here absent) cannot be compared, in one error line."""
    target = tmp_path / "absent"
    assert cli.main(["lint-patches", "--project", str(project), "--upstream-style", str(target)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "patches/: no problems"
    assert len(err) == 2 and err[1].startswith("error: upstream style: ") and str(target) in err[1]
