"""patched_repo: the patched repository's contract (upstream base, commit <-> patch file, changes)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git as gitpython
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import change_line_20, git, replace_line
from vllm_overlay import git as gitcmd
from vllm_overlay import series
from vllm_overlay.apply import patched_repo


def _commit(repo: Path, files: dict[str, str | None], message: str) -> str:
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An upstream commit (tagged upstream/0.33.0, recorded in the config) and two patch commits."""
    root = tmp_path / "patched"
    root.mkdir()
    git(root, "init", "-q", "-b", "patched")
    base = _commit(root, {"vllm/a.py": "a = 1\n", "vllm/gone.py": "x\n", "README": "r\n"}, "upstream")
    git(root, "tag", "upstream/0.33.0")
    git(root, "config", patched_repo.CONFIG_UPSTREAM, base)
    _commit(
        root,
        {"vllm/a.py": "a = 2\n", "vllm/new.py": "n\n"},
        "demo: change a\n\nSeries: demo\n" + patched_repo.patch_file_trailer("demo/change-a.patch"),
    )
    _commit(root, {"vllm/gone.py": None}, "demo: drop gone\n\nNo trailer here.")
    return root


def test_upstream_base_is_the_recorded_commit(repo):
    base = git(repo, "rev-parse", "upstream/0.33.0").strip()
    assert patched_repo.upstream_base(repo) == base
    assert patched_repo.upstream_base(gitpython.Repo(repo)) == base
    assert patched_repo.base_name(repo, base) == "upstream/0.33.0"


def test_a_disagreeing_tag_does_not_move_the_recorded_base(repo):
    """The config is what apply wrote; a newer upstream tag below HEAD is only a name."""
    first_patch = git(repo, "rev-parse", "HEAD~1").strip()
    git(repo, "tag", "upstream/0.34.0", first_patch)  # below HEAD, newer than the recorded base
    base = git(repo, "rev-parse", "upstream/0.33.0").strip()
    assert patched_repo.upstream_base(repo) == base
    git(repo, "tag", "-d", "upstream/0.33.0")  # and no tag on the recorded commit at all
    assert patched_repo.upstream_base(repo) == base
    assert patched_repo.base_name(repo, base) == base  # shown by its id then


def test_without_the_config_the_newest_upstream_tag_below_head_is_the_base(repo):
    git(repo, "config", "--unset", patched_repo.CONFIG_UPSTREAM)
    assert patched_repo.recorded_upstream(repo) is None
    assert patched_repo.upstream_base(repo) == git(repo, "rev-parse", "upstream/0.33.0").strip()
    git(repo, "tag", "upstream-hand", "HEAD~1")
    assert patched_repo.upstream_base(repo) == git(repo, "rev-parse", "HEAD~1").strip()


def test_neither_config_nor_tag_is_refused(repo):
    git(repo, "config", "--unset", patched_repo.CONFIG_UPSTREAM)
    git(repo, "tag", "-d", "upstream/0.33.0")
    with pytest.raises(patched_repo.NoUpstream, match="not made by apply-patches"):
        patched_repo.upstream_base(repo)


def test_record_upstream_and_partial(tmp_path):
    root = tmp_path / "r"
    root.mkdir()
    git(root, "init", "-q")
    commit = _commit(root, {"f": "x\n"}, "only")
    patched_repo.record_upstream(gitpython.Repo(root), commit)
    assert git(root, "config", "--get", "vllm-overlay.upstream").strip() == commit
    assert not patched_repo.is_partial(root)
    patched_repo.record_upstream(gitpython.Repo(root), commit, partial=True)
    assert patched_repo.is_partial(root)


def test_patch_commits_map_each_commit_to_its_patch_file(repo):
    found = patched_repo.patch_commits(repo)
    assert [c.commit for c in found] == git(repo, "rev-list", "--reverse", "upstream/0.33.0..HEAD").split()
    assert [c.patch_file for c in found] == ["demo/change-a.patch", None]
    assert patched_repo.trailer_value(repo, found[0].commit, "series") == "demo"  # keys as git matches them
    assert patched_repo.trailer_value(repo, found[1].commit, "Series") is None


def test_a_patch_file_written_in_the_body_is_no_trailer(repo):
    """git's own trailer parsing: only the message's last paragraph holds trailers."""
    _commit(repo, {"README": "changed\n"}, "demo: body\n\nPatch-File: demo/in-body.patch\n\nThe end of it.")
    assert patched_repo.patch_commits(repo)[-1].patch_file is None
    message = "demo: x\n\nWhy.\n\nSeries: demo\nPatch-File: demo/x.patch\n"
    assert patched_repo.message_patch_file(repo, message) == "demo/x.patch"
    assert patched_repo.message_patch_file(repo, "demo: x\n\nPatch-File: demo/x.patch\n\nbody after\n") is None


def test_changed_files_of_a_commit_and_between_commits(repo):
    first, second = (c.commit for c in patched_repo.patch_commits(repo))
    changes = {c.path: c for c in patched_repo.commit_changes(repo, first)}
    assert {p: c.status for p, c in changes.items()} == {"vllm/a.py": "M", "vllm/new.py": "A"}
    assert changes["vllm/a.py"].new_blob == git(repo, "rev-parse", f"{first}:vllm/a.py").strip()
    assert [(c.path, c.status) for c in patched_repo.commit_changes(repo, second)] == [("vllm/gone.py", "D")]
    base = patched_repo.upstream_base(repo)
    assert patched_repo.changed_between(repo, base, second, "vllm/") == (["vllm/a.py", "vllm/new.py"], ["vllm/gone.py"])
    assert patched_repo.changed_between(repo, base, base) == ([], [])
    assert patched_repo.tree_id(repo, second) == git(repo, "rev-parse", "HEAD^{tree}").strip()


def test_git_failure_names_the_command_and_stays_a_called_process_error(repo):
    with pytest.raises(gitcmd.GitError, match=r"git rev-parse no-such\^\{tree\} in .*patched") as caught:
        patched_repo.tree_id(repo, "no-such")
    assert isinstance(caught.value, subprocess.CalledProcessError)


def test_an_applied_tree_holds_each_patch_in_its_commit(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    patches = series.load_series(project / "patches")
    found = patched_repo.patch_commits(tree)
    assert [c.patch_file for c in found] == [p.name for p in patches]
    assert patched_repo.base_name(tree, patched_repo.upstream_base(tree)).startswith("upstream/")
    assert patched_repo.differs_from_patch(tree, patches[0], found[0].commit) == []
    replace_line(tree / "vllm" / "core.py", "line_20 = 200\n", "line_20 = 2000\n")
    git(tree, "commit", "-q", "--amend", "-a", "--no-edit")
    amended = patched_repo.patch_commits(tree)[0].commit
    assert patched_repo.differs_from_patch(tree, patches[0], amended) == ["vllm/core.py"]
