"""README's two commands: read from README.md itself (what scripts/ci-readme runs), and what CI calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tool.conftest import REPO_ROOT
from vllm_overlay import readme_ci


def test_the_two_commands_are_read_from_the_readme():
    first, second = readme_ci.readme_commands(REPO_ROOT / "README.md")
    assert first.endswith("scripts/apply-patches") and "#" not in first
    assert second == "scripts/check"


def test_ci_runs_the_readmes_test_command():
    """.ci/run ends by exec'ing README command 2, word for word."""
    _, second = readme_ci.readme_commands(REPO_ROOT / "README.md")
    lines = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert lines[-1] == f"exec {second}"


def test_command_one_sets_up_its_own_environment():
    """On a PEP 668 system a bare pip install fails: command 1 must go through scripts/setup first."""
    first, _ = readme_ci.readme_commands(REPO_ROOT / "README.md")
    assert first.startswith("scripts/setup && ")
    assert (REPO_ROOT / "scripts" / "setup").stat().st_mode & 0o111


def _readme(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text("# x\n\nintro\n\n## The two commands\n\n" + body + "\n## Next\n\n    not a command\n")
    return path


def test_comments_are_dropped_and_the_block_ends_at_a_blank_line(tmp_path):
    path = _readme(tmp_path, "On a machine:\n\n    a && b      # the main job\n    c   # tests\n\n    later\n")
    assert readme_ci.readme_commands(path) == ("a && b", "c")


@pytest.mark.parametrize(
    "body",
    ["no block at all\n", "    only one\n", "    one\n    two\n    three\n"],
    ids=["none", "one", "three"],
)
def test_a_section_without_exactly_two_commands_is_refused(tmp_path, body):
    with pytest.raises(readme_ci.ReadmeError):
        readme_ci.readme_commands(_readme(tmp_path, body))


def test_no_section_is_refused(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("# x\n\n    a\n    b\n")
    with pytest.raises(readme_ci.ReadmeError, match="no '## The two commands' section"):
        readme_ci.readme_commands(path)
