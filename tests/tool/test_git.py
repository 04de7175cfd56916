# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The one door for git: every git process of the tool starts in vllm_overlay/git.py, isolated, and
fails as one error type; the user's git configuration and GIT_* variables never change what the
tool builds."""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import REPO_ROOT, write_upstream
from vllm_overlay import git as gitcmd

HOSTILE = """[core]
\tautocrlf = true
\thooksPath = {hooks}
\twhitespace = trailing-space
[apply]
\twhitespace = fix
[am]
\tthreeWay = true
\tkeepcr = true
[gc]
\tauto = 1
\tautoDetach = false
\tautoPackLimit = 1
[maintenance]
\tauto = true
[trailer]
\twhere = start
[commit]
\tgpgSign = false
[diff]
\tnoprefix = true
"""


def _hostile_home(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "hostile-home"
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    ran = home / "hooks-ran"
    for name in ("post-commit", "post-applypatch", "applypatch-msg", "post-checkout", "pre-auto-gc"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\necho {name} >> {ran}\n")
        hook.chmod(0o755)
    (home / ".gitconfig").write_text(HOSTILE.format(hooks=hooks))
    return home, ran


def test_the_users_git_configuration_does_not_change_the_tree(tmp_path, store_env, project, make_patch, monkeypatch):
    upstream = write_upstream(tmp_path / "up", extra={"vllm/crlf.py": "a = 1\r\nb = 2\r\n"})

    def add_spaces(tree: Path) -> None:
        core = tree / "vllm" / "core.py"
        core.write_text(core.read_text().replace("line_20 = 20\n", "line_20 = 200   \n"))

    make_patch(upstream, add_spaces, "Trailing spaces kept")
    clean_home = tmp_path / "clean-home"
    clean_home.mkdir()
    monkeypatch.setenv("HOME", str(clean_home))
    code, _ = run_apply(project, upstream, "--output", str(tmp_path / "clean"))
    assert code == 0
    clean = git.Repo(tmp_path / "clean").head.commit

    home, ran = _hostile_home(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_AUTHOR_NAME", "someone else")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.autocrlf'='true'")
    monkeypatch.setenv("GIT_ATTR_NOSYSTEM", "0")
    # another cache: the import itself must not depend on the configuration either
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(tmp_path / "cache-2"))
    code, _ = run_apply(project, upstream, "--output", str(tmp_path / "hostile"))
    assert code == 0
    hostile = git.Repo(tmp_path / "hostile").head.commit
    assert hostile.tree.hexsha == clean.tree.hexsha
    assert hostile.hexsha == clean.hexsha
    assert (tmp_path / "hostile" / "vllm" / "crlf.py").read_bytes() == b"a = 1\r\nb = 2\r\n"
    assert "line_20 = 200   \n" in (tmp_path / "hostile" / "vllm" / "core.py").read_text()
    assert not ran.exists(), ran.read_text()
    for repo in (tmp_path / "hostile" / ".git", tmp_path / "cache-2" / "upstreams.git"):
        assert not list((repo / "objects" / "pack").glob("*.pack")), f"git gc ran in {repo}"


def test_user_setting_is_read_outside_the_isolation(tmp_path, monkeypatch):
    """The user's own identity, from their repository's configuration too, which isolated git never reads."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "config", "user.email", "ada@example.invalid"], check=True)

    with gitcmd.isolated():
        assert gitcmd.user_setting("user.email", checkout) == "ada@example.invalid"
        assert gitcmd.user_setting("user.name", checkout) is None


# --- the door -------------------------------------------------------------------------------------

PROCESS_STARTS = {"run", "Popen", "call", "check_call", "check_output", "execute"}  # execute: GitPython's


def _git_argv(node: ast.expr, git_lists: set[str]) -> bool:
    """True for an argv that starts with "git": a literal list or tuple, or a name bound to one."""
    if isinstance(node, ast.Name):
        return node.id in git_lists
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        first = node.elts[0]
        if isinstance(first, ast.Starred):
            return _git_argv(first.value, git_lists)
        return isinstance(first, ast.Constant) and first.value == "git"
    return False


