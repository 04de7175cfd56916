"""The per-patch runner: every patch red -> green, and vLLM's own tests never worse than pristine.

For patch k of the applied series (steps: 0 = pristine upstream, k = patches 1..k applied):

    red        its Tests on step k-1 must FAIL: every Tests file has a failing test
               (a file that passes, errors only, or does not collect is reported as such)
    green      its Tests on step k must PASS (every file: no failure, at least one pass)
    upstream   its Upstream-Tests (vLLM's own tests, copied out of the upstream tree) on step k
               against the pristine baseline, test id by test id: nothing may go from pass or
               skip to fail, error or timeout, and no new failing test may appear

After the last patch, every selected patch's Tests run together on the full series (one pytest
process: no interference), then the tool's own tests.

Each step's patched files are laid over the shared environment's installed vllm by a *shadow
package* (``shadow.build_shadow``) put first on PYTHONPATH; the environment itself is never
written to. One pytest process per (patch, phase) runs in a pool (default: one per core); vLLM's
tests run offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) with a per-test timeout, and the pristine
baseline of each Upstream-Tests entry is cached in the store, keyed by upstream commit,
environment and test, so a warm run never repeats it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay import junit, shadow
from vllm_overlay.junit import ERROR, FAILED, PASSED, SKIPPED, TIMEOUT, Case

BAD = (FAILED, ERROR, TIMEOUT)
GOOD = (PASSED, SKIPPED)
NO_TESTS_VALUES = {"", "none", "-", "n/a"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
BASELINE_FORMAT = 1
TOOL_TEST_MODULES = ("pytest", "unidiff", "git", "tqdm")


# --------------------------------------------------------------------------------------------
# Verdicts (pure functions: the tool tests drive them with hand-made cases)
# --------------------------------------------------------------------------------------------


def spec_file(spec: str) -> str:
    return spec.split("::", 1)[0]


def cases_for(spec: str, cases: dict[str, Case]) -> list[Case]:
    """The cases a Tests / Upstream-Tests entry (a file, or file::id) produced."""
    file = spec_file(spec)
    if "::" in spec:
        return [
            c
            for c in cases.values()
            if c.id == spec
            or c.id.startswith(spec + "::")
            or c.id.startswith(spec + "[")
            or c.id == f"{file}::{junit.COLLECTION}"
        ]
    return [c for c in cases.values() if c.file == file or c.id.startswith(file + "::")]


def counts(cases: list[Case] | dict[str, Case]) -> dict[str, int]:
    values = cases.values() if isinstance(cases, dict) else cases
    result = {PASSED: 0, FAILED: 0, ERROR: 0, SKIPPED: 0, TIMEOUT: 0}
    for case in values:
        result[case.outcome] += 1
    return result


def short_counts(c: dict[str, int]) -> str:
    text = f"{c[PASSED]}p {c[FAILED]}f {c[SKIPPED]}s"
    if c[ERROR]:
        text += f" {c[ERROR]}e"
    if c[TIMEOUT]:
        text += f" {c[TIMEOUT]}t"
    return text


def red_file_status(cases: list[Case]) -> str:
    """detected | not-detected | collection-error | error | no-tests."""
    if not cases:
        return "no-tests"
    if any(c.id.endswith("::" + junit.COLLECTION) for c in cases):
        return "collection-error"
    if any(c.outcome in (FAILED, TIMEOUT) for c in cases):
        return "detected"
    if any(c.outcome == ERROR for c in cases):
        return "error"
    return "not-detected"


def green_file_status(cases: list[Case]) -> str:
    """passed | failed | collection-error | error | all-skipped | no-tests."""
    if not cases:
        return "no-tests"
    if any(c.id.endswith("::" + junit.COLLECTION) for c in cases):
        return "collection-error"
    if any(c.outcome in (FAILED, TIMEOUT) for c in cases):
        return "failed"
    if any(c.outcome == ERROR for c in cases):
        return "error"
    if not any(c.outcome == PASSED for c in cases):
        return "all-skipped"
    return "passed"


@dataclass
class Verdict:
    ok: bool
    status: str  # one word for the table
    detail: str = ""  # one line for humans
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "status": self.status, "detail": self.detail, "files": self.files}


def _exit_problem(exit_code: int | None, timed_out: bool) -> str | None:
    if timed_out:
        return "the pytest process ran past its time limit and was killed"
    if exit_code is None:
        return "did not run"
    if exit_code < 0:
        return f"pytest died from signal {-exit_code}"
    if exit_code not in (0, 1):
        meaning = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}
        return f"pytest exit code {exit_code} ({meaning.get(exit_code, 'unknown')})"
    return None


def red_verdict(specs: list[str], cases: dict[str, Case], exit_code: int | None, timed_out: bool = False) -> Verdict:
    if not specs:
        return Verdict(False, "no-tests", "the patch names no Tests")
    files = {spec: red_file_status(cases_for(spec, cases)) for spec in specs}
    problem = _exit_problem(exit_code, timed_out)
    c = counts(cases)
    if problem:
        return Verdict(False, "error", problem, files)
    bad = {s: v for s, v in files.items() if v != "detected"}
    if not bad and exit_code == 1:
        return Verdict(True, "ok", f"failed before the patch as it must ({short_counts(c)})", files)
    if exit_code == 0 or set(bad.values()) == {"not-detected"}:
        return Verdict(
            False,
            "NOT-DETECTED",
            "test does not detect the defect: passes without the patch: " + ", ".join(sorted(bad)),
            files,
        )
    worst = sorted(set(bad.values()) - {"not-detected"})[0]
    return Verdict(False, worst.upper(), "; ".join(f"{s}: {v}" for s, v in sorted(bad.items())), files)


def green_verdict(specs: list[str], cases: dict[str, Case], exit_code: int | None, timed_out: bool = False) -> Verdict:
    if not specs:
        return Verdict(False, "no-tests", "the patch names no Tests")
    files = {spec: green_file_status(cases_for(spec, cases)) for spec in specs}
    problem = _exit_problem(exit_code, timed_out)
    c = counts(cases)
    if problem:
        return Verdict(False, "error", problem, files)
    bad = {s: v for s, v in files.items() if v != "passed"}
    if not bad and exit_code == 0:
        return Verdict(True, "ok", f"passes with the patch ({short_counts(c)})", files)
    worst = "FAILED" if "failed" in bad.values() else sorted(set(bad.values()) or {"failed"})[0].upper()
    return Verdict(False, worst, "; ".join(f"{s}: {v}" for s, v in sorted(bad.items())) or f"exit {exit_code}", files)


@dataclass
class Comparison:
    regressions: list[dict[str, str]]  # {"id", "before", "after"}
    before: dict[str, int]
    after: dict[str, int]
    fixed: list[str]  # ids that went from bad to passed (informational)


def compare(before: dict[str, str], after: dict[str, str]) -> Comparison:
    """Test id by test id: what went from pass/skip (or from not existing) to fail/error/timeout.

    A test that passed or was skipped before and is gone after counts too ("missing"): a patch
    that stops a test from running must not hide a failure. Tests that were already bad in the
    baseline (failed, error, timeout) are never regressions.
    """
    regressions = []
    for test_id, outcome in sorted(after.items()):
        was = before.get(test_id)
        if outcome in BAD and (was is None or was in GOOD):
            regressions.append({"id": test_id, "before": was or "absent", "after": outcome})
    for test_id, was in sorted(before.items()):
        if was in GOOD and test_id not in after:
            regressions.append({"id": test_id, "before": was, "after": "missing"})
    fixed = sorted(t for t, o in after.items() if o == PASSED and before.get(t) in BAD)

    def tally(outcomes: dict[str, str]) -> dict[str, int]:
        result = {PASSED: 0, FAILED: 0, ERROR: 0, SKIPPED: 0, TIMEOUT: 0}
        for outcome in outcomes.values():
            result[outcome] += 1
        return result

    return Comparison(regressions, tally(before), tally(after), fixed)


def parse_specs(values: list[str]) -> list[str]:
    return [v for v in values if v.strip().lower() not in NO_TESTS_VALUES]


# --------------------------------------------------------------------------------------------
# Steps: the patched tree at every prefix, as a shadow package and an upstream-tests copy
# --------------------------------------------------------------------------------------------


def git(repo: Path, *args: str, binary: bool = False) -> str | bytes:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return out.stdout if binary else out.stdout.decode("utf-8")


def changed_files(repo: Path, base: str, commit: str, *pathspec: str) -> tuple[list[str], list[str]]:
    """(present, deleted) paths that differ between ``base`` and ``commit``."""
    if base == commit:
        return [], []
    text = str(git(repo, "diff", "--name-status", "--no-renames", "-z", base, commit, "--", *pathspec))
    fields = [f for f in text.split("\0") if f]
    present, deleted = [], []
    for status, path in zip(fields[0::2], fields[1::2], strict=True):
        (deleted if status.startswith("D") else present).append(path)
    return sorted(present), sorted(deleted)


def extract(repo: Path, commit: str, paths: list[str], dest: Path) -> dict[str, Path]:
    """Write ``paths`` as they are at ``commit`` under ``dest``; map each path to its copy."""
    result = {}
    for rel in paths:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(git(repo, "cat-file", "blob", f"{commit}:{rel}", binary=True)))
        result[rel] = target
    return result


def export_tree(repo: Path, commit: str, paths: list[str], dest: Path) -> None:
    """Extract ``paths`` (directories or files) of ``commit`` into ``dest`` without ownership."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", *paths], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    if proc.wait() != 0:
        raise RuntimeError(f"git archive {commit} {' '.join(paths)} failed")


