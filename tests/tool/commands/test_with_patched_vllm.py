"""with-patched-vllm: which upstream a patched tree is compared with."""

from __future__ import annotations

import git
import pytest

from tests.tool.helpers import IDENTITY, change_line_20, run_apply
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


def test_tree_without_upstream_tag_asks_for_base(tmp_path):
    repo = git.Repo.init(tmp_path)
    (tmp_path / "f").write_text("x\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.add("-A")
        repo.git.commit("-qm", "only")
    with pytest.raises(SystemExit, match="pass --base"):
        upstream_base(repo)
