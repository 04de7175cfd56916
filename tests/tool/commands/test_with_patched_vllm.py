"""with-patched-vllm: which upstream a patched tree is compared with."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import IDENTITY, change_line_20
from vllm_overlay import cli
from vllm_overlay.commands.with_patched_vllm import changed_package_files, upstream_base


def test_tree_from_apply_patches_is_compared_with_its_own_upstream(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    base = upstream_base(repo)
    assert base.startswith("upstream/")
    assert repo.commit(base) == repo.commit("HEAD~1")
    assert changed_package_files(tree, None) == ["vllm/core.py"]


def test_hand_made_clone_uses_its_upstream_dash_tag(tmp_path):
    repo = git.Repo.init(tmp_path)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "a.py").write_text("a = 1\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.add("-A")
        repo.git.commit("-qm", "upstream")
        repo.git.tag("upstream-0.33.0")
        (tmp_path / "vllm" / "a.py").write_text("a = 2\n")
        repo.git.commit("-qam", "fix")
    assert upstream_base(repo) == "upstream-0.33.0"


def _one_commit_repo(path: Path) -> git.Repo:
    repo = git.Repo.init(path)
    (path / "f").write_text("x\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.add("-A")
        repo.git.commit("-qm", "only")
    return repo


def test_tree_without_upstream_tag_asks_for_base(tmp_path, capsys):
    """An input error (exit 2, one line), as the verb's --help says: not SystemExit's exit 1."""
    _one_commit_repo(tmp_path)
    assert cli.main(["with-patched-vllm", "--tree", str(tmp_path), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}: not made by apply-patches") and err.endswith("; pass --base\n")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--"], "with-patched-vllm: no command given"),
        (["--base=-x", "--", "true"], "with-patched-vllm: --base '-x' starts with '-': git would read it as an option"),
        (
            ["--base", "no-such-rev", "--", "true"],
            "with-patched-vllm: --base 'no-such-rev' is not a revision of {tree}",
        ),
        (["--python", "{tree}/no-python", "--", "true"], "with-patched-vllm: [Errno 2] No such file or directory"),
    ],
)
def test_bad_input_is_exit_2_in_one_line(tmp_path, capsys, options, message):
    _one_commit_repo(tmp_path)
    argv = ["with-patched-vllm", "--tree", str(tmp_path), "--base", "HEAD", *options]
    assert cli.main([arg.format(tree=tmp_path) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(tree=tmp_path)) and len(err.splitlines()) == 1


def test_a_tree_that_is_no_git_repository_is_exit_2(tmp_path, capsys):
    assert cli.main(["with-patched-vllm", "--tree", str(tmp_path / "absent"), "--", "true"]) == 2
    assert capsys.readouterr().err == f"error: with-patched-vllm: --tree {tmp_path / 'absent'}: not a git repository\n"