@dataclass
class Step:
    index: int
    commit: str
    shadow: Path  # directory to put first on PYTHONPATH
    replaced: list[str]
    deleted: list[str]
    upstream_tests: Path  # root holding tests/ (and pyproject.toml) as of this step


# --------------------------------------------------------------------------------------------
# Jobs: one pytest process each
# --------------------------------------------------------------------------------------------


@dataclass
class Job:
    kind: str  # red | green | baseline | upstream | final | tool
    patch: str | None
    step: int
    targets: list[str]
    cwd: Path
    python: Path
    pythonpath: Path | None
    log: Path
    junit_file: Path
    timeout_flag: bool = True
    # filled in when it has run
    exit_code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    cases: dict[str, Case] = field(default_factory=dict)
    skipped_reason: str | None = None

    @property
    def ran(self) -> bool:
        return self.exit_code is not None

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


@dataclass
class Config:
    jobs: int = 2
    per_test_timeout: int = 300
    run_timeout: int = 3600
    keep_going: bool = False
    tool_tests: bool = True


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
        env = dict(self.base_env)
        if job.pythonpath is not None:
            env["PYTHONPATH"] = shadow.pythonpath_with(job.pythonpath, self.base_env.get("PYTHONPATH"))
        return env

    def run(self, job: Job) -> Job:
        if self.stopping.is_set():
            job.skipped_reason = "not run (stopped)"
            return job
        job.log.parent.mkdir(parents=True, exist_ok=True)
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


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


