"""export-patches: byte-stable round trip, --check, new and dropped commits."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import IDENTITY, MAINTAINER, change_line_20, replace_line, snapshot, write_upstream
from tests.tool.helpers.repos import git as helper_git
from vllm_overlay import cli

ADA = "Ada Lovelace <ada@example.org>"


def test_unchanged_series_exports_identical_bytes(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "b")
    assert run_apply(project, upstream_dir)[0] == 0
    # First export normalises the hand-made series file; from then on export is a fixed point.
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    before = snapshot(project / "patches")
    assert run_apply(project, upstream_dir)[0] == 0
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    assert snapshot(project / "patches") == before
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project), "--check"]) == 0


def test_patch_file_is_what_format_patch_gave(project, make_patch, upstream_dir, store_env):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    original = path.read_bytes()
    assert run_apply(project, upstream_dir)[0] == 0
    cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)])
    assert path.read_bytes() == original
    assert b"Patch-File" not in original


def test_check_reports_amended_commit(project, make_patch, upstream_dir, store_env, capsys):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)])
    repo = git.Repo(project / "build" / "patched")
    replace_line(project / "build" / "patched" / "vllm" / "core.py", "line_20 = 200\n", "line_20 = 2000\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aq", "--amend", "--no-edit")
    capsys.readouterr()
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project), "--check"]) == 1
    out = capsys.readouterr().out
    assert "++line_20 = 2000" in out
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project), "--check"]) == 0


def test_new_commit_gets_a_file_and_dropped_one_is_removed(project, make_patch, upstream_dir, store_env):
    first = make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    replace_line(tree / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 300\n")
    message = "core: change line 30\n\nWhy.\n\nSeries: other\n"
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aqm", message)
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    assert (project / "patches" / "other" / "core-change-line-30.patch").exists()
    series = (project / "patches" / "series").read_text()
    assert series.index("demo/core-change-line-20.patch") < series.index("other/core-change-line-30.patch")
    # drop the first patch: rebase it away
    base = repo.git.config("--get", "vllm-overlay.upstream")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.rebase("--quiet", "--onto", base, "HEAD~1")
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    assert not first.exists()
    assert "core-change-line-20" not in (project / "patches" / "series").read_text()


def test_commit_without_series_trailer_is_an_error(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    replace_line(tree / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 300\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aqm", "no trailer")
    before = snapshot(project / "patches")
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 2
    assert snapshot(project / "patches") == before


def test_slug_cuts_at_a_word_boundary():
    from vllm_overlay.apply.export import slugify

    assert slugify("health: Add a progress check that fails when active work stops advancing") == (
        "health-add-a-progress-check-that-fails-when-active-work"
    )
    assert slugify("!!!") == "patch"


def test_uncommitted_changes_are_refused_and_an_untracked_file_is_not(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    export = ["export-patches", "--allow-other-upstream", "--project", str(project)]
    assert cli.main(export) == 0
    before = snapshot(project / "patches")
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    (tree / "notes.txt").write_text("a file of the user's, never added\n")
    assert cli.main([*export, "--check"]) == 0
    core = tree / "vllm" / "core.py"
    replace_line(core, "line_20 = 200\n", "line_20 = 2000\n")  # an edit, not staged
    assert cli.main(export) == 2
    repo.git.add("vllm/core.py")  # the same edit, staged
    assert cli.main(export) == 2
    assert snapshot(project / "patches") == before
    repo.git.reset("--hard", "--quiet")
    assert cli.main([*export, "--check"]) == 0


def test_export_writes_back_an_index_git_takes_for_racily_clean(project, make_patch, upstream_dir, store_env):
    """A tree published in the second its files were written: git hashes those files again at
    every read of the index until one writes it back. Dated before the files, the index makes
    every entry so; the export's check for uncommitted changes writes it back (git status), where
    a ``git diff`` would leave it as it was."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    index = project / "build" / "patched" / ".git" / "index"
    long_ago = 946684800  # 2000-01-01: older than every file of the tree
    os.utime(index, (long_ago, long_ago))
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project), "--check"]) == 0
    assert index.stat().st_mtime > long_ago


def test_export_during_a_stopped_rebase_is_refused(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "b")
    assert run_apply(project, upstream_dir)[0] == 0
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    before = snapshot(project / "patches")
    repo = git.Repo(project / "build" / "patched")
    base = repo.git.config("--get", "vllm-overlay.upstream")
    # Stop at the first patch to edit it: HEAD is then only part of the series.
    editor = {"GIT_SEQUENCE_EDITOR": "sed -i '1s/^pick/edit/'", **IDENTITY}
    with repo.git.custom_environment(**editor):
        repo.git.rebase("-i", base)
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 2
    assert snapshot(project / "patches") == before
    with repo.git.custom_environment(**IDENTITY):
        repo.git.rebase("--continue")
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    assert snapshot(project / "patches") == before


