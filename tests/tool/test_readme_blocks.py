"""README's workflow blocks as ci-readme reads, runs and judges them (no container: the pieces it uses)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import readme_blocks
from vllm_overlay.readme_blocks import DROP_SECTION, FORWARD_SECTION, ReadmeError


def _readme(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(f"# x\n\n## Workflows\n\n{FORWARD_SECTION}\n\n{body}\n### Next\n\n    not this block\n")
    return path


def test_the_readmes_blocks_are_read_and_name_a_real_patch():
    forward = readme_blocks.workflow_commands(REPO_ROOT / "README.md", FORWARD_SECTION)
    drop = readme_blocks.workflow_commands(REPO_ROOT / "README.md", DROP_SECTION)
    _, spec = readme_blocks.forward_spec(forward)
    series = (REPO_ROOT / "patches" / "series").read_text(encoding="utf-8").splitlines()
    assert f"{spec}.patch" in series
    series_name, stem = spec.split("/")
    assert (REPO_ROOT / "tests" / "patches" / series_name / "upstream" / stem).is_dir()  # its ported test
    assert any(line.startswith(f"git -C build/forward/{stem} ") for line in forward)
    commands = [readme_blocks.strip_comment(line) for line in drop]
    assert commands[0].startswith("scripts/audit-upstream --upstream ")
    release = commands[0].split()[2]
    assert commands[1] == f"scripts/bump {release} --drop"


def test_a_readme_without_the_section_is_refused(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("# x\n\n## The two commands\n\n    a\n    b\n")
    with pytest.raises(ReadmeError, match=f"no '{FORWARD_SECTION}' section"):
        readme_blocks.workflow_commands(path, FORWARD_SECTION)


@pytest.mark.parametrize("body", ["Prose only.\n", "    # a comment, no command\n"], ids=["prose", "comment"])
def test_a_section_without_a_command_is_refused(tmp_path, body):
    """The block of the next section is not this one's."""
    with pytest.raises(ReadmeError, match="holds no block of commands"):
        readme_blocks.workflow_commands(_readme(tmp_path, body), FORWARD_SECTION)


@pytest.mark.parametrize(
    "line",
    ["scripts/forward <series>/<patch>", "git reset --hard <commit of patch k-1>", "cd build/forward/<patch> && ls"],
)
def test_a_placeholder_is_refused(tmp_path, line):
    with pytest.raises(ReadmeError, match="has a placeholder"):
        readme_blocks.workflow_commands(_readme(tmp_path, f"    ls\n    {line}\n"), FORWARD_SECTION)


def test_a_redirection_or_a_placeholder_in_a_comment_is_not_one(tmp_path):
    body = "    sort <in.txt >out.txt\n    git push   # to your fork's <branch>\n"
    assert readme_blocks.workflow_commands(_readme(tmp_path, body), FORWARD_SECTION) == [
        "sort <in.txt >out.txt",
        "git push   # to your fork's <branch>",
    ]


def test_a_continued_line_is_refused(tmp_path):
    with pytest.raises(ReadmeError, match="continues a line"):
        readme_blocks.workflow_commands(_readme(tmp_path, "    ls \\\n      -l\n"), FORWARD_SECTION)