def git_process_starts(source: str) -> list[int]:
    """Lines of ``source`` that start a process whose argv begins with "git" (subprocess's calls,
    GitPython's ``execute``), the argv written there or bound to a name first."""
    tree = ast.parse(source)
    git_lists = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _git_argv(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in PROCESS_STARTS and _git_argv(node.args[0], git_lists):
            found.append(node.lineno)
    return found


def test_the_scan_finds_each_way_a_module_started_git_itself():
    written = """
import subprocess
PARSE = ("git", "interpret-trailers")
subprocess.run(["git", "-C", "repo", "status"], check=True)
process = subprocess.Popen(("git", "archive"), stdout=subprocess.PIPE)
subprocess.run([*PARSE, "--in-place"])
argv = ["git", "log"]
subprocess.run(argv)
repo.git.execute(["git", "write-tree"], env={})
subprocess.run(["ruff", "check"])
runner(["git", "log"])
"""
    assert git_process_starts(written) == [4, 5, 6, 8, 9]


def test_no_module_but_the_door_starts_a_git_process():
    package = REPO_ROOT / "vllm_overlay"
    starts = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if path != package / "git.py" and (lines := git_process_starts(path.read_text(encoding="utf-8")))
    }
    assert starts == {}, f"git started outside vllm_overlay/git.py (module: lines): {starts}"


@pytest.mark.parametrize("inside", [False, True], ids=["a library call", "a verb"])
def test_the_door_runs_git_isolated_inside_the_cli_and_outside(tmp_path, monkeypatch, inside):
    """With or without the ``isolated()`` block every verb runs in: a stray GIT_DIR and the user's
    settings have no say, and what a caller adds (a committer) goes on top."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    with gitcmd.isolated() if inside else contextlib.nullcontext():
        _git_through_the_door_is_isolated(repo)


def _git_through_the_door_is_isolated(repo: Path) -> None:
    assert gitcmd.git(repo, "rev-parse", "--absolute-git-dir").strip() == str(repo / ".git")
    status, out, _err = gitcmd.run(repo, "config", "--get", "core.hooksPath")
    assert (status, out.strip()) == (0, os.devnull)
    done = gitcmd.process("-C", str(repo), "config", "--get", "gc.auto", capture_output=True, text=True)
    assert done.stdout.strip() == "0"
    ident = gitcmd.git(repo, "var", "GIT_COMMITTER_IDENT", env={"GIT_COMMITTER_NAME": "Ada Lovelace"})
    assert ident.startswith("Ada Lovelace <")
    with gitcmd.popen("-C", str(repo), "rev-parse", "--absolute-git-dir", stdout=subprocess.PIPE) as process:
        assert process.communicate()[0].decode().strip() == str(repo / ".git")


def test_a_gitpython_failure_is_raised_as_the_doors_one_error(tmp_path):
    repo = git.Repo.init(tmp_path / "repo")
    with pytest.raises(gitcmd.GitError) as caught, gitcmd.gitpython_failures():
        repo.git.rev_parse("--verify", "no-such")
    cause = caught.value.__cause__
    assert isinstance(cause, git.GitCommandError)
    assert str(caught.value) == f"git rev-parse --verify no-such: {str(cause.stderr).strip()}"
    assert "no-such" in str(caught.value) and caught.value.returncode == cause.status
    assert isinstance(caught.value, subprocess.CalledProcessError)


def test_the_translation_leaves_other_failures_as_they_are(tmp_path):
    with pytest.raises(ValueError), gitcmd.gitpython_failures():
        raise ValueError("not git's")
    own = gitcmd.GitError(tmp_path, ("status",), 128, b"fatal: not a git repository\n")
    with pytest.raises(gitcmd.GitError) as caught, gitcmd.gitpython_failures():
        raise own
    assert caught.value is own and gitcmd.failure(own) is own
    assert str(own) == f"git status in {tmp_path}: fatal: not a git repository"
    assert gitcmd.failure(OSError("disk")) is None
