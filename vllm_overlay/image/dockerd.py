"""A Docker daemon of the image check's own: started by it, on its own socket and storage, stopped by its pid.

No Docker daemon runs on CI machines, and the check must not touch one that does: this one has its
data root under the store (``<store>/ci/docker``: images loaded once stay for the next run, like
buildah's storage), its socket, pid file and exec root under /run/vllm-overlay-ci-docker, and no
network of its own (no bridge, no iptables rules, no forwarding): containers get loopback only
(``--network none``), and a build that must reach the package index uses the host's network.

One check at a time uses it (a lock under the store); a daemon an earlier, killed check left is
found by its pid file and stopped by that pid before a new one starts. Stopping ends the daemon by
its pid (SIGTERM, then SIGKILL) and then its managed containerd by that one's pid file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from vllm_overlay import output
from vllm_overlay.image import engine
from vllm_overlay.store import Store

RUN_DIR = Path("/run/vllm-overlay-ci-docker")
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pid_from(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _end(pid: int, what: str) -> None:
    """SIGTERM ``pid``, wait, then SIGKILL: the process is gone when this returns."""
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _alive(pid):
            return
        time.sleep(0.2)
    output.warn(f"{what} (pid {pid}) did not stop in {STOP_TIMEOUT_S:.0f} s: SIGKILL")
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class Daemon:
    """dockerd with this check's own paths; ``host`` is the DOCKER_HOST that reaches it."""

    def __init__(self, store: Store, run_dir: Path = RUN_DIR) -> None:
        self.data_root = store.ci / "docker"
        self.run_dir = run_dir
        self.pidfile = run_dir / "docker.pid"
        self.socket = run_dir / "docker.sock"
        self.exec_root = run_dir / "exec"
        self.log = store.ci / "dockerd.log"
        self.host = f"unix://{self.socket}"
        self.process: subprocess.Popen | None = None

    def _ours(self, pid: int) -> bool:
        argv = _cmdline(pid)
        named = any(Path(arg).name == "dockerd" for arg in argv[:2])  # the binary, or a script's interpreter
        return named and str(self.data_root) in argv

    def _containerd_pid(self) -> int | None:
        return _pid_from(self.exec_root / "containerd" / "containerd.pid")

    def stop_leftover(self) -> int | None:
        """Stop a daemon an earlier check left (its pid file, and the pid runs our dockerd); its pid."""
        pid = _pid_from(self.pidfile)
        if pid is None or not _alive(pid) or not self._ours(pid):
            return None
        output.warn(f"a Docker daemon an earlier check started is still running (pid {pid}): stopping it")
        containerd = self._containerd_pid()
        _end(pid, "dockerd")
        if containerd is not None and _alive(containerd):
            _end(containerd, "containerd")
        return pid

    def start(self, exe: str, client: str) -> None:
        """Start ``exe`` (dockerd) and wait until ``client`` (the docker CLI) gets an answer from it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        argv = [
            exe,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            "--host",
            self.host,
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        output.info(f"      dockerd started (pid {self.process.pid}; socket {self.socket}; log {self.log})")
        deadline = time.monotonic() + START_TIMEOUT_S
        env = {**os.environ, "DOCKER_HOST": self.host}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise engine.EngineError(f"dockerd exited with {self.process.returncode}: {self._log_tail()}")
            probe = subprocess.run(
                [client, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, env=env
            )
            if probe.returncode == 0:
                return
            time.sleep(0.5)
        self.stop()
        raise engine.EngineError(f"dockerd did not answer in {START_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip()[-800:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """End the daemon this object started, by its pid, and its managed containerd by that one's pid file."""
        if self.process is None:
            return
        containerd = self._containerd_pid()
        _end(self.process.pid, "dockerd")
        self.process.wait()
        if containerd is not None and _alive(containerd) and "containerd" in " ".join(_cmdline(containerd)):
            _end(containerd, "containerd")
        output.info(f"      dockerd (pid {self.process.pid}) stopped")
        self.process = None


@contextlib.contextmanager
def running(store: Store, exe: str, client: str) -> Iterator[Daemon]:
    """The check's daemon, DOCKER_HOST pointing at it, for the ``with`` block; stopped whatever happens."""
    with store.exclusive(".docker-ci.lock"):
        daemon = Daemon(store)
        daemon.stop_leftover()
        previous = os.environ.get("DOCKER_HOST")
        try:
            daemon.start(exe, client)
            os.environ["DOCKER_HOST"] = daemon.host
            yield daemon
        finally:
            daemon.stop()
            if previous is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = previous