def _run_script(tmp_path: Path, block: list[str]) -> tuple[subprocess.CompletedProcess, list[int]]:
    status = tmp_path / "status"
    script = readme_blocks.block_script(block, str(status))
    done = subprocess.run(
        [shutil.which("bash") or "bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    return done, [int(word) for word in status.read_text().split()]


def test_the_block_runs_as_pasted_into_one_shell_each_exit_recorded(tmp_path):
    """A failing line does not stop the next; a cd carries over; a comment line records nothing."""
    (tmp_path / "sub").mkdir()
    block = ["# first, fail", "false   # exit 1", "cd sub", "pwd", "sh -c 'exit 3'"]
    done, statuses = _run_script(tmp_path, block)
    assert statuses == [1, 0, 0, 3]
    assert done.stdout.strip() == str(tmp_path / "sub")
    assert readme_blocks.block_script(block, "/s").count('echo "$?"') == 4


def test_exit_failures_expect_the_audit_to_exit_1_and_every_other_command_0():
    block = ["scripts/audit-upstream --upstream 0.34.0   # rows", "# note", "scripts/bump 0.34.0 --drop", "ls"]
    assert readme_blocks.exit_failures("drop", block, [1, 0, 0]) == []
    failures = readme_blocks.exit_failures("drop", block, [0, 2])
    assert failures == [
        "drop: `scripts/audit-upstream --upstream 0.34.0` exited 0, expected 1 (output above)",
        "drop: `scripts/bump 0.34.0 --drop` exited 2, expected 0 (output above)",
        "drop: `ls` did not run (the block ended before it)",
    ]


def test_forward_spec_is_the_forward_commands_patch():
    block = ["# the branch", "scripts/forward --skip-test-run a-series/a-patch.patch   # go", "cat x"]
    assert readme_blocks.forward_spec(block) == (
        "scripts/forward --skip-test-run a-series/a-patch.patch",
        "a-series/a-patch.patch",
    )
    assert readme_blocks.forward_stem("a-series/a-patch.patch") == "a-patch"
    with pytest.raises(ReadmeError, match="runs no `scripts/forward SERIES/PATCH`"):
        readme_blocks.forward_spec(["scripts/forward --help", "ls"])


SIGNOFF = "Signed-off-by: New Comer <newcomer@example.org>"


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    env |= {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _forwarded(tmp_path: Path, *, messages: tuple[str, ...] = (f"[Bugfix] fix\n\n{SIGNOFF}",), pr: bool = True) -> str:
    """A clone holding build/forward/a-patch: the release's commit, then ``messages``; its upstream tree id."""
    tree = tmp_path / "build" / "forward" / "a-patch"
    tree.mkdir(parents=True)
    _git(tree, "init", "-q", "-b", "forward/a-patch")
    (tree / "f.py").write_text("release\n")
    _git(tree, "add", "f.py")
    _git(tree, "commit", "-q", "-m", "upstream: vllm-0.33.0.tar.gz")
    upstream = _git(tree, "log", "-1", "--format=%T").strip()
    for number, message in enumerate(messages):
        (tree / "f.py").write_text(f"fixed {number}\n")
        _git(tree, "commit", "-q", "-a", "-m", message)
    if pr:
        (tmp_path / "build" / "forward" / "a-patch.pr.md").write_text("# [Bugfix] fix\n")
    return upstream


def _forward_failures(tmp_path: Path, upstream: str) -> list[str]:
    return readme_blocks.forward_failures(
        "a-series/a-patch",
        upstream,
        SIGNOFF,
        lambda argv: _git(tmp_path, *argv[1:]),
        lambda path: (tmp_path / path).exists(),
    )


def test_a_forward_that_kept_its_promises_has_no_failure(tmp_path):
    assert _forward_failures(tmp_path, _forwarded(tmp_path)) == []


def test_a_forward_without_the_users_signoff_one_commit_or_pr_body_fails(tmp_path):
    upstream = _forwarded(tmp_path, messages=("[Bugfix] fix", "more"), pr=False)
    failures = _forward_failures(tmp_path, upstream)
    assert len(failures) == 3
    assert "3 commit(s)" in failures[0] and "one commit over the release" in failures[0]
    assert f"not {SIGNOFF!r}" in failures[1]
    assert failures[2] == "forward: no build/forward/a-patch.pr.md"


def test_a_forward_on_another_branch_or_release_fails(tmp_path):
    upstream = _forwarded(tmp_path)
    _git(tmp_path / "build" / "forward" / "a-patch", "checkout", "-q", "-b", "other")
    failures = _forward_failures(tmp_path, "0" * 40)
    assert failures[0] == "forward: build/forward/a-patch is on 'other', not forward/a-patch"
    assert "expected one commit over the release (tree 000000000000)" in failures[1]
    assert upstream not in failures[1]


def test_no_forward_tree_is_one_failure(tmp_path):
    assert _forward_failures(tmp_path, "0" * 40) == ["forward: no build/forward/a-patch after the block"]


AUDIT = "| p | refresh |\n\nTotals: keep 0, refresh 11, drop 0, resolve 4\n"
BUMP = "nothing to drop: no patch is upstream on every carried line\nnothing changed\n"


def test_a_drop_block_that_dropped_nothing_and_changed_nothing_has_no_failure():
    assert readme_blocks.drop_failures(AUDIT + BUMP, "?? x\n", "?? x\n") == []


def test_a_drop_found_or_a_changed_clone_fails():
    failures = readme_blocks.drop_failures(AUDIT.replace("drop 0", "drop 2") + "dropped p\n", "", " D patches/a\n")
    assert failures == [
        "drop: the audit now finds 2 patch(es) upstream on every carried line; "
        "the README's drop workflow says none: update it",
        "drop: `bump --drop` did not say 'nothing to drop'",
        "drop: the block changed the clone:  D patches/a",
    ]


def test_an_audit_that_printed_no_totals_fails():
    assert readme_blocks.drop_failures(BUMP, "", "") == ["drop: the audit printed no 'Totals: ... drop N' line"]
