"""Re-carrying the series: when an earlier carry's reviewed commit may stand in for a stopped patch.

Real git repositories: an "earlier carry" (base + one carried commit with its Patch-File trailer)
and a repository where ``git am`` really stopped at the same patch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import git
import pytest

from tests.tool.helpers.repos import git as run_git
from vllm_overlay.cpu import carry, recarry

NAME = "demo/change-a.patch"
MAIL = f"""From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: test <test@example.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] demo: change a

Series: demo
Patch-File: {NAME}
---
 a.txt | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/a.txt b/a.txt
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO (the 0.33.0 side)
 three
"""


def _repo(path: Path, files: dict[str, str]) -> git.Repo:
    path.mkdir(parents=True)
    run_git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).write_text(text)
    run_git(path, "add", "-A")
    run_git(path, "commit", "-q", "-m", "upstream")
    run_git(path, "config", "vllm-overlay.upstream", run_git(path, "rev-parse", "HEAD").strip())
    return git.Repo(path)


@pytest.fixture
def earlier(tmp_path):
    """The earlier carry: a.txt resolved by a person (the carried change and its note)."""
    repo = _repo(tmp_path / "previous", {"a.txt": "one\n2\nthree\n", "b.txt": "b\n"})
    (tmp_path / "previous" / "a.txt").write_text("one\nTWO (carried)\nthree\n")
    run_git(
        tmp_path / "previous",
        "commit",
        "-q",
        "-am",
        f"demo: change a\n\nCarried onto 0.32.0: a note.\n\nPatch-File: {NAME}",
    )
    return repo


def _stopped(tmp_path: Path, files: dict[str, str]) -> git.Repo:
    """A repository where git am really stopped at the demo patch (it does not apply there)."""
    repo = _repo(tmp_path / "bump", files)
    mail = tmp_path / "change.mail"
    mail.write_text(MAIL)
    done = subprocess.run(["git", "am", "-q", str(mail)], cwd=repo.working_tree_dir, capture_output=True)
    assert done.returncode != 0 and (Path(repo.git_dir) / "rebase-apply").is_dir()
    return repo


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_an_unchanged_patch_on_the_same_files_takes_the_reviewed_commit(tmp_path, earlier):
    carried = recarry.previous_commits(earlier)
    assert set(carried) == {NAME}
    # b.txt differs from the earlier carry's tree: a file the patch does not touch does not matter.
    repo = _stopped(tmp_path, {"a.txt": "one\n2\nthree\n", "b.txt": "b changed by an earlier patch\n"})
    assert recarry.current_patch(repo) == NAME
    assert recarry.source_files(repo) == {"a.txt"}
    assert recarry.why_not_reusable(repo, NAME, _digest("v1"), {NAME: _digest("v1")}, carried) is None
    recarry.fetch_previous(repo, Path(earlier.working_tree_dir))
    recarry.take_previous(repo, carried[NAME])
    run_git(Path(repo.working_tree_dir), "am", "--continue")
    head = repo.head.commit
    assert (Path(repo.working_tree_dir) / "a.txt").read_text() == "one\nTWO (carried)\nthree\n"
    assert (Path(repo.working_tree_dir) / "b.txt").read_text() == "b changed by an earlier patch\n"
    assert "Carried onto 0.32.0: a note." in str(head.message)


def test_a_changed_patch_or_other_files_before_it_need_a_person(tmp_path, earlier):
    carried = recarry.previous_commits(earlier)
    repo = _stopped(tmp_path, {"a.txt": "one\n2\nthree\n", "b.txt": "b\n"})
    changed = recarry.why_not_reusable(repo, NAME, _digest("v2"), {NAME: _digest("v1")}, carried)
    assert changed and "changed since the earlier carry" in changed
    unrecorded = recarry.why_not_reusable(repo, NAME, _digest("v1"), {}, carried)
    assert unrecorded and "does not record" in unrecorded
    assert "a new patch" in (recarry.why_not_reusable(repo, "demo/other.patch", "", {}, carried) or "")
    moved = _stopped(tmp_path / "again", {"a.txt": "zero\none\n2\nthree\n", "b.txt": "b\n"})
    differ = recarry.why_not_reusable(moved, NAME, _digest("v1"), {NAME: _digest("v1")}, carried)
    assert differ and "a.txt" in differ


def test_carried_from_records_the_series_and_each_patch_file(tmp_path):
    from tests.tool.helpers.repos import REPO_ROOT

    root = tmp_path / "project"
    (root / "cpu").mkdir(parents=True)
    text = recarry.render_carried_from(REPO_ROOT / "patches", "today")
    (root / "cpu" / carry.CARRIED_FROM).write_text(text)
    first = text.splitlines()[0].split()[0]
    assert first == carry.series_digest(REPO_ROOT / "patches")
    recorded = recarry.recorded_digests(root)
    assert recorded == recarry.file_digests(REPO_ROOT / "patches")
    assert len(recorded) == len(carry.series.load_series(REPO_ROOT / "patches"))


def test_the_committed_carry_is_of_todays_patches():
    """cpu/carried-from names today's patches/ file by file: re-carry when this fails (scripts/carry-cpu)."""
    from tests.tool.helpers.repos import REPO_ROOT

    assert recarry.recorded_digests(REPO_ROOT) == recarry.file_digests(REPO_ROOT / "patches")