def test_export_waits_for_or_refuses_a_run_writing_its_input_or_output(
    project, make_patch, upstream_dir, store_env, capsys
):
    """The patched tree is read under its lock (apply-patches holds it while replacing the tree), and
    patches/ is written under its own; --check only reads."""
    from vllm_overlay.apply import staging

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    argv = ["export-patches", "--allow-other-upstream", "--project", str(project)]
    assert cli.main(argv) == 0  # the first export normalises the hand-made series file
    for held in (project / "build" / "patched", project / "patches"):
        with staging.output_lock(held.resolve()):
            capsys.readouterr()
            assert cli.main([*argv, "--no-wait"]) == 2
            assert f"{held.resolve()} is being written by pid" in capsys.readouterr().err
            assert cli.main([*argv, "--check", "--no-wait"]) == (2 if held.name == "patched" else 0)
    assert cli.main([*argv, "--no-wait"]) == 0


@pytest.mark.parametrize(
    ("trailer", "says"),
    [
        ("../../escaped.patch", "is not SERIES/FILE.patch"),
        ("{tmp}/absolute.patch", "is not SERIES/FILE.patch"),
        ("demo/../../../escaped.patch", "is not SERIES/FILE.patch"),
        ("demo/sub/deeper.patch", "is not SERIES/FILE.patch"),
        ("demo/not-a-patch.txt", "is not SERIES/FILE.patch"),
        ("other/core-change-line-30.patch", "but the commit's Series: is demo"),
    ],
)
def test_patch_file_trailer_is_confined_to_its_series_folder(
    project, make_patch, upstream_dir, store_env, tmp_path, capsys, trailer, says
):
    """A Patch-File trailer is data from a repository: it may not send export-patches elsewhere."""
    trailer = trailer.format(tmp=tmp_path)
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    replace_line(tree / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 300\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aqm", f"core: change line 30\n\nWhy.\n\nSeries: demo\nPatch-File: {trailer}\n")
    before = snapshot(project / "patches")
    outside = sorted(p.name for p in project.parent.rglob("*.patch") if "patches" not in p.parts)
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 2
    err = capsys.readouterr().err
    assert "Patch-File: trailer" in err and says in err and "nothing was written" in err
    assert snapshot(project / "patches") == before
    assert sorted(p.name for p in project.parent.rglob("*.patch") if "patches" not in p.parts) == outside
    assert not (tmp_path / "absolute.patch").exists()


def _export(project, *extra):
    return cli.main(["export-patches", "--project", str(project), *extra])


def test_a_tree_on_another_upstream_than_the_lock_is_refused(project, make_patch, upstream_dir, store_env, capsys):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    before = snapshot(project / "patches")
    assert _export(project) == 2  # applied onto a directory, not the locked 0.33.0
    err = capsys.readouterr().err
    assert "not on the locked 0.33.0 (upstream/0.33.0)" in err
    assert snapshot(project / "patches") == before
    # The same tree, its base being the locked release's tag (as apply-patches onto the lock leaves it).
    repo = git.Repo(project / "build" / "patched")
    repo.git.tag("upstream/0.33.0", repo.git.config("--get", "vllm-overlay.upstream"))
    assert _export(project) == 0


@pytest.mark.parametrize("kind", ["merge", "empty", "gitattributes"])
def test_commits_that_cannot_be_one_patch_are_refused(project, make_patch, upstream_dir, store_env, capsys, kind):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    with repo.git.custom_environment(**IDENTITY):
        if kind == "merge":
            repo.git.checkout("-q", "-b", "side", "HEAD~1")
            replace_line(tree / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n")
            repo.git.commit("-aqm", "core: change line 5\n\nSeries: demo\n")
            repo.git.checkout("-q", "patched")
            repo.git.merge("-q", "--no-edit", "side")
        elif kind == "empty":
            repo.git.commit("-q", "--allow-empty", "-m", "core: nothing\n\nSeries: demo\n")
        else:
            (tree / ".gitattributes").write_text("*.py binary\n")
            repo.git.add(".gitattributes")
            repo.git.commit("-qm", "attributes\n\nSeries: demo\n")
    before = snapshot(project / "patches")
    assert _export(project, "--allow-other-upstream") == 2
    err = capsys.readouterr().err
    says = {"merge": "is a merge commit", "empty": "changes nothing", "gitattributes": "changes .gitattributes"}[kind]
    assert says in err and "nothing was written" in err
    assert snapshot(project / "patches") == before


def test_export_of_an_only_tree_keeps_the_other_series_files(project, make_patch, upstream_dir, store_env, capsys):
    """apply-patches --only alpha, then export: beta's patch file (and an edit in it) is not touched."""
    make_patch(upstream_dir, change_line_20, "core: change line 20", "alpha")
    beta = make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "b", "beta"
    )
    assert run_apply(project, upstream_dir)[0] == 0
    assert _export(project, "--allow-other-upstream") == 0  # normalise the hand-made series once
    beta.write_bytes(beta.read_bytes().replace(b"Why and how.", b"Why and how, edited by hand."))
    before = snapshot(project / "patches")
    assert run_apply(project, upstream_dir, "--only", "alpha")[0] == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    replace_line(tree / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 300\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aqm", "core: change line 30\n\nWhy.\n\nSeries: alpha\n")
    capsys.readouterr()
    assert _export(project, "--allow-other-upstream") == 0
    out = capsys.readouterr()
    after = snapshot(project / "patches")
    assert after["beta/b.patch"] == before["beta/b.patch"]  # the hand edit survives
    assert "removed" not in out.out and "beta" not in out.out
    names = [line for line in after["series"].decode().splitlines() if line and not line.startswith("#")]
    assert names == ["alpha/core-change-line-20.patch", "alpha/core-change-line-30.patch", "beta/b.patch"]


def test_sigterm_during_export_leaves_nothing_half_written(project, make_patch, upstream_dir, store_env):
    """SIGTERM arrives while patches/ is being rewritten: it waits until every file is written."""
    from tests.tool.helpers.processes import Forked
    from vllm_overlay import faults

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "b")
    assert run_apply(project, upstream_dir)[0] == 0
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    tree = project / "build" / "patched"
    repo = git.Repo(tree)
    with repo.git.custom_environment(**IDENTITY):  # reword both commits: two patch files change
        repo.git.rebase("-q", "--exec", "git commit -q --amend -m \"$(git log -1 --format=%B | sed s/Why/Because/)\"",
                        repo.git.config("vllm-overlay.upstream"))  # fmt: skip
    before = snapshot(project / "patches")
    process = Forked(
        ["export-patches", "--allow-other-upstream", "--project", str(project)],
        env={faults.TERM_AT_ENV: "export-wrote-one"},
    )
    code, err = process.wait()
    assert code != 0 and "Traceback" not in err  # it was terminated, after the write
    after = snapshot(project / "patches")
    changed = {name for name in after if after[name] != before.get(name)}
    assert len(changed) == 2, changed  # both patch files: all of the new series, not one of them
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project), "--check"]) == 0


