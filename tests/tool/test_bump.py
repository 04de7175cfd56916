"""bump is safe at every step: markers refuse --continue, downgrades need a flag, patches/ and
upstream.lock change only on success and --abort restores them, recorded resolutions are reused."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess

import git
import pytest

from tests.tool.helpers.processes import Forked, alive, wait_for
from tests.tool.helpers.repos import REPO_ROOT, change_line_20, replace_line, write_upstream
from vllm_overlay import bump, cli, errors, series, testrun
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees


def snapshot(project):
    files = {p.relative_to(project).as_posix(): p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}
    files["upstream.lock"] = (project / "upstream.lock").read_bytes()
    return files


@pytest.fixture
def conflicting(project, make_patch, tmp_path, store_env):
    """A two-patch series and a new upstream on which the second patch conflicts."""
    old = write_upstream(tmp_path / "old")
    make_patch(old, change_line_20, "change 20")
    make_patch(old, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "change 5")
    new = write_upstream(tmp_path / "new")
    replace_line(new / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 5  # upstream\n")
    the_lock = lock.load(project / "upstream.lock")
    store = Store()
    return store, upstream_trees.obtain(str(old), the_lock, store), upstream_trees.obtain(str(new), the_lock, store)


def resolve_by_hand(repo_dir):
    core = repo_dir / "vllm" / "core.py"
    text = core.read_text()
    resolved = text.split("<<<<<<<")[0] + "line_5 = 50  # upstream\n" + text.split(">>>>>>>")[1].split("\n", 1)[1]
    core.write_text(resolved)
    git.Repo(repo_dir).git.add("vllm/core.py")


def test_continue_refuses_markers_and_resolutions_are_reused(project, conflicting, tmp_path):
    store, old_up, new_up = conflicting
    repo_dir = tmp_path / "build" / "bump"
    patches = series.load_series(project / "patches")
    with pytest.raises(bump.BumpError):
        bump.start(patches, new_up, store, repo_dir, "new", seed_base=old_up.commit)
    git.Repo(repo_dir).git.add("vllm/core.py")  # marked resolved, but the markers are still there
    with pytest.raises(bump.BumpError) as refused:
        bump.resume(repo_dir)
    assert f"{repo_dir}/vllm/core.py:5" in str(refused.value) and "conflict markers" in str(refused.value)
    resolve_by_hand(repo_dir)
    bump.resume(repo_dir)
    first = (repo_dir / "vllm" / "core.py").read_text()
    assert "line_5 = 50  # upstream" in first
    bump.abort(repo_dir)
    assert bump.rr_cache_dir(repo_dir).is_dir()
    # The second bump over the same conflict replays the recorded resolution: no stop, same result.
    bump.start(patches, new_up, store, repo_dir, "new", seed_base=old_up.commit)
    assert (repo_dir / "vllm" / "core.py").read_text() == first
    assert not bump.am_in_progress(git.Repo(repo_dir))


def test_downgrade_needs_the_flag():
    with pytest.raises(bump.BumpError, match="downgrade needs --allow-downgrade"):
        bump.check_direction("0.33.0", "0.32.0", allow_downgrade=False)
    bump.check_direction("0.33.0", "0.32.0", allow_downgrade=True)
    bump.check_direction("0.33.0", "0.33.1", allow_downgrade=False)
    bump.check_direction("0.33.0rc1", "0.33.0", allow_downgrade=False)


@pytest.fixture
def command(project, conflicting, monkeypatch):
    """scripts/bump on the synthetic upstream: the release and its lock stand in for the index."""
    _store, old_up, new_up = conflicting
    the_lock = lock.load(project / "upstream.lock")
    release = dataclasses.replace(new_up, kind="release", version="0.34.0")
    monkeypatch.setattr(upstream_trees, "obtain", lambda spec, lk, st: old_up if spec is None else release)
    wheels = {
        arch: lock.Artifact(w.filename.replace("0.33.0", "0.34.0"), "e" * 64) for arch, w in the_lock.wheels.items()
    }
    sdist = lock.Artifact("vllm-0.34.0.tar.gz", "d" * 64)
    relocked = dataclasses.replace(the_lock, version="0.34.0", sdist=sdist, wheels=wheels)  # a lock of one release
    monkeypatch.setattr(bump, "new_lock", lambda old, upstream, st: relocked)
    tests_pass = {"value": True}

    def run_patch_tests(proj, options):
        assert proj.root == project.resolve() and options == testrun.PatchTestOptions()  # its defaults
        return testrun.PatchTestResult(0 if tests_pass["value"] else 1)

    monkeypatch.setattr(testrun, "run_patch_tests", run_patch_tests)

    def run(*args):
        return cli.main(["bump", "--project", str(project), *args])

    return run, tests_pass


def test_failed_tests_and_abort_restore_patches_and_lock(project, command, capsys):
    run, tests_pass = command
    before = snapshot(project)
    assert run("0.34.0") == 1  # stopped at the conflict: nothing of the project touched
    assert snapshot(project) == before
    repo_dir = project / "build" / "bump"
    resolve_by_hand(repo_dir)
    tests_pass["value"] = False
    assert run("--continue") == 1
    assert snapshot(project) == before  # tests failed: both restored
    assert "test-patches failed" in capsys.readouterr().err
    tests_pass["value"] = True
    assert run("--continue") == 0
    after = snapshot(project)
    assert after != before and 'version = "0.34.0"' in after["upstream.lock"].decode()
    assert "line_5 = 50  # upstream" in after["patches/demo/change-5.patch"].decode()
    capsys.readouterr()
    assert run("--abort") == 0
    assert snapshot(project) == before
    said = capsys.readouterr().err
    differing = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    assert "upstream.lock" in differing and "patches/demo/change-5.patch" in differing
    assert f"restored {len(differing)} file(s) to what they were before the bump: {', '.join(differing)}" in said


def test_an_input_error_of_the_tests_fails_the_bump_as_their_exit_code(project, command, monkeypatch, capsys):
    """test-patches' input errors end as its exit code did through cli.main: one line, exit 2, restored."""
    run, _ = command
    before = snapshot(project)
    assert run("0.34.0") == 1
    resolve_by_hand(project / "build" / "bump")

    def refused(proj, options):
        raise errors.InputError("the test environment is not pristine")

    monkeypatch.setattr(testrun, "run_patch_tests", refused)
    capsys.readouterr()
    assert run("--continue") == 1
    assert snapshot(project) == before
    said = capsys.readouterr().err
    assert "the test environment is not pristine" in said and "test-patches failed (exit 2)" in said


