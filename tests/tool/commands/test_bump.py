"""bump's command module: its arguments, the steps run drives from them, and its exit codes.

Starting a bump downloads a release and runs git am; re-locking reads the package index; the final
test-patches run builds an environment. The tests stand in for exactly those calls (upstream_trees
.obtain, bump.start / resume / new_lock / install / restore, BumpState.load, the module's own
_test_patches), at the attributes the command looks them up by (``from vllm_overlay import bump,
lock, series, upstream_trees`` inside _run). The refusals that come before any of them run for real.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import bump, cli, drops, interrupts
from vllm_overlay.commands import bump as bump_command
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

OPTIONS = ("--project", "--index-url", "--continue", "--abort", "--repo", "--no-test", "--allow-downgrade")
UPSTREAM = {
    "kind": "release",
    "label": "0.34.0",
    "tag": "release/0.34.0",
    "commit": "c" * 40,
    "version": "0.34.0",
    "release_commit": "abc1234",
    "sha256": "0" * 64,
    "origin": "index",
}


def upstream(**fields) -> upstream_trees.Upstream:
    return upstream_trees.Upstream(**{**UPSTREAM, **fields})


@pytest.fixture
def resumed(monkeypatch):
    """A bump whose git am is done: resume, the state, the new lock and install stood in; test-patches too."""
    recorded = SimpleNamespace(calls=[], test_code=0)
    relocked = SimpleNamespace(project="vllm", version="0.34.0", commit="abc1234")

    def note(name, value=None):
        def fake(*args, **kwargs):
            recorded.calls.append((name, args))
            return value

        return fake

    monkeypatch.setattr(bump, "resume", note("resume"))
    monkeypatch.setattr(bump.BumpState, "load", staticmethod(lambda repo: SimpleNamespace(upstream=UPSTREAM)))
    monkeypatch.setattr(bump, "new_lock", note("new_lock", relocked))
    monkeypatch.setattr(bump, "install", note("install", ["patches/demo/a.patch", "upstream.lock"]))
    monkeypatch.setattr(bump, "restore", note("restore", ["upstream.lock"]))
    monkeypatch.setattr(
        bump_command, "_test_patches", lambda proj: recorded.calls.append(("test", proj.root)) or recorded.test_code
    )
    return recorded


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("bump", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "[version]" in text.split("\n\n")[0]
    assert "Exit codes: 0 bumped (and tests passed)" in text


@pytest.mark.parametrize("argv", [[], ["0.34.0", "--abort"], ["--continue", "--abort"], ["0.34.0", "--continue"]])
def test_anything_but_exactly_one_of_version_continue_abort_is_exit_2(project, store_env, capsys, argv):
    assert cli.main(["bump", "--project", str(project), *argv]) == 2
    assert capsys.readouterr().err == "error: give exactly one of: VERSION, --continue, --abort\n"
    assert not (project / "build").exists() and not store_env.exists()


def test_abort_without_a_bump_is_refused(project, store_env, capsys):
    assert cli.main(["bump", "--project", str(project), "--abort"]) == 1
    assert capsys.readouterr().err == f"error: {project.resolve() / 'build' / 'bump'}: no bump in progress\n"


def test_continue_without_a_bump_is_refused(project, store_env, capsys, tmp_path):
    repo = tmp_path / "mine"
    assert cli.main(["bump", "--project", str(project), "--continue", "--repo", str(repo)]) == 1
    assert capsys.readouterr().err == f"error: {repo}: no bump in progress (start one with: scripts/bump VERSION)\n"


@pytest.mark.parametrize("argv", [["0.34.0"], ["--abort"]])
def test_a_repo_bump_did_not_make_is_exit_2_and_untouched(project, store_env, capsys, tmp_path, monkeypatch, argv):
    monkeypatch.setattr(upstream_trees, "obtain", lambda *a: pytest.fail("a release was asked for"))
    repo = tmp_path / "mine"
    repo.mkdir()
    (repo / "thesis.txt").write_text("four years\n")
    assert cli.main(["bump", "--project", str(project), "--repo", str(repo), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {repo}") and len(err.splitlines()) == 1
    assert sorted(p.name for p in repo.iterdir()) == ["thesis.txt"]


def test_a_version_is_obtained_against_the_lock_and_must_be_a_release(project, store_env, capsys, monkeypatch):
    asked = []
    monkeypatch.setattr(
        upstream_trees,
        "obtain",
        lambda spec, the_lock, store: asked.append((spec, the_lock)) or upstream(kind="directory"),
    )
    assert cli.main(["bump", "--project", str(project), "./some/dir"]) == 2
    assert asked == [("./some/dir", lock.load(project / "upstream.lock"))]
    assert capsys.readouterr().err == (
        "error: bump needs a published release number; use audit-upstream for directories and git\n"
    )


@pytest.mark.parametrize("allow", [False, True])
def test_allow_downgrade_reaches_the_direction_check(project, store_env, capsys, monkeypatch, tmp_path, allow):
    monkeypatch.setattr(
        upstream_trees, "obtain", lambda spec, the_lock, store: upstream(version="0.1.0", label="0.1.0")
    )
    started = []

    def fake_start(patches, up, store, repo_dir, spec, seed_base):
        started.append((up.version, repo_dir, spec, seed_base))
        raise bump.BumpError("stopped at a conflict in demo/a.patch")

    monkeypatch.setattr(bump, "start", fake_start)
    # The drop check between the direction check and the start: nothing to drop (it would apply the
    # series onto the stand-in upstream, which no cache holds).
    monkeypatch.setattr(drops, "plan", lambda root, new, store, specs=None: drops.DropPlan("0.1.0"))
    repo = tmp_path / "bump-here"
    argv = ["bump", "--project", str(project), "0.1.0", "--repo", str(repo), *(["--allow-downgrade"] if allow else [])]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    if allow:
        assert started == [("0.1.0", repo, "0.1.0", UPSTREAM["commit"])]
        assert err.endswith("error: stopped at a conflict in demo/a.patch\n")
    else:
        assert started == []
        assert err.startswith("error: ") and "--allow-downgrade" in err


def test_a_finished_bump_installs_tests_and_says_what_changed(project, store_env, resumed, capsys):
    assert cli.main(["bump", "--project", str(project), "--continue"]) == 0
    repo = project.resolve() / "build" / "bump"
    assert [name for name, _ in resumed.calls] == ["resume", "new_lock", "install", "test"]
    assert resumed.calls[0][1] == (repo,)
    assert resumed.calls[1][1][1] == upstream()  # re-locked to the upstream the bump state records
    assert resumed.calls[2][1][:3] == (repo, project.resolve() / "patches", project.resolve() / "upstream.lock")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "series refreshed onto 0.34.0: 2 file(s) changed: patches/demo/a.patch, upstream.lock"
    assert out[1] == "upstream.lock now pins vllm 0.34.0 (commit abc1234)"


def test_no_test_skips_test_patches(project, store_env, resumed):
    assert cli.main(["bump", "--project", str(project), "--continue", "--no-test"]) == 0
    assert [name for name, _ in resumed.calls] == ["resume", "new_lock", "install"]


def test_failing_tests_restore_the_files_and_exit_1(project, store_env, resumed, capsys):
    resumed.test_code = 1
    assert cli.main(["bump", "--project", str(project), "--continue"]) == 1
    assert [name for name, _ in resumed.calls] == ["resume", "new_lock", "install", "test", "restore"]
    err = capsys.readouterr().err
    assert "error: test-patches failed (exit 1): restored 1 file(s) of patches/ and upstream.lock" in err


def test_an_interrupt_is_exit_130_and_says_nothing_changed(project, store_env, monkeypatch, capsys):
    ended = []
    monkeypatch.setattr(interrupts, "end_child_processes", lambda: ended.append(True))  # never signal pytest's own

    def interrupted(repo_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(bump, "resume", interrupted)
    assert cli.main(["bump", "--project", str(project), "--continue"]) == 130
    assert ended == [True]
    assert capsys.readouterr().err == "error: interrupted; patches/ and upstream.lock unchanged\n"


def test_a_project_without_a_lock_is_exit_2_in_one_line(tmp_path, store_env, capsys):
    assert cli.main(["bump", "--project", str(tmp_path), "0.34.0"]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"
    assert not Path(tmp_path / "build").exists()