@pytest.mark.parametrize(
    ("env_name", "signal_name"), [("VLLM_OVERLAY_INT_AT", "SIGINT"), ("VLLM_OVERLAY_TERM_AT", "SIGTERM")]
)
def test_a_signal_before_the_write_says_in_one_line_that_patches_is_unchanged(
    project, make_patch, upstream_dir, store_env, env_name, signal_name
):
    """Before: Ctrl-C gave a KeyboardInterrupt traceback, SIGTERM ended the run with no line."""
    from tests.tool.helpers.processes import Forked

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    replace_line(tree / "vllm" / "core.py", "line_20 = 200\n", "line_20 = 2000\n")
    with git.Repo(tree).git.custom_environment(**IDENTITY):
        git.Repo(tree).git.commit("-aq", "--amend", "--no-edit")  # an export would change the patch file
    before = snapshot(project / "patches")
    process = Forked(
        ["export-patches", "--allow-other-upstream", "--project", str(project)], env={env_name: "export-read"}
    )
    code, err = process.wait()
    assert (code, err) == (130, "error: interrupted; patches/ unchanged\n"), (signal_name, code, err)
    assert snapshot(project / "patches") == before


def _commit(repo: Path, message: str) -> None:
    helper_git(repo, "add", "-A")
    helper_git(repo, "commit", "-q", "-m", message)