def test_tests_interrupted_fail_the_bump_as_their_exit_code(project, command, monkeypatch, capsys):
    """test-patches' Ctrl-C line (exit 130 through cli.main) inside a bump: said, restored, exit 1."""
    run, _ = command
    before = snapshot(project)
    assert run("0.34.0") == 1
    resolve_by_hand(project / "build" / "bump")

    def interrupted(proj, options):
        raise errors.Interrupted("interrupted; the shared test environment was not modified")

    monkeypatch.setattr(testrun, "run_patch_tests", interrupted)
    capsys.readouterr()
    assert run("--continue") == 1
    assert snapshot(project) == before
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "error: interrupted; the shared test environment was not modified"
    assert said[1].startswith("error: test-patches failed (exit 130): restored ")


def test_abort_leaves_a_committed_bump_alone(project, command, capsys):
    run, _ = command
    before = snapshot(project)
    assert run("0.34.0") == 1
    resolve_by_hand(project / "build" / "bump")
    assert run("--continue", "--no-test") == 0
    repo = git.Repo.init(project)
    repo.git.add("patches", "upstream.lock")
    repo.git.commit("-qm", "bump", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
                                         "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"})  # fmt: skip
    committed = snapshot(project)
    assert committed != before
    capsys.readouterr()
    assert run("--abort") == 0
    assert snapshot(project) == committed
    assert "committed: left as they are" in capsys.readouterr().err


