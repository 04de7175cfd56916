# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The user's git configuration and GIT_* variables never change what the tool builds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import write_upstream
from vllm_overlay import gitenv

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

    with gitenv.isolated():
        assert gitenv.user_setting("user.email", checkout) == "ada@example.invalid"
        assert gitenv.user_setting("user.name", checkout) is None
