"""Concurrent, killed and interrupted runs: the previous output stays whole, leftovers go, no traceback.

The runs that must die or be signalled are real processes (forked, to skip an interpreter's
start-up; the one that must wait on a lock this process holds is a fresh subprocess). A stand-in
``git`` (first on PATH) stops at ``git am`` so a run can be caught while a git child is running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.processes import Forked, alive, wait_for
from tests.tool.helpers.repos import REPO_ROOT, change_line_20, replace_line
from vllm_overlay import cli, faults
from vllm_overlay.apply import staging

STOP_AT_AM = """#!/bin/sh
case " $* " in *" am --quiet "*) echo $$ > "{marker}"; exec sleep 30 ;; esac
exec {git} "$@"
"""


def cli_process(project: Path, upstream: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm_overlay.cli", "apply-patches", "--project", str(project)]
    argv += ["--upstream", str(upstream), "--base-upstream", str(upstream), *extra]
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=dict(os.environ, **(env or {})), stderr=subprocess.PIPE, text=True)


def apply_argv(project: Path, upstream: Path) -> list[str]:
    return ["apply-patches", "--project", str(project), "--upstream", str(upstream), "--base-upstream", str(upstream)]


def no_wait_argv(project: Path, upstream: Path) -> list[str]:
    where = ["--project", str(project), "--upstream", str(upstream), "--base-upstream", str(upstream)]
    return ["apply-patches", *where, "--no-wait"]


def snapshot(output: Path) -> tuple[str, str, str]:
    repo = git.Repo(output)
    return repo.head.commit.hexsha, repo.git.status("--porcelain", "--ignored"), (output / "vllm/core.py").read_text()


def beside(output: Path) -> list[str]:
    return sorted(p.name for p in output.parent.iterdir())


# What lies beside the output after a run that replaced a tree: the lock, the replaced tree kept as
# the spare, the output. A run that replaced nothing leaves no spare.
AFTER_A_REPLACE = [".patched.lock", ".patched.spare", "patched"]
UNREPLACED = [".patched.lock", "patched"]


@pytest.fixture
def built(project, make_patch, upstream_dir, store_env):
    """build/patched holds patch 1; patch 2 is then added, so the next run would change the output."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm/core.py", "line_5 = 5\n", "line_5 = 50\n"), "b")
    return project / "build" / "patched"


@pytest.fixture
def stop_at_am(tmp_path) -> tuple[dict[str, str], Path]:
    bin_dir, marker = tmp_path / "bin", tmp_path / "am.pid"
    bin_dir.mkdir()
    wrapper = bin_dir / "git"
    wrapper.write_text(
        STOP_AT_AM.format(marker=marker, git=subprocess.check_output(["which", "git"], text=True).strip())
    )
    wrapper.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_PYTHON_GIT_EXECUTABLE": str(wrapper)}, marker


@pytest.mark.parametrize("phase", ["checked-out", "committed", "publish", "published"])
def test_killed_run_leaves_the_output_whole_and_the_next_run_cleans_up(built, project, upstream_dir, phase):
    before = snapshot(built)
    code, _err = Forked(apply_argv(project, upstream_dir), env={faults.KILL_AT_ENV: phase}).wait()
    assert code == -signal.SIGKILL
    if phase == "published":  # the exchange happened: the output is the new tree, whole
        after = snapshot(built)
        assert after[0] != before[0] and after[1] == "" and "line_5 = 50\n" in after[2]
    else:
        assert snapshot(built) == before
    assert any(".patched.staging-" in name for name in beside(built))  # what the kill left
    assert run_apply(project, upstream_dir)[0] == 0
    # Killed after the exchange, the tree it replaced went with the staging area: the next run
    # finds the new tree published and has nothing to replace.
    assert beside(built) == (UNREPLACED if phase == "published" else AFTER_A_REPLACE)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_run_says_one_line_and_ends_its_git(built, project, upstream_dir, stop_at_am, sig):
    before = snapshot(built)
    env, marker = stop_at_am
    process = Forked(apply_argv(project, upstream_dir), env=env)
    child = wait_for(marker, process)
    os.kill(process.pid, sig)
    code, err = process.wait()
    assert code == 130
    assert err.splitlines()[-1] == f"error: interrupted; {built} unchanged"
    assert "Traceback" not in err
    assert not alive(child)
    assert snapshot(built) == before
    assert beside(built) == UNREPLACED


def test_second_run_waits_or_with_no_wait_names_the_holder(built, project, upstream_dir, capsys):
    before = snapshot(built)
    with staging.output_lock(built):
        assert cli.main(no_wait_argv(project, upstream_dir)) == 2
        assert f"is being written by pid {os.getpid()}" in capsys.readouterr().err
        waiting = cli_process(project, upstream_dir)
        assert waiting.stderr is not None
        lines = [waiting.stderr.readline(), waiting.stderr.readline()]  # "applying ...", then "waiting ..."
        assert f"waiting for pid {os.getpid()}, which is writing {built}" in lines[1]
        assert snapshot(built) == before
    _out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert "line_5 = 50\n" in (built / "vllm/core.py").read_text()


def test_leftover_cleanup_spares_a_live_run_and_restores_a_retired_tree(tmp_path):
    output = tmp_path / "patched"
    live = staging.create_staging(output)  # this process is its owner, and alive
    dead = staging.create_staging(tmp_path / "other")
    dead.root.rename(tmp_path / ".patched.staging-1")  # an owner that is gone ...
    os.close(dead.owner_fd)
    (tmp_path / ".patched.staging-1" / staging.RETIRED).mkdir()  # ... killed between two renames
    (tmp_path / ".patched.staging-1" / staging.RETIRED / "kept").write_text("old tree")
    removed = staging.remove_leftovers(output)
    assert removed == [tmp_path / ".patched.staging-1"]
    assert live.root.is_dir() and (output / "kept").read_text() == "old tree"
    live.remove()
    assert not live.root.exists()


