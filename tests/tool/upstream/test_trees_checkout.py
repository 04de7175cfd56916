"""Checking out and fetching an upstream: any file-system layout, no option-shaped user input."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import change_line_20, write_upstream
from vllm_overlay import cli

TMPFS = Path("/dev/shm")


@pytest.fixture
def other_file_system(tmp_path: Path):
    """A directory on a file system other than tmp_path's (where the cache lives): a tmpfs."""
    if not TMPFS.is_dir() or os.stat(TMPFS).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip(f"{TMPFS} is not a separate file system on this machine")
    root = Path(tempfile.mkdtemp(prefix="vllm-overlay-test-", dir=TMPFS))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_output_on_another_file_system_than_the_cache(project, make_patch, upstream_dir, store_env, other_file_system):
    """~/.cache on one file system, the checkout or --output on another: hardlinks fail, copying works."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert os.stat(other_file_system).st_dev != os.stat(store_env.parent).st_dev
    target = other_file_system / "patched"
    code, _report = run_apply(project, upstream_dir, "--output", str(target))
    assert code == 0
    repo = git.Repo(target)
    assert "line_20 = 200" in (target / "vllm" / "core.py").read_text()
    assert repo.git.fsck("--no-progress") == ""
    # The same tree as on the cache's own file system.
    assert run_apply(project, upstream_dir)[0] == 0
    assert git.Repo(project / "build" / "patched").head.commit.tree == repo.head.commit.tree


@pytest.mark.parametrize("where", ["repository", "revision"])
def test_option_shaped_git_upstream_is_refused_and_runs_nothing(
    project, make_patch, upstream_dir, store_env, tmp_path, capsys, where
):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    source = tmp_path / "gitsrc"
    shutil.copytree(upstream_dir, source)
    repo = git.Repo.init(source)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"])
    marker = tmp_path / "ran"
    hostile = f"--upload-pack=touch {marker}"
    spec = f"{hostile}@HEAD" if where == "repository" else f"{source}@{hostile}"
    code = cli.main(["apply-patches", "--project", str(project), "--upstream", spec])
    assert code == 2
    assert "git would read it as an option" in capsys.readouterr().err
    assert not marker.exists()


def test_option_shaped_base_of_with_patched_vllm_is_refused(
    project, make_patch, upstream_dir, store_env, tmp_path, capsys
):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    written = tmp_path / "written-by-git"
    tree = str(project / "build" / "patched")
    assert cli.main(["with-patched-vllm", "--tree", tree, f"--base=--output={written}", "--", "true"]) == 2
    assert "would read it as an option" in capsys.readouterr().err
    assert not written.exists()


def test_gitattributes_in_the_upstream_steer_neither_the_import_nor_the_working_tree(project, make_patch, tmp_path):
    """Before: ``* text eol=crlf`` in the upstream directory gave build/patched a CR on every
    line of files that have none (and would have stripped the CRs of one that has them on import):
    the working tree was not the committed tree. Attributes are off in every repository the tool makes."""
    upstream = write_upstream(tmp_path / "up")
    make_patch(upstream, change_line_20, "core: change line 20")
    (upstream / ".gitattributes").write_text("* text eol=crlf\n*.py ident filter=nonesuch\n")
    (upstream / "vllm" / "dos.py").write_bytes(b"# $Id$\r\nx = 1\r\n")
    code, _report = run_apply(project, upstream)
    assert code == 0
    tree = project / "build" / "patched"
    for name in ("vllm/_version.py", "vllm/dos.py", ".gitattributes"):
        assert (tree / name).read_bytes() == (upstream / name).read_bytes(), name
        blob = subprocess.run(["git", "-C", str(tree), "show", f"HEAD:{name}"], capture_output=True, check=True)
        assert blob.stdout == (upstream / name).read_bytes(), name
    assert (
        b"\r" not in (tree / "vllm" / "core.py").read_bytes()
        and "line_20 = 200" in (tree / "vllm" / "core.py").read_text()
    )
    status = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == ""
