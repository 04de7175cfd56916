"""README's two commands: read from README.md itself (what scripts/ci-readme runs), and what CI calls."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
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


def _check_checkout(tmp_path: Path, setup_body: str) -> Path:
    """A scratch checkout holding the real scripts/check and a scripts/setup that records it ran."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "scripts" / "check", root / "scripts" / "check")
    setup = root / "scripts" / "setup"
    setup.write_text(f"#!/bin/sh\ntouch {root / 'setup-ran'}\n{setup_body}\n")
    setup.chmod(0o755)
    return root


def _path_without_buildah(tmp_path: Path) -> str:
    """A PATH holding only what scripts/check's own lines call: no buildah, no debootstrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "awk", "dirname", "touch", "sh"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _run_check(root: Path, path: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("bash") or "bash", str(root / "scripts" / "check"), *args],
        capture_output=True,
        text=True,
        env={"PATH": path, **env},
        timeout=60,
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_check_help_prints_its_header_and_runs_nothing(tmp_path, flag):
    root = _check_checkout(tmp_path, "exit 0")
    result = _run_check(root, _path_without_buildah(tmp_path), flag)
    assert result.returncode == 0, result.stderr
    assert "Usage: scripts/check" in result.stdout and "--skip-images" in result.stdout
    assert "set -euo" not in result.stdout
    assert not (root / "setup-ran").exists()


def test_check_without_the_image_tools_stops_at_once_unless_told_to_skip(tmp_path):
    root = _check_checkout(tmp_path, "exit 0")
    result = _run_check(root, _path_without_buildah(tmp_path))
    assert result.returncode == 2
    assert "--skip-images" in result.stderr and "buildah" in result.stderr
    assert not (root / "setup-ran").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_check_skip_images_runs_the_steps_and_times_each(tmp_path, how):
    """With the skip asked for, the steps run; a failing one ends the run with its exit code, timed and named."""
    root = _check_checkout(tmp_path, "exit 7")
    args, env = (["--skip-images"], {}) if how == "flag" else ([], {"VLLM_OVERLAY_SKIP_IMAGES": "1"})
    result = _run_check(root, _path_without_buildah(tmp_path), *args, **env)
    assert result.returncode == 7
    assert (root / "setup-ran").exists()
    assert "scripts/check: " in result.stderr and " s in all" in result.stderr
    summary = result.stderr.split(" s in all", 1)[1]
    assert "FAILED   install the tool" in summary