@dataclass
class PatchOutcome:
    name: str
    series: str
    subject: str
    step: int
    tests: list[str]
    upstream_tests: list[str]
    red: Verdict | None = None
    green: Verdict | None = None
    upstream: Verdict | None = None
    comparison: Comparison | None = None
    baseline_cached: bool = False
    jobs: list[Job] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(j.seconds for j in self.jobs)

    @property
    def ok(self) -> bool:
        return all(v is not None and v.ok for v in (self.red, self.green, self.upstream))

    def failures(self) -> list[str]:
        found = []
        for phase, verdict in (("red", self.red), ("green", self.green), ("upstream-tests", self.upstream)):
            if verdict is None:
                found.append(f"{phase}: not run")
            elif not verdict.ok:
                found.append(f"{phase}: {verdict.status}: {verdict.detail}")
        return found

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "series": self.series,
            "subject": self.subject,
            "step": self.step,
            "tests": self.tests,
            "upstream_tests": self.upstream_tests,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "red": self.red.to_json() if self.red else None,
            "green": self.green.to_json() if self.green else None,
            "upstream": self.upstream.to_json() if self.upstream else None,
            "upstream_before": self.comparison.before if self.comparison else None,
            "upstream_after": self.comparison.after if self.comparison else None,
            "upstream_regressions": self.comparison.regressions if self.comparison else None,
            "upstream_fixed": self.comparison.fixed if self.comparison else None,
            "upstream_baseline_cached": self.baseline_cached,
            "runs": [j.to_json() for j in self.jobs],
        }


