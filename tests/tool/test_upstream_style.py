"""upstream_style: the series' files against upstream's own ruff configuration, pristine beside patched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tool.helpers.repos import git
from vllm_overlay import upstream_style
from vllm_overlay.cli import main

# A configuration of upstream's shape: its own rule selection, narrower lines than the tool's.
UPSTREAM_PYPROJECT = """\
[tool.ruff]
line-length = 88

[tool.ruff.lint]
select = ["E", "F", "I", "ISC", "INP"]
"""
# Already has a finding (F401) and is formatted: the series is not to blame for the first.
PRISTINE_CORE = "import os\n\n\ndef value() -> int:\n    return 1\n"


def _tree(tmp_path: Path, core: str = PRISTINE_CORE) -> Path:
    tree = tmp_path / "patched"
    (tree / "vllm" / "sub").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(UPSTREAM_PYPROJECT)
    (tree / "vllm" / "__init__.py").write_text("")
    (tree / "vllm" / "sub" / "__init__.py").write_text("")
    (tree / "vllm" / "core.py").write_text(core)
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "upstream")
    base = git(tree, "rev-parse", "HEAD").strip()
    git(tree, "config", "vllm-overlay.upstream", base)
    return tree


def _commit(tree: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tree / name).write_text(text)
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "patch")


def _base(tree: Path) -> str:
    return git(tree, "config", "vllm-overlay.upstream").strip()


def test_a_clean_patch_adds_nothing_even_where_pristine_has_findings(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _commit(tree, {"vllm/core.py": PRISTINE_CORE + "\n\ndef other() -> int:\n    return 2\n"})
    report = upstream_style.check(tree, _base(tree))
    assert report.files == ("vllm/core.py",)
    assert report.pristine_findings == 1 and report.patched_findings == 1  # the pristine F401, moved nowhere
    assert report.ok


def test_a_new_finding_and_a_new_file_in_a_package_are_reported(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    too_long = "x = " + " + ".join(["1"] * 40) + "\n"
    _commit(tree, {"vllm/core.py": "import sys\n" + PRISTINE_CORE, "vllm/sub/new.py": too_long})
    report = upstream_style.check(tree, _base(tree))
    codes = sorted((finding.path, finding.code) for finding in report.new_findings)
    # The new module sits in a real package (its __init__.py is laid out), so INP001 is not raised.
    assert codes == [("vllm/core.py", "F401"), ("vllm/core.py", "I001"), ("vllm/sub/new.py", "E501")]
    assert not report.ok


def test_a_file_the_patch_leaves_unformatted_is_reported(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _commit(tree, {"vllm/core.py": PRISTINE_CORE + "y=1\n"})
    report = upstream_style.check(tree, _base(tree))
    assert report.newly_unformatted == ("vllm/core.py",)
    assert not report.ok


def test_lint_patches_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _tree(tmp_path)
    project_root = Path(__file__).resolve().parents[2]
    clean = main(["lint-patches", "--project", str(project_root), "--upstream-style", str(tree)])
    _commit(tree, {"vllm/core.py": PRISTINE_CORE + "y=1\n"})
    dirty = main(["lint-patches", "--project", str(project_root), "--upstream-style", str(tree)])
    missing = main(["lint-patches", "--project", str(project_root), "--upstream-style", str(tmp_path / "nowhere")])
    out = capsys.readouterr()
    assert (clean, dirty, missing) == (0, 1, 2)
    assert "vllm/core.py: not formatted" in out.out
    assert "not a git repository" in out.err or "nowhere" in out.err


def test_in_place_judges_imports_by_the_whole_tree_as_upstream_does(tmp_path: Path) -> None:
    # A new test file that imports a top-level package of the tree beside its third-party import:
    # in the whole tree `helpers` is first-party (its own block); in check's scratch copy, which
    # lacks it, isort takes it for third-party and wants one block.
    tree = _tree(tmp_path)
    (tree / "helpers").mkdir()
    (tree / "helpers" / "__init__.py").write_text("VALUE = 1\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "upstream helpers")
    git(tree, "config", "vllm-overlay.upstream", git(tree, "rev-parse", "HEAD").strip())
    (tree / "vllm" / "sub" / "test_new.py").parent.mkdir(exist_ok=True)
    _commit(tree, {"vllm/sub/test_new.py": "import pytest\n\nimport helpers\n\nassert pytest and helpers.VALUE\n"})
    scratch = upstream_style.check(tree, _base(tree))
    assert [(f.path, f.code) for f in scratch.new_findings] == [("vllm/sub/test_new.py", "I001")]
    in_place = upstream_style.check_in_place(tree, _base(tree))
    assert in_place.ok and in_place.files == ("vllm/sub/test_new.py",)
    assert "upstream-style-" not in git(tree, "worktree", "list")  # the pristine checkout is gone again