def test_a_name_the_release_does_not_define_is_found_in_the_carried_files(tmp_path):
    """A 3-way can take a line calling a helper only the locked release has (get_elastic_ep_rank_retired)."""
    repo = _repo(tmp_path / "carried", {"mod.py": "def status():\n    return None\n", "other.py": "x = y\n"})
    base = repo.head.commit.hexsha
    (tmp_path / "carried" / "mod.py").write_text("def status():\n    if get_rank_retired():\n        return 1\n")
    run_git(tmp_path / "carried", "commit", "-q", "-am", "carried")
    found = recarry.undefined_names(tmp_path / "carried", base)
    assert len(found) == 1 and "mod.py" in found[0] and "get_rank_retired" in found[0]  # other.py is not carried
    (tmp_path / "carried" / "mod.py").write_text("def status():\n    return None\n")
    run_git(tmp_path / "carried", "commit", "-q", "-am", "fixed")
    assert recarry.undefined_names(tmp_path / "carried", base) == []


def test_a_finished_carry_leaves_nothing_in_progress(tmp_path, monkeypatch):
    """Before: carry-cpu after a finished carry refused with "a carry is in progress"
    (build/carry-cpu/bump was left behind as if stopped). The real finish runs on a bump repository
    whose git am went through; only what needs the package index (the release's new lock) and the
    export of its commits (none here: an empty series) stand in."""
    from tests.tool.helpers.repos import REPO_ROOT
    from vllm_overlay import bump
    from vllm_overlay.apply import export
    from vllm_overlay.store import Store
    from vllm_overlay.upstream import lock

    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("")
    shutil.copy(REPO_ROOT / "upstream.lock", root / "upstream.lock")
    (root / "cpu" / "patches").mkdir(parents=True)
    (root / "cpu" / "patches" / "series").write_text("")
    shutil.copy(REPO_ROOT / "cpu" / "upstream.lock", root / "cpu" / "upstream.lock")  # the carry it replaces
    paths = recarry.Paths(root)
    paths.scratch.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "upstream.lock", paths.scratch / "upstream.lock")
    repo = _repo(paths.repo, {"a.txt": "one\n"})
    upstream = dict(kind="release", label="0.32.0", tag="upstream/0.32.0", commit=repo.head.commit.hexsha,
                    version="0.32.0", release_commit=None, sha256=None, origin="test")  # fmt: skip
    bump.BumpState("0.32.0", upstream).save(paths.repo)
    paths.source.write_text(json.dumps({"series_sha256": "", "digests": {}, "recorded": {}}))
    with pytest.raises(recarry.RecarryError, match="a carry is in progress"):  # started, not finished
        recarry.start(root, Store())
    cpu_lock = lock.load(REPO_ROOT / "cpu" / "upstream.lock")
    monkeypatch.setattr(bump, "new_lock", lambda old, up, store: cpu_lock)
    monkeypatch.setattr(export, "export_commits", lambda repo_dir: [])

    outcome = recarry.finish(root, Store(), recarry.Outcome())
    assert outcome.written == ["cpu/patches/series", "cpu/carried-from"]

    class Started(Exception):
        """The next carry got past its in-progress check: it builds the earlier carry's tree first."""

    def build_tree(*_args, **_kwargs):
        raise Started

    monkeypatch.setattr(carry, "build_tree", build_tree)
    with pytest.raises(Started):
        recarry.start(root, Store())
