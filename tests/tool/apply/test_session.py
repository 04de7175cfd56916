"""apply-patches as a whole: the output's unexported work is never thrown away unless asked, and a run waits for
(or, with --no-wait, refuses) the cache's lock, saying once whose run it waits for."""

from __future__ import annotations

import os
from pathlib import Path

import git

from tests.tool.helpers.apply_runs import apply_code, patched_head
from tests.tool.helpers.repos import IDENTITY, change_line_20
from vllm_overlay import cli

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
import time
time.sleep(600)  # until the test ends it
"""


def test_unexported_work_in_the_output_is_never_thrown_away(built, upstream_dir, capsys):
    """A commit or an edit made in build/patched and not exported yet: refused until exported or discarded."""
    tree = built / "build" / "patched"
    repo = git.Repo(tree)
    core = tree / "vllm" / "core.py"
    core.write_text(core.read_text().replace("line_30 = 30\n", "line_30 = 300\n"))
    assert apply_code(built, upstream_dir) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes: vllm/core.py" in err and "--discard-unexported" in err
    assert "line_30 = 300" in core.read_text()
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aqm", "core: change line 30\n\nWhy.\n\nSeries: demo\n")
    made = repo.head.commit.hexsha
    assert apply_code(built, upstream_dir) == 2
    assert "commits not exported to patches/" in capsys.readouterr().err
    assert patched_head(built) == made
    # Exported: the work is in patches/ now, so the tree may be replaced (and gets it back from there).
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(built)]) == 0
    assert apply_code(built, upstream_dir) == 0
    assert "line_30 = 300" in core.read_text()


def test_discard_unexported_replaces_the_output_on_purpose(built, upstream_dir):
    tree = built / "build" / "patched"
    (tree / "scratch.txt").write_text("throw me away\n")
    where = ["--project", str(built), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    assert cli.main(["apply-patches", *where]) == 2
    assert cli.main(["apply-patches", *where, "--discard-unexported"]) == 0
    assert not (tree / "scratch.txt").exists()


def test_a_tree_whose_commits_were_exported_is_replaced_after_patches_change(built, upstream_dir):
    """Rebased and exported, then patches/ moves on (a pull): the tree's work is in patches/, so no refusal."""
    tree = built / "build" / "patched"
    repo = git.Repo(tree)
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-q", "--amend", "-m", repo.head.commit.message.replace("Why and how.", "Why, and how."))
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(built)]) == 0
    patch = built / "patches" / "demo" / "core-change-line-20.patch"
    patch.write_bytes(patch.read_bytes().replace(b"Why, and how.", b"Why, and how (pulled)."))
    assert apply_code(built, upstream_dir) == 0


def _cache_lock_holder(store_env: Path):
    """Another process holding the cache's lock, as another run of the tool would (its pid written in it)."""
    import subprocess
    import sys

    store_env.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store_env / ".lock")], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    return holder


def _finish_within(process, seconds: float) -> tuple[int, str] | None:
    """The forked run's exit code and stderr, or None (it is killed) when it still runs after ``seconds``."""
    import os
    import signal
    import time

    deadline = time.monotonic() + seconds
    while True:
        pid, status = os.waitpid(process.pid, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status), process.stderr.read()
        if time.monotonic() > deadline:
            os.kill(process.pid, signal.SIGKILL)
            os.waitpid(process.pid, 0)
            return None
        time.sleep(0.05)


def test_no_wait_does_not_wait_for_the_cache_lock(project, make_patch, upstream_dir, store_env):
    """Before: --no-wait while another run held the cache's lock waited silently (40 s and on)."""
    from tests.tool.helpers.processes import Forked

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    holder = _cache_lock_holder(store_env)
    try:
        up = str(upstream_dir)
        argv = ["apply-patches", "--project", str(project), "--upstream", up, "--base-upstream", up, "--no-wait"]
        done = _finish_within(Forked(argv), 20)
    finally:
        holder.kill()  # the other run ends (a pipe to it would be inherited by the forked run: not that)
        holder.wait()
    assert done is not None, "apply-patches --no-wait was still waiting for the cache's lock after 20 s"
    code, err = done
    assert code == 2, err
    assert err == (
        f"error: the cache {store_env} is in use by pid {holder.pid} (its lock .lock); "
        "try again when that run is done (--no-wait gave up instead of waiting)\n"
    )
    assert not (project / "build").exists()


def test_a_wait_for_the_cache_lock_is_said_once(project, make_patch, upstream_dir, store_env):
    import time

    from tests.tool.helpers.processes import Forked

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    holder = _cache_lock_holder(store_env)
    try:
        up = str(upstream_dir)
        process = Forked(["apply-patches", "--project", str(project), "--upstream", up, "--base-upstream", up])
        time.sleep(2)
        assert os.waitpid(process.pid, os.WNOHANG)[0] == 0  # still waiting
    finally:
        holder.kill()  # the other run ends: this one goes on
        holder.wait()
    done = _finish_within(process, 60)
    assert done is not None
    code, err = done
    assert code == 0, err
    said = f"waiting for pid {holder.pid}, which holds the cache's lock {store_env / '.lock'}"
    assert err.count(said) == 1, err
