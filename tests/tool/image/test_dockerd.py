"""The image check's own Docker daemon: started, answered and stopped by its pid."""

from __future__ import annotations

from vllm_overlay.store import Store

FAKE_DOCKERD = """#!{python}
import sys, time
from pathlib import Path
Path(sys.argv[sys.argv.index("--pidfile") + 1]).write_text(str(__import__("os").getpid()))
time.sleep(300)
"""


def test_the_checks_docker_daemon_is_stopped_by_its_pid_and_a_leftover_one_too(tmp_path):
    """A stand-in dockerd (sleeps; writes its pid file as dockerd does): started, answered, stopped by its pid."""
    import os
    import subprocess
    import sys

    from vllm_overlay.image import dockerd

    fake = tmp_path / "bin" / "dockerd"
    fake.parent.mkdir()
    fake.write_text(FAKE_DOCKERD.format(python=sys.executable))
    fake.chmod(0o755)
    client = tmp_path / "bin" / "docker"  # answers once the daemon wrote its pid file
    client.write_text(f"#!/bin/sh\ntest -s {tmp_path / 'run' / 'docker.pid'}\n")
    client.chmod(0o755)
    store = Store(tmp_path / "store")
    daemon = dockerd.Daemon(store, run_dir=tmp_path / "run")
    daemon.start(str(fake), str(client))
    pid = daemon.process.pid
    assert dockerd._alive(pid) and daemon._ours(pid)
    daemon.stop()
    assert not dockerd._alive(pid) and daemon.process is None

    # A daemon a killed check left: found by the pid file, stopped by that pid; another process is left alone.
    argv = [str(fake), "--data-root", str(daemon.data_root), "--pidfile", str(daemon.pidfile)]
    left = subprocess.Popen(argv)
    try:
        for _ in range(100):
            if daemon.pidfile.exists() and daemon.pidfile.read_text() == str(left.pid):
                break
            __import__("time").sleep(0.1)
        assert dockerd.Daemon(store, run_dir=tmp_path / "other").stop_leftover() is None
        assert dockerd.Daemon(store, run_dir=tmp_path / "run").stop_leftover() == left.pid
        assert left.wait(timeout=30) is not None
    finally:
        if left.poll() is None:
            os.kill(left.pid, 9)
            left.wait()