def test_a_downgrade_is_refused_by_the_command(project, command, monkeypatch, capsys):
    run, _ = command
    relocked = lock.load(REPO_ROOT / "upstream.lock")
    assert relocked.version == "0.33.0"
    real = upstream_trees.obtain
    monkeypatch.setattr(
        upstream_trees, "obtain", lambda spec, lk, st: dataclasses.replace(real(spec, lk, st), version="0.1.0")
    )
    assert run("0.1.0") == 1
    assert "downgrade needs --allow-downgrade" in capsys.readouterr().err


def _users_repository(root):
    """The user's own clone (say of vLLM), with work in progress: bump must never touch it."""
    root.mkdir()
    (root / "vllm").mkdir()
    (root / "vllm" / "mine.py").write_text("work = 'in progress'\n")
    repo = git.Repo.init(root)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "mine"])
    (root / "vllm" / "mine.py").write_text("work = 'uncommitted'\n")
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("action", [("0.34.0",), ("--abort",)])
def test_bump_never_touches_a_repository_it_did_not_make(project, command, tmp_path, capsys, action):
    run, _tests_pass = command
    foreign = tmp_path / "users-vllm"
    before = _users_repository(foreign)
    project_before = snapshot(project)
    assert run(*action, "--repo", str(foreign)) == 2
    assert "is not a repository bump made" in capsys.readouterr().err
    after = {p.relative_to(foreign).as_posix(): p.read_bytes() for p in sorted(foreign.rglob("*")) if p.is_file()}
    assert after == before
    assert snapshot(project) == project_before


# Only bump's own git am in build/bump stops: the drop check before it applies the series in a scratch tree.
STOP_AT_AM = """#!/bin/sh
if [ "$1" = am ] && [ "$2" = --3way ] && [ "${{PWD##*/}}" = bump ]; then echo $$ > "{marker}"; exec sleep 30; fi
exec {git} "$@"
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_bump_ends_its_git_and_abort_then_cleans_up(project, command, tmp_path, sig):
    run, _tests_pass = command
    before = snapshot(project)
    bin_dir, marker = tmp_path / "bin", tmp_path / "am.pid"
    bin_dir.mkdir()
    real_git = subprocess.check_output(["which", "git"], text=True).strip()
    (bin_dir / "git").write_text(STOP_AT_AM.format(marker=marker, git=real_git))
    (bin_dir / "git").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_PYTHON_GIT_EXECUTABLE": str(bin_dir / "git")}
    process = Forked(["bump", "--project", str(project), "0.34.0"], env=env)
    child = wait_for(marker, process)
    os.kill(process.pid, sig)
    code, err = process.wait()
    repo_dir = project / "build" / "bump"
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"error: interrupted; patches/ and upstream.lock unchanged (the bump's repository stays in {repo_dir}: "
        "--continue or --abort)"
    )
    assert not alive(child)
    assert snapshot(project) == before
    assert run("--abort") == 0
    assert not repo_dir.exists() and snapshot(project) == before


@pytest.fixture
def two_lines(project, make_patch, tmp_path, store_env, monkeypatch):
    """Two patches and a CPU carry of both; the next release has both fixes, the CPU line's next only one."""

    def landed(number):
        return lambda t: replace_line(t / "vllm" / "core.py", f"line_{number} = {number}\n", f"line_{number} = 0\n")

    old = write_upstream(tmp_path / "old")
    make_patch(old, landed(35), "everywhere", series="landed")
    make_patch(old, landed(10), "locked only", series="held")
    (project / "cpu").mkdir()
    shutil.copy(project / "upstream.lock", project / "cpu" / "upstream.lock")
    shutil.copytree(project / "patches", project / "cpu" / "patches")
    new, cpu_next = write_upstream(tmp_path / "new"), write_upstream(tmp_path / "cpu-next")
    landed(35)(new), landed(10)(new), landed(35)(cpu_next)
    the_lock, store = lock.load(project / "upstream.lock"), Store()
    old_up = upstream_trees.obtain(str(old), the_lock, store)
    release = dataclasses.replace(upstream_trees.obtain(str(new), the_lock, store), kind="release", version="0.34.0")
    cpu_up = upstream_trees.obtain(str(cpu_next), the_lock, store)
    by_spec = {None: old_up, "cpu-next": cpu_up}
    monkeypatch.setattr(upstream_trees, "obtain", lambda spec, lk, st: by_spec.get(spec, release))

    def run(*args):
        return cli.main(["bump", "--project", str(project), *args])

    return run