@dataclass
class RunReport:
    patches: list[PatchOutcome]
    final: Verdict | None = None
    final_job: Job | None = None
    tool: Verdict | None = None
    tool_job: Job | None = None
    stopped: bool = False
    seconds: float = 0.0
    setup_seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        checks = [p.ok for p in self.patches]
        if self.final is not None:
            checks.append(self.final.ok)
        if self.tool is not None:
            checks.append(self.tool.ok)
        return all(checks) and not self.stopped

    def first_failure(self) -> str | None:
        for patch in self.patches:
            if not patch.ok:
                return f"{patch.name}: " + "; ".join(patch.failures())
        if self.final is not None and not self.final.ok:
            return f"full series: {self.final.status}: {self.final.detail}"
        if self.tool is not None and not self.tool.ok:
            return f"tool tests: {self.tool.status}: {self.tool.detail}"
        return None

    def to_json(self) -> dict[str, object]:
        return {
            **self.extra,
            "ok": self.ok,
            "stopped": self.stopped,
            "seconds": round(self.seconds, 1),
            "setup_seconds": round(self.setup_seconds, 1),
            "patches": [p.to_json() for p in self.patches],
            "full_series": {
                **(self.final.to_json() if self.final else {"status": "not run"}),
                "run": self.final_job.to_json() if self.final_job and self.final_job.ran else None,
            },
            "tool_tests": {
                **(self.tool.to_json() if self.tool else {"status": "not run"}),
                "run": self.tool_job.to_json() if self.tool_job and self.tool_job.ran else None,
            },
        }


