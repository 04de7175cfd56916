# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Patches whose meaning git reads otherwise than the tool: refused clearly, or round-tripped exactly."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import IDENTITY, TRAILERS, change_line_20, snapshot, symlinked_upstream, write_upstream
from tests.tool.helpers.repos import git as git_
from vllm_overlay import cli, series
from vllm_overlay.apply import paths

RENAME_PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: test <test@example.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] move core

Why.

Series: demo
---
diff --git a/vllm/core.py b/vllm/core.py
similarity index 100%
rename from vllm/core.py
rename to {target}
"""


def test_a_rename_to_another_path_than_the_header_is_refused():
    """git writes the ``rename to`` path, whatever the header and unidiff say."""
    for target, why in (("vllm/elsewhere.py", "its header names 'vllm/elsewhere.py'"), ("../outside.py", "'..'")):
        patch = series.parse_patch_bytes(RENAME_PATCH.format(target=target).encode(), Path("x"), "demo/x.patch")
        found = paths.problems(patch)
        assert any(why in problem for problem in found), found


def test_retargeting_an_existing_symlink_is_refused(tmp_path, project, store_env, capsys):
    """``index A..B 120000`` and no mode line: the link's target changes; the image would ship it as a file."""
    upstream = write_upstream(tmp_path / "up")
    os.symlink("core.py", upstream / "vllm" / "alias.py")
    work = tmp_path / "work"
    shutil.copytree(upstream, work, symlinks=True)
    git_(work, "init", "-q")
    git_(work, "add", "-A")
    git_(work, "commit", "-qm", "upstream")
    (work / "vllm" / "alias.py").unlink()
    os.symlink("_version.py", work / "vllm" / "alias.py")
    subject = "Retarget the alias"
    git_(work, "commit", "-qam", f"{subject}\n\nWhy.\n\n" + TRAILERS.format(subject=subject, series="demo"))
    text = git_(work, "format-patch", "--zero-commit", "--no-signature", "--full-index", "-1", "--stdout")
    assert "index " in text and " 120000\n" in text and "mode 120000" not in text
    (project / "patches" / "demo").mkdir()
    (project / "patches" / "demo" / "retarget.patch").write_text(text)
    (project / "patches" / "series").write_text("demo/retarget.patch\n")
    capsys.readouterr()
    code = cli.main(["apply-patches", "--project", str(project), "--upstream", str(upstream)])
    assert code == 2
    assert "vllm/alias.py" in capsys.readouterr().err
    assert not (project / "build" / "patched").exists()


def test_a_patch_beyond_a_directory_symlink_of_the_tree_is_refused_even_with_3way(
    tmp_path, project, make_patch, store_env, capsys
):
    """git apply refuses a path beyond a symlink; its 3-way merge wrote through it, into the link's
    target: a commit of another path than the patch names. Refused before git runs."""
    base, linked = symlinked_upstream(tmp_path, make_patch)
    capsys.readouterr()
    where = ["--project", str(project), "--upstream", str(linked), "--base-upstream", str(base), "--3way"]
    code = cli.main(["apply-patches", *where])
    assert code == 2
    assert "vllm/plugins/hook.py: lies beyond vllm/plugins, a symlink in the tree" in capsys.readouterr().err
    assert not (project / "build" / "patched").exists()


def _edit_message(patch_file: Path, old: str, new: str) -> None:
    text = patch_file.read_text()
    assert old in text
    patch_file.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("--- the old layout, for reference", "would end the commit message"),
        ("From: Someone Else <else@example.invalid>", "would take it as the commit's from"),
        ("Subject: another subject", "would take it as the commit's subject"),
    ],
)
def test_a_message_git_am_reads_otherwise_is_refused_at_apply(
    line, why, project, make_patch, upstream_dir, store_env, capsys
):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    _edit_message(path, "\nWhy\n\nWhy and how.\n", f"\n{line}\nWhy\n\nWhy and how.\n")
    capsys.readouterr()
    code = cli.main(["apply-patches", "--project", str(project), "--upstream", str(upstream_dir)])
    assert code == 2
    assert why in capsys.readouterr().err
    assert not (project / "build" / "patched").exists()


@pytest.mark.parametrize(
    ("line", "why"),
    [("--- see the old layout", "would end the commit message"), ("From: Mallory <m@example.invalid>", "from")],
)
def test_a_commit_message_git_am_would_read_otherwise_is_not_exported(
    line, why, project, make_patch, upstream_dir, store_env, capsys
):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    repo = git.Repo(project / "build" / "patched")
    message = repo.head.commit.message.replace("\nWhy\n\nWhy and how.\n", f"\n{line}\nWhy\n\nWhy and how.\n", 1)
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("--amend", "-q", "-m", message)
    before = snapshot(project / "patches")
    capsys.readouterr()
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 2
    assert why in capsys.readouterr().err
    assert snapshot(project / "patches") == before


NEW_FILE_PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: test <test@example.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] add a file

Why.

Series: demo
---
diff --git a/{name} b/{name}
new file mode 100644
index 0000000..e69de29
--- /dev/null
+++ b/{name}
@@ -0,0 +1 @@
+[core]
"""


@pytest.mark.parametrize(
    "name",
    [".git/config", ".GIT/config", "vllm/.Git/hooks/x", ".git./config", ".git /config", "GIT~1/config", ".g\u200cit/x"],
)
def test_every_name_a_file_system_reads_as_git_is_refused(name):
    """On a case-insensitive file system ``.GIT/config`` is ``.git/config``."""
    patch = series.parse_patch_bytes(NEW_FILE_PATCH.format(name=name).encode(), Path("x"), "demo/x.patch")
    assert any("inside .git" in problem for problem in paths.problems(patch)), paths.problems(patch)


def test_a_name_that_only_looks_like_git_is_accepted():
    for name in ("vllm/.github/x.yml", "vllm/git/x.py", "vllm/.gitkeep", "vllm/.gitignore"):
        patch = series.parse_patch_bytes(NEW_FILE_PATCH.format(name=name).encode(), Path("x"), "demo/x.patch")
        assert paths.problems(patch) == [], name


def test_apply_refuses_a_patch_into_a_case_variant_of_git(project, make_patch, upstream_dir, capsys):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    patch_file = next((project / "patches" / "demo").glob("*.patch"))
    patch_file.write_bytes(NEW_FILE_PATCH.format(name=".GIT/config").encode())
    before = snapshot(project / "patches")
    up = str(upstream_dir)
    code = cli.main(["apply-patches", "--project", str(project), "--upstream", up, "--base-upstream", up])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "refused: path inside .git '.GIT/config'" in err
    assert not (project / "build" / "patched").exists()
    assert snapshot(project / "patches") == before


def test_lint_flags_a_patch_that_writes_gitattributes():
    """Attributes steer the tree's conversions; lint says so, as export refuses it."""
    for name in (".gitattributes", "vllm/.GitAttributes"):
        patch = series.parse_patch_bytes(NEW_FILE_PATCH.format(name=name).encode(), Path("x"), "demo/x.patch")
        assert paths.attribute_files(patch) == [name]