def test_a_fix_on_one_line_only_is_not_dropped(project, two_lines):
    before = snapshot(project)
    assert two_lines("0.34.0", "--drop") == 0  # the CPU line, on its own lock, has neither fix
    after = snapshot(project)
    assert set(after) == set(before)  # no file left the series; the held patches' headers say what was found
    for name in ("landed/everywhere.patch", "held/locked-only.patch"):
        assert series.load_patch(project / "patches", name).value("Applied-Upstream") == "0.34.0 (locked line)"
    assert "landed/everywhere.patch" in (project / "patches" / "series").read_text()
    assert (project / "tests" / "patches" / "landed" / "test_demo.py").is_file()
    assert not (project / "tests" / "upstream-behaviour").exists()


def test_a_fix_on_every_line_is_proposed_then_dropped_as_its_own_step(project, two_lines, capsys):
    before = snapshot(project)
    assert two_lines("0.34.0", "--line-upstream", "cpu=cpu-next") == 1  # proposed: nothing changed yet
    said = capsys.readouterr().err
    assert "landed/everywhere.patch: locked 0.34.0: has it / cpu" in said and "--drop" in said
    assert snapshot(project) == before and not (project / "build" / "bump").exists()
    assert two_lines("0.34.0", "--drop", "--line-upstream", "cpu=cpu-next") == 0
    for patches in (project / "patches", project / "cpu" / "patches"):
        assert "landed/everywhere.patch" not in (patches / "series").read_text()
        assert not (patches / "landed").exists() and (patches / "held" / "locked-only.patch").is_file()
    assert not (project / "tests" / "patches" / "landed" / "test_demo.py").exists()
    assert (project / "tests" / "upstream-behaviour" / "landed" / "test_demo.py").is_file()
    log = (project / "docs" / "drops.md").read_text()
    assert "| landed/everywhere.patch | 0.34.0 | locked 0.34.0: has it / cpu" in log
    assert "tests/upstream-behaviour/landed/test_demo.py |" in log
    held = series.load_patch(project / "patches", "held/locked-only.patch")
    assert held.value("Applied-Upstream") == "0.34.0 (locked line)"
    assert held.value("Forwarded").startswith("not-needed (upstream has the fix; carried only for: cpu ")
    assert series.load_patch(project / "cpu" / "patches", "held/locked-only.patch").value("Applied-Upstream") is None


def test_a_carried_patch_keeps_its_author_and_sign_off(project, make_patch, tmp_path, store_env):
    """carry-cpu carries the series onto another release with bump's git am and exports it: the patch's
    From: and Signed-off-by: come out as they went in (bump's committer is never written)."""
    from tests.tool.helpers.repos import MAINTAINER
    from vllm_overlay.apply import export

    ada = "Ada Lovelace <ada@example.org>"
    old = write_upstream(tmp_path / "old")
    path = make_patch(old, change_line_20, "change 20")
    replace_line(path, f"From: {MAINTAINER}\n", f"From: {ada}\n")
    replace_line(path, f"Signed-off-by: {MAINTAINER}\n", f"Signed-off-by: {ada}\n")
    new = write_upstream(tmp_path / "new")
    replace_line(new / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 5  # upstream\n")
    the_lock, store = lock.load(project / "upstream.lock"), Store()
    old_up = upstream_trees.obtain(str(old), the_lock, store)
    new_up = upstream_trees.obtain(str(new), the_lock, store)
    repo_dir = tmp_path / "build" / "bump"
    bump.start(series.load_series(project / "patches"), new_up, store, repo_dir, "new", seed_base=old_up.commit)
    [carried] = export.export_commits(repo_dir)
    assert carried.content.split(b"\n---\n")[0] == path.read_bytes().split(b"\n---\n")[0]