def _series_repository(root: Path, commits: int) -> Path:
    """A repository shaped as apply-patches leaves one: an upstream commit recorded as the base, then
    ``commits`` patch commits, each a different kind of change (text in and out of UTF-8, a file
    added, deleted, made executable, one without a final newline, a Patch-File trailer)."""
    repo = write_upstream(root / "repo", extra={"vllm/tool.py": "run = 1\n", "vllm/old.py": "gone = 1\n"})
    helper_git(repo, "init", "-q", "-b", "patched")
    _commit(repo, "upstream")
    helper_git(repo, "config", "vllm-overlay.upstream", helper_git(repo, "rev-parse", "HEAD").strip())
    helper_git(repo, "config", "format.coverLetter", "auto")  # a range would get a cover letter from it
    kinds = [
        lambda n: replace_line(repo / "vllm" / "core.py", f"line_{n} = {n}\n", f"line_{n} = 'café 日本 {n}'\n"),
        lambda n: (repo / "vllm" / f"mail_{n}.py").write_text(
            f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n---\nvalue = {n}\n"
        ),
        lambda n: (repo / "vllm" / "tool.py").chmod(0o755 if n % 2 else 0o644),
        lambda n: (repo / "vllm" / f"bare_{n}.py").write_text(f"no_newline = {n}"),
        lambda n: replace_line(repo / "vllm" / "core.py", f"line_{n} = {n}\n", f"line_{n} = -{n}\n"),
    ]
    for n in range(1, commits + 1):
        kinds[(n - 1) % len(kinds)](n)
        if n == 3:
            (repo / "vllm" / "old.py").unlink()
        trailer = f"Patch-File: demo/kept-name-{n}.patch\n" if n % 5 == 0 else ""
        _commit(repo, f"core: change {n}, naïvely\n\nFrom the start, why {n}.\n\nSeries: demo\n{trailer}")
    return repo


def _one_commit_at_a_time(repo: Path) -> list[bytes]:
    """What export wrote before it read the range at once: ``git format-patch -1`` of each commit."""
    from vllm_overlay.apply import export

    base = helper_git(repo, "config", "--get", "vllm-overlay.upstream").strip()
    env = dict(os.environ, **export.ISOLATED_ENV, LANGUAGE="C", LC_ALL="C")  # as GitPython ran it
    texts = []
    for sha in helper_git(repo, "rev-list", "--reverse", "--topo-order", f"{base}..HEAD").split():
        text = subprocess.run(
            ["git", "-C", str(repo), "format-patch", "--stdout", *export.FORMAT_PATCH_OPTIONS, "-1", sha],
            env=env,
            check=True,
            capture_output=True,
        ).stdout.decode()
        texts.append(export._drop_patch_file_trailer(text).encode())
    return texts


def test_the_range_exports_the_bytes_each_commit_formatted_alone_gives(tmp_path):
    from vllm_overlay.apply import export

    repo = _series_repository(tmp_path, 10)
    exported = export.export_commits(repo)
    assert [patch.content for patch in exported] == _one_commit_at_a_time(repo)
    assert [patch.name for patch in exported][3:5] == ["demo/core-change-4-na-vely.patch", "demo/kept-name-5.patch"]
    assert not any(b"Patch-File" in patch.content for patch in exported)


def _git_processes_of_an_export(repo: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    from vllm_overlay.apply import export

    started: list[list[str]] = []
    real_init = subprocess.Popen.__init__

    def counting_init(self, args, *rest, **options):  # every process: GitPython's and the tool's own
        started.append(list(args))
        real_init(self, args, *rest, **options)

    with monkeypatch.context() as patched:
        patched.setattr(subprocess.Popen, "__init__", counting_init)
        export.export_commits(repo)
    return sum(1 for argv in started if os.path.basename(str(argv[0])) == "git")


def test_an_export_starts_as_many_git_processes_for_three_commits_as_for_twelve(tmp_path, monkeypatch):
    few = _git_processes_of_an_export(_series_repository(tmp_path / "few", 3), monkeypatch)
    many = _git_processes_of_an_export(_series_repository(tmp_path / "many", 12), monkeypatch)
    assert few == many


def test_author_and_sign_off_survive_apply_and_export_byte_for_byte(project, make_patch, upstream_dir, store_env):
    """The series' maintainer authors and signs off the commit apply makes, whoever runs it, and export
    writes both back as they were: the Patch-File trailer apply adds after the sign-off goes again."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    replace_line(path, f"From: {MAINTAINER}\n", f"From: {ADA}\n")
    replace_line(path, f"Signed-off-by: {MAINTAINER}\n", f"Signed-off-by: {ADA}\n")
    original = path.read_bytes()
    assert run_apply(project, upstream_dir)[0] == 0
    tree = project / "build" / "patched"
    assert helper_git(tree, "log", "-1", "--format=%an <%ae>|%cn <%ce>").strip() == f"{ADA}|{ADA}"
    trailers = helper_git(tree, "log", "-1", "--format=%(trailers:only,unfold)").strip().splitlines()
    assert trailers[-2:] == [f"Signed-off-by: {ADA}", "Patch-File: demo/core-change-line-20.patch"]
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)]) == 0
    assert path.read_bytes() == original