class Runner:
    """Wires steps, jobs and verdicts together for one run (see the module docstring)."""

    def __init__(
        self,
        *,
        project_root: Path,
        workdir: Path,
        patched_repo: Path,
        upstream_commit: str,
        patch_commits: list[tuple[object, str]],  # (series.Patch, commit) for every applied patch, in order
        selected: list[str],  # names of the patches to test
        python: Path,
        installed_package: Path,
        baseline_dir: Path,
        baseline_salt: str,
        config: Config,
        tool_python: Path | None,
        info: Callable[[str], None],
    ) -> None:
        self.project_root = project_root
        self.workdir = workdir
        self.repo = patched_repo
        self.upstream_commit = upstream_commit
        self.patch_commits = patch_commits
        self.selected = selected
        self.python = python
        self.installed = installed_package
        self.baseline_dir = baseline_dir
        self.baseline_salt = baseline_salt
        self.config = config
        self.tool_python = tool_python
        self.info = info
        self.steps: dict[int, Step] = {}
        self._print_lock = threading.Lock()

    # ---- preparation -------------------------------------------------------------------------

    def commit_of(self, step: int) -> str:
        return self.upstream_commit if step == 0 else self.patch_commits[step - 1][1]

    def pristine_tests_root(self) -> Path:
        root = self.workdir / "upstream-tests" / self.upstream_commit[:16]
        marker = root / ".complete"
        if not marker.exists():
            shutil.rmtree(root, ignore_errors=True)
            present = str(git(self.repo, "ls-tree", "--name-only", self.upstream_commit)).split()
            wanted = [p for p in ("tests", "pyproject.toml") if p in present]
            if "tests" not in wanted:
                raise RuntimeError(f"upstream {self.upstream_commit[:12]} has no tests/ directory")
            export_tree(self.repo, self.upstream_commit, wanted, root)
            marker.write_text(self.upstream_commit + "\n")
        return root

    def build_step(self, index: int, needs_upstream_tests: bool) -> Step:
        commit = self.commit_of(index)
        step_dir = self.workdir / "steps" / f"{index:03d}"
        shutil.rmtree(step_dir, ignore_errors=True)
        present, deleted = changed_files(self.repo, self.upstream_commit, commit, shadow.PACKAGE + "/")
        replacements = extract(self.repo, commit, present, step_dir / "files")
        shadow_dir = shadow.build_shadow(self.installed, replacements, deleted, step_dir / "shadow")
        tests_root = self.pristine_tests_root()
        if needs_upstream_tests:
            t_present, t_deleted = changed_files(self.repo, self.upstream_commit, commit, "tests/", "pyproject.toml")
            if t_present or t_deleted:  # the series edits vLLM's own tests: use them as of this step
                own = step_dir / "upstream-tests"
                shutil.copytree(tests_root, own, symlinks=True)
                for rel in t_deleted:
                    (own / rel).unlink(missing_ok=True)
                extract(self.repo, commit, t_present, own)
                tests_root = own
        return Step(index, commit, shadow_dir, present, deleted, tests_root)

    def check_shadow(self, step: Step) -> None:
        """Prove ``import vllm`` resolves to the shadow (without importing it)."""
        code = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"
        env = dict(os.environ, PYTHONPATH=shadow.pythonpath_with(step.shadow, os.environ.get("PYTHONPATH")))
        found = subprocess.run(
            [str(self.python), "-c", code], env=env, cwd=self.project_root, capture_output=True, text=True, check=False
        ).stdout.strip()
        expected = str(step.shadow / shadow.PACKAGE)
        if os.path.realpath(found) != os.path.realpath(expected) and found != expected:
            raise RuntimeError(f"'import vllm' resolves to {found or 'nothing'}, not the shadow {expected}")

    # ---- baselines ---------------------------------------------------------------------------

    def baseline_file(self, spec: str) -> Path:
        key = json.dumps(
            [BASELINE_FORMAT, self.upstream_commit, self.baseline_salt, spec, self.config.per_test_timeout]
        )
        return self.baseline_dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def load_baseline(self, spec: str) -> dict[str, object] | None:
        try:
            data = json.loads(self.baseline_file(spec).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if data.get("spec") == spec else None

    def save_baseline(self, spec: str, job: Job) -> None:
        if job.timed_out or job.exit_code is None or job.exit_code < 0 or job.skipped_reason:
            return  # an interrupted run is no baseline
        data = {
            "spec": spec,
            "upstream_commit": self.upstream_commit,
            "exit_code": job.exit_code,
            "outcomes": {c.id: c.outcome for c in cases_for(spec, job.cases)},
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path = self.baseline_file(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)

    # ---- jobs --------------------------------------------------------------------------------

    def _job(self, kind: str, patch: str | None, step: int, targets: list[str], upstream: bool = False) -> Job:
        stem = Path(patch).stem if patch else kind
        label = f"{step:03d}-{kind}-{stem}"
        root = self.steps[step].upstream_tests if upstream else self.project_root
        return Job(
            kind=kind,
            patch=patch,
            step=step,
            targets=targets,
            cwd=root,
            python=self.python,
            pythonpath=self.steps[step].shadow,
            log=self.workdir / "logs" / f"{label}.log",
            junit_file=self.workdir / "junit" / f"{label}.xml",
        )

    def plan(self) -> tuple[list[PatchOutcome], list[Job], Job | None, Job | None]:
        index_of = {patch.name: i for i, (patch, _) in enumerate(self.patch_commits, start=1)}
        outcomes: list[PatchOutcome] = []
        jobs: list[Job] = []
        for name in self.selected:
            step = index_of[name]
            patch = self.patch_commits[step - 1][0]
            outcome = PatchOutcome(
                name=name,
                series=patch.series,
                subject=patch.subject,
                step=step,
                tests=parse_specs(patch.tests),
                upstream_tests=parse_specs(patch.upstream_tests),
            )
            outcomes.append(outcome)
            if outcome.tests:
                outcome.jobs.append(self._job("red", name, step - 1, outcome.tests))
                outcome.jobs.append(self._job("green", name, step, outcome.tests))
            if outcome.upstream_tests:
                missing = [s for s in outcome.upstream_tests if self.load_baseline(s) is None]
                outcome.baseline_cached = not missing
                if missing:
                    outcome.jobs.append(self._job("baseline", name, 0, missing, upstream=True))
                outcome.jobs.append(self._job("upstream", name, step, outcome.upstream_tests, upstream=True))
            jobs.extend(outcome.jobs)
        last = len(self.patch_commits)
        all_tests = []
        for outcome in outcomes:
            all_tests.extend(t for t in outcome.tests if t not in all_tests)
        final = self._job("final", None, last, all_tests) if all_tests and outcomes else None
        tool = None
        if self.config.tool_tests and self.tool_python and (self.project_root / "tests" / "tool").is_dir():
            tool = Job(
                kind="tool",
                patch=None,
                step=last,
                targets=["tests/tool"],
                cwd=self.project_root,
                python=self.tool_python,
                pythonpath=None,
                log=self.workdir / "logs" / "tool-tests.log",
                junit_file=self.workdir / "junit" / "tool-tests.xml",
                timeout_flag=False,
            )
        return outcomes, jobs, final, tool

    # ---- verdicts ----------------------------------------------------------------------------

    def decide(self, outcome: PatchOutcome) -> None:
        by_kind = {j.kind: j for j in outcome.jobs}
        if not outcome.tests:
            outcome.red = outcome.green = Verdict(False, "no-tests", "the patch names no Tests")
        for kind in ("red", "green"):
            job = by_kind.get(kind)
            if job is None or not job.ran or job.skipped_reason:
                continue
            decide_fn = red_verdict if kind == "red" else green_verdict
            verdict = decide_fn(outcome.tests, job.cases, job.exit_code, job.timed_out)
            setattr(outcome, kind, verdict)
        if not outcome.upstream_tests:
            outcome.upstream = Verdict(True, "n/a", "the patch names no Upstream-Tests")
            return
        after_job = by_kind.get("upstream")
        baseline_job = by_kind.get("baseline")
        if baseline_job is not None and baseline_job.ran and not baseline_job.skipped_reason:
            for spec in baseline_job.targets:
                self.save_baseline(spec, baseline_job)
        if after_job is None or not after_job.ran or after_job.skipped_reason:
            return
        before: dict[str, str] = {}
        exits = set()
        for spec in outcome.upstream_tests:
            data = self.load_baseline(spec)
            if data is None:
                outcome.upstream = Verdict(False, "error", f"no baseline for {spec} (the pristine run failed)")
                return
            before.update(data["outcomes"])  # type: ignore[arg-type]
            exits.add(data["exit_code"])
        after = {}
        for spec in outcome.upstream_tests:
            after.update({c.id: c.outcome for c in cases_for(spec, after_job.cases)})
        comparison = compare(before, after)
        outcome.comparison = comparison
        problem = _exit_problem(after_job.exit_code, after_job.timed_out)
        if problem and not (after_job.exit_code in exits and not after_job.timed_out):
            outcome.upstream = Verdict(False, "error", problem)
        elif comparison.regressions:
            shown = ", ".join(f"{r['id']} ({r['before']} -> {r['after']})" for r in comparison.regressions[:5])
            more = len(comparison.regressions) - 5
            outcome.upstream = Verdict(
                False,
                "REGRESSED",
                f"{len(comparison.regressions)} test(s) worse than pristine: {shown}"
                + (f" ... and {more} more" if more > 0 else ""),
            )
        else:
            outcome.upstream = Verdict(
                True,
                "ok",
                f"{short_counts(comparison.before)} -> {short_counts(comparison.after)}, no test worse than pristine",
            )

    # ---- execution ---------------------------------------------------------------------------

    def say(self, message: str) -> None:
        with self._print_lock:
            self.info(message)

    def execute(self, base_env: dict[str, str]) -> RunReport:
        started = time.monotonic()
        outcomes, jobs, final, tool = self.plan()
        report = RunReport(outcomes)
        report.final_job, report.tool_job = final, tool
        executor = Executor(self.config, base_env)
        queue = [*jobs, *([final] if final else []), *([tool] if tool else [])]
        total = len(queue)
        number = {id(job): i for i, job in enumerate(queue, start=1)}
        owner = {id(job): outcome for outcome in outcomes for job in outcome.jobs}
        remaining = {outcome.name: len(outcome.jobs) for outcome in outcomes}
        failed = False

        def describe(job: Job) -> str:
            where = "pristine" if job.step == 0 else f"patches 1..{job.step}"
            who = job.patch or {"final": "all Tests together", "tool": "tool tests"}[job.kind]
            return f"[{number[id(job)]}/{total}] {job.kind:<8} {who} on {where}"

        def start(job: Job) -> Job:
            if not executor.stopping.is_set():
                self.say(describe(job) + " ...")
            return executor.run(job)

        # Patch outcomes with no jobs at all (no Tests, no Upstream-Tests) are decided up front.
        for outcome in outcomes:
            if not outcome.jobs:
                self.decide(outcome)
                failed = failed or not outcome.ok
        try:
            with ThreadPoolExecutor(max_workers=max(1, self.config.jobs)) as pool:
                todo = list(queue)
                pending: set[Future[Job]] = set()
                while todo or pending:
                    while todo and len(pending) < max(1, self.config.jobs) and not executor.stopping.is_set():
                        pending.add(pool.submit(start, todo.pop(0)))
                    if not pending:
                        break
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        job = future.result()
                        if job.skipped_reason:
                            continue
                        failed = self.finished(job, owner, remaining, report, describe) or failed
                        if failed and not self.config.keep_going and not executor.stopping.is_set():
                            self.say("stopping at the first failure (--keep-going runs everything)")
                            executor.stop()
        except KeyboardInterrupt:
            executor.stop()
            raise
        report.stopped = any(not job.ran or job.skipped_reason for job in queue)
        for outcome in outcomes:  # patches cut short by a stop: decide on what did run
            if any(v is None for v in (outcome.red, outcome.green, outcome.upstream)) and any(
                j.ran and not j.skipped_reason for j in outcome.jobs
            ):
                self.decide(outcome)
        report.seconds = time.monotonic() - started
        return report

    def finished(
        self,
        job: Job,
        owner: dict[int, PatchOutcome],
        remaining: dict[str, int],
        report: RunReport,
        describe: Callable[[Job], str],
    ) -> bool:
        """Report one finished job; decide its patch once all the patch's jobs are in. True: a failure."""
        outcome = owner.get(id(job))
        self.say(f"{describe(job)}: {self.job_summary(job, outcome)} ({job.seconds:.1f}s)")
        if outcome is not None:
            remaining[outcome.name] -= 1
            if remaining[outcome.name] > 0:
                # A red or green run that already failed fails the patch: no need to wait (fail-fast).
                if job.kind in ("red", "green") and not self.config.keep_going:
                    check = red_verdict if job.kind == "red" else green_verdict
                    if not check(outcome.tests, job.cases, job.exit_code, job.timed_out).ok:
                        self.say(f"  log: {job.log}\n{log_tail(job.log, 30)}")
                        return True
                return False
            self.decide(outcome)
            self.say(self.patch_line(outcome))
            if not outcome.ok:
                self.show_failure_logs(outcome)
            return not outcome.ok
        verdict = (
            green_verdict(job.targets, job.cases, job.exit_code, job.timed_out)
            if job.kind == "final"
            else tool_verdict(job)
        )
        if job.kind == "final":
            report.final = verdict
        else:
            report.tool = verdict
        if not verdict.ok:
            self.say(f"  --- {job.kind} log (last lines): {job.log}\n{log_tail(job.log, 30)}  ---")
        return not verdict.ok

    def job_summary(self, job: Job, outcome: PatchOutcome | None) -> str:
        c = short_counts(counts(job.cases))
        problem = _exit_problem(job.exit_code, job.timed_out)
        if problem:
            return f"{c}; {problem}"
        if job.kind == "red" and outcome is not None:
            v = red_verdict(outcome.tests, job.cases, job.exit_code, job.timed_out)
            return f"{'ok' if v.ok else v.status} ({c})"
        if job.kind in ("green", "final") and outcome is not None:
            v = green_verdict(outcome.tests, job.cases, job.exit_code, job.timed_out)
            return f"{'ok' if v.ok else v.status} ({c})"
        return c

    def patch_line(self, outcome: PatchOutcome) -> str:
        if outcome.ok:
            return f"  => {outcome.name}: ok (red, green, upstream-tests) in {outcome.seconds:.0f}s of test time"
        return f"  => {outcome.name}: FAILED: " + "; ".join(outcome.failures())

    def show_failure_logs(self, outcome: PatchOutcome) -> None:
        for job in outcome.jobs:
            verdict = {"red": outcome.red, "green": outcome.green, "upstream": outcome.upstream}.get(job.kind)
            if verdict is not None and not verdict.ok and job.ran:
                self.say(f"  --- {job.kind} log (last lines): {job.log}\n{log_tail(job.log, 30)}  ---")


def tool_verdict(job: Job) -> Verdict:
    problem = _exit_problem(job.exit_code, job.timed_out)
    c = counts(job.cases)
    if job.exit_code == 0:
        return Verdict(True, "ok", short_counts(c))
    if job.exit_code == 5:
        return Verdict(True, "n/a", "no tool tests collected")
    return Verdict(False, "FAILED", problem or f"{short_counts(c)}; see {job.log}")


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def table(report: RunReport) -> str:
    rows = [("patch", "red", "green", "upstream before", "upstream after", "s")]
    for p in report.patches:
        before = short_counts(p.comparison.before) if p.comparison else "-"
        if p.upstream is None:
            after = "not run"
        elif p.comparison is None:
            after = p.upstream.status
        else:
            regressed = len(p.comparison.regressions)
            after = short_counts(p.comparison.after) + (f" ({regressed} WORSE)" if regressed else "")
            if p.upstream.status not in ("ok", "REGRESSED"):
                after += f" [{p.upstream.status}]"
        if not p.upstream_tests:
            before = after = "n/a"
        rows.append(
            (
                p.name,
                (p.red.status if p.red else "not run"),
                (p.green.status if p.green else "not run"),
                before,
                after,
                f"{p.seconds:.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) if i < 5 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    final = report.final
    lines.append("")
    lines.append(f"full series, all Tests together: {final.status + ' - ' + final.detail if final else 'not run'}")
    tool = report.tool
    lines.append(f"tool tests: {tool.status + ' - ' + tool.detail if tool else 'not run'}")
    passed = sum(p.ok for p in report.patches)
    lines.append(
        f"{passed}/{len(report.patches)} patches ok; wall time {report.seconds + report.setup_seconds:.0f}s "
        f"(setup {report.setup_seconds:.0f}s, tests {report.seconds:.0f}s)"
    )
    failure = report.first_failure()
    lines.append("RESULT: ok" if report.ok else f"RESULT: FAILED: {failure or 'stopped before the end'}")
    return "\n".join(lines)


def junit_cases(report: RunReport, apply_failures: list[tuple[str, str]] | None = None) -> list[junit.ReportCase]:
    cases: list[junit.ReportCase] = []
    for name, detail in apply_failures or []:
        cases.append(junit.ReportCase(suite="apply", name=name, seconds=0.0, failure=detail))
    for p in report.patches:
        suite = f"patches.{p.series or 'unnamed'}"
        jobs = {j.kind: j for j in p.jobs}
        for phase, verdict, kind in (
            ("red", p.red, "red"),
            ("green", p.green, "green"),
            ("upstream-tests", p.upstream, "upstream"),
        ):
            job = jobs.get(kind)
            seconds = job.seconds if job else 0.0
            name = f"{p.name} [{phase}]"
            if verdict is None:
                cases.append(junit.ReportCase(suite, name, seconds, skipped="not run"))
                continue
            body = verdict.detail
            if verdict.files:
                body += "\n" + "\n".join(f"{f}: {s}" for f, s in sorted(verdict.files.items()))
            if kind == "upstream" and p.comparison and p.comparison.regressions:
                body += "\n" + "\n".join(f"{r['id']}: {r['before']} -> {r['after']}" for r in p.comparison.regressions)
            if job is not None and job.ran:
                body += f"\nlog: {job.log}"
            if verdict.ok:
                cases.append(junit.ReportCase(suite, name, seconds, output=body))
            elif verdict.status in ("error", "COLLECTION-ERROR", "ERROR"):
                tail = log_tail(job.log) if job is not None and job.ran else ""
                cases.append(junit.ReportCase(suite, name, seconds, error=body + "\n" + tail))
            else:
                tail = log_tail(job.log) if job is not None and job.ran else ""
                cases.append(junit.ReportCase(suite, name, seconds, failure=body + "\n" + tail))
    for label, verdict, job in (
        ("all Tests together on the full series", report.final, report.final_job),
        ("tool tests", report.tool, report.tool_job),
    ):
        seconds = job.seconds if job else 0.0
        if verdict is None:
            cases.append(junit.ReportCase("full-series", label, seconds, skipped="not run"))
        elif verdict.ok:
            cases.append(junit.ReportCase("full-series", label, seconds, output=verdict.detail))
        else:
            tail = log_tail(job.log) if job is not None and job.ran else ""
            cases.append(junit.ReportCase("full-series", label, seconds, failure=verdict.detail + "\n" + tail))
    return cases


# --------------------------------------------------------------------------------------------
# Helpers for the command
# --------------------------------------------------------------------------------------------


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


def python_has(python: Path | str, modules: tuple[str, ...]) -> bool:
    code = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    return subprocess.run([str(python), "-c", code, *modules], capture_output=True, check=False).returncode == 0


def tool_test_python(env_python: Path) -> Path | None:
    """The environment's interpreter if it has the tool's dependencies, else the tool's own."""
    if python_has(env_python, TOOL_TEST_MODULES):
        return env_python
    if python_has(sys.executable, TOOL_TEST_MODULES):
        return Path(sys.executable)
    return None


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