def test_next_run_removes_a_tree_a_killed_publish_retired(built, project, upstream_dir):
    retired = built.parent / ".patched.retired-4242"  # what a kill inside a two-rename publish left
    (retired / "vllm").mkdir(parents=True)
    (retired / "vllm" / "core.py").write_text("the tree before\n")
    assert run_apply(project, upstream_dir)[0] == 0
    assert beside(built) == AFTER_A_REPLACE


def test_second_run_never_touches_a_live_run(built, project, upstream_dir, stop_at_am, capsys):
    env, marker = stop_at_am
    first = Forked(apply_argv(project, upstream_dir), env=env)
    wait_for(marker, first)
    (area,) = [p for p in built.parent.iterdir() if p.name.startswith(".patched.staging-")]
    assert cli.main(no_wait_argv(project, upstream_dir)) == 2
    assert f"is being written by pid {first.pid}" in capsys.readouterr().err
    assert (area / "tree" / ".git").is_dir()  # the first run's staging clone is still there
    os.kill(first.pid, signal.SIGTERM)
    assert first.wait()[0] == 130


def test_two_rename_publish_where_no_exchange_is_possible(built, project, upstream_dir, monkeypatch):
    monkeypatch.setattr(staging, "_renameat2_exchange", lambda a, b: False)  # a file system without it
    replaced = built.stat().st_ino
    assert run_apply(project, upstream_dir)[0] == 0
    assert "line_5 = 50\n" in (built / "vllm/core.py").read_text()
    assert beside(built) == AFTER_A_REPLACE
    assert (built.parent / ".patched.spare").stat().st_ino == replaced  # the retired tree, kept


def _git_processes_under(root: Path) -> list[int]:
    """git processes working under ``root`` that this test process did not start (a killed run's orphans).

    GitPython keeps ``git cat-file --batch`` children of the test's own Repo objects: those are ours.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if parent == os.getpid():
            continue
        if cmdline and Path(cmdline[0].decode(errors="replace")).name == "git" and cwd.startswith(str(root)):
            found.append(int(proc.name))
    return found


def test_sigkill_at_twenty_random_moments_then_a_normal_run(built, project, upstream_dir, tmp_path):
    """Killed anywhere (20 moments, seeded), the output stays one whole tree and the next run recovers."""
    import random

    reference = tmp_path / "reference"
    assert run_apply(project, upstream_dir, "--output", str(reference))[0] == 0
    wanted_tree = git.Repo(reference).head.commit.tree.hexsha
    moments = random.Random(20261201)
    for _ in range(20):
        before = snapshot(built)
        process = cli_process(project, upstream_dir, "--discard-unexported")
        time.sleep(moments.uniform(0.0, 1.5))
        process.kill()
        process.communicate(timeout=60)
        now = snapshot(built)  # whole at every instant: the old tree or the new one
        assert now == before or "line_5 = 50\n" in now[2]
    assert run_apply(project, upstream_dir)[0] == 0
    repo = git.Repo(built)
    assert repo.head.commit.tree.hexsha == wanted_tree
    assert repo.git.fsck("--no-progress", "--full") == ""
    assert beside(built) in (UNREPLACED, AFTER_A_REPLACE)  # a spare where a killed run's publish was not the last
    deadline = time.monotonic() + 10  # a killed run's git children exit once their pipe closes
    while _git_processes_under(project) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _git_processes_under(project)
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs (needs root and mount(2)); skipped where it cannot be mounted."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_output_file_system_full_keeps_the_previous_tree(built, project, upstream_dir, small_tmpfs, capsys):
    target = small_tmpfs / "patched"
    assert run_apply(project, upstream_dir, "--output", str(target))[0] == 0
    before = snapshot(target)
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as handle:  # leave a few KiB: the next run's clone cannot fit
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        handle.write(b"\0" * max(free - 8192, 0))
    capsys.readouterr()
    # --rebuild: the output already holds this build, which an unchanged re-apply would leave as it is.
    code, _report = run_apply(project, upstream_dir, "--output", str(target), "--discard-unexported", "--rebuild")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "No space left on device" in err and f"{target} unchanged" in err
    filler.unlink()
    assert snapshot(target) == before
    assert git.Repo(target).git.fsck("--no-progress") == ""


@pytest.mark.parametrize("left", [65536, 200_000])
def test_a_git_step_that_runs_out_of_space_says_the_disk_is_full(
    built, project, upstream_dir, small_tmpfs, capsys, left
):
    """Before: git's own words ("failed to write new configuration file .../config.lock",
    "could not write to ...") were all a full disk got. With this much left, the clone or git am runs
    out of space part way (which one depends on ``left``)."""
    target = small_tmpfs / "patched"
    assert run_apply(project, upstream_dir, "--output", str(target))[0] == 0
    before = snapshot(target)
    with open(small_tmpfs / "filler", "wb") as handle:
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        handle.write(b"\0" * max(free - left, 0))
    capsys.readouterr()
    code, _report = run_apply(project, upstream_dir, "--output", str(target), "--discard-unexported", "--rebuild")
    said = capsys.readouterr().err
    err = said.split("\nerror: ", 1)[-1]
    assert code == 2 and err.count("\n") == 1, said  # the error is one line, and the last
    err = "error: " + err.rstrip("\n")
    assert err.startswith(f"error: cannot write beside {target}: the file system holding {small_tmpfs} is full ("), err
    assert err.endswith(f"; {target} unchanged"), err
    (small_tmpfs / "filler").unlink()
    assert snapshot(target) == before
