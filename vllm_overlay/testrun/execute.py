"""Processes: one pytest process per job, a pool of them, time limits, and stopping them all.

A job is one pytest invocation on one tree (a shadow package first on PYTHONPATH); it may serve
several units of the plan at once (the red run of patch k and the green run of patch k-1 test the
same tree). This module knows nothing about verdicts: it runs, times and collects.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay import junit
from vllm_overlay.env import shadow
from vllm_overlay.junit import Case
from vllm_overlay.testrun.verdicts import Result, counts

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TOOL_TEST_MODULES = ("pytest", "ruff", "unidiff", "git", "tqdm")  # the test extra and the tool's own


@dataclass
class Config:
    jobs: int = 2
    per_test_timeout: int = 300
    run_timeout: int = 3600
    keep_going: bool = False
    tool_tests: bool = True
    use_cache: bool = True
    oracle_profile: str = "ci"  # ci: each oracle's fixed example budget; deep: its long run (--deep)
    oracle_db: Path | None = None  # hypothesis example databases, one folder per series (in the cache)


@dataclass
class Job:
    kind: str  # red+green | red | green | baseline | upstream | final | tool
    label: str  # who, for progress lines
    step: int
    targets: list[str]
    cwd: Path
    python: Path
    pythonpath: Path | None
    log: Path
    junit_file: Path
    timeout_flag: bool = True
    env: dict[str, str] = field(default_factory=dict)  # set for this job only (an oracle's profile and database)
    # filled in when it has run
    exit_code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    cases: dict[str, Case] = field(default_factory=dict)
    skipped_reason: str | None = None

    @property
    def ran(self) -> bool:
        return self.exit_code is not None and not self.skipped_reason

    @property
    def result(self) -> Result:
        return Result(self.exit_code, self.timed_out, self.cases, self.seconds)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "step": self.step,
            "targets": self.targets,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "seconds": round(self.seconds, 2),
            "counts": counts(self.cases),
            "log": str(self.log),
        }


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "".join(path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-lines:])
    except OSError:
        return ""


class Executor:
    """Runs jobs in a pool of pytest processes; stops them all on request (fail-fast, Ctrl-C)."""

    def __init__(self, config: Config, base_env: dict[str, str]) -> None:
        self.config = config
        self.base_env = base_env
        self.stopping = threading.Event()
        self.started = 0  # pytest processes started, for the report
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def command(self, job: Job) -> list[str]:
        cmd = [
            str(job.python),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "junit_family=xunit1",
            f"--junitxml={job.junit_file}",
            "--continue-on-collection-errors",
            "-q",
            "-rfE",
            "--color=no",
            f"--rootdir={job.cwd}",
        ]
        if job.timeout_flag:
            cmd.append(f"--timeout={self.config.per_test_timeout}")
        return [*cmd, *job.targets]

    def environment(self, job: Job) -> dict[str, str]:
        env = dict(self.base_env, **job.env)
        if job.kind == "tool":
            # The tool tests are a developer's pytest run: git as the user has it, not isolated.
            env = gitcmd.outside_environment(env)
        if job.pythonpath is not None:
            env["PYTHONPATH"] = shadow.pythonpath_with(job.pythonpath, self.base_env.get("PYTHONPATH"))
        return env

    def run(self, job: Job) -> Job:
        if self.stopping.is_set():
            job.skipped_reason = "not run (stopped)"
            return job
        job.log.parent.mkdir(parents=True, exist_ok=True)
        job.junit_file.parent.mkdir(parents=True, exist_ok=True)
        job.junit_file.unlink(missing_ok=True)
        started = time.monotonic()
        with open(job.log, "wb") as log:
            cmd = self.command(job)
            log.write(("$ cd " + str(job.cwd) + "\n$ " + " ".join(cmd) + "\n").encode())
            if job.pythonpath is not None:
                log.write(f"PYTHONPATH={job.pythonpath} (shadow package, step {job.step})\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=job.cwd,
                env=self.environment(job),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            with self._lock:
                self.started += 1
                self._running[proc.pid] = proc
            try:
                job.exit_code = proc.wait(timeout=self.config.run_timeout)
            except subprocess.TimeoutExpired:
                job.timed_out = True
                self._kill(proc)
                job.exit_code = proc.wait()
            finally:
                with self._lock:
                    self._running.pop(proc.pid, None)
        job.seconds = time.monotonic() - started
        job.cases = junit.read_cases(job.junit_file, job.targets)
        if self.stopping.is_set() and job.exit_code not in (0, 1):
            job.skipped_reason = "stopped while running"
        return job

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            running = list(self._running.values())
        for proc in running:
            self._kill(proc)


@contextlib.contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """One runner per work directory at a time (it rebuilds the step directories)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise RuntimeError(f"another test-patches run is using {workdir}") from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tool_test_python() -> Path | None:
    """The interpreter the tool tests run in: the tool's own where it holds the tool's test
    dependencies (``scripts/setup --test``), else None.

    Never the vLLM test environment's, even where it holds pytest: the tool tests run where vllm is
    not importable, as scripts/check runs them in .venv (some assert what a machine without vllm
    does), and they lint with ruff, which that environment lacks.
    """
    return Path(sys.executable) if all(importlib.util.find_spec(m) for m in TOOL_TEST_MODULES) else None


def base_environment(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("PYTHONHASHSEED", "0")
    threads = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(name, threads)
    return env


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 4))
