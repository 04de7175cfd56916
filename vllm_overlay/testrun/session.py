"""One run of the per-patch tests over an applied series (``run_series``: trees, plan, jobs, report),
and the whole ``scripts/test-patches`` session around it (``run_patch_tests``: the lock, the test
environment, the series applied into the work directory, the run, the reports' data)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import output
from vllm_overlay.errors import InputError, Interrupted
from vllm_overlay.store import Store
from vllm_overlay.testrun.execute import Config, base_environment, default_jobs, tool_test_python, workdir_lock
from vllm_overlay.testrun.outcome import RunReport
from vllm_overlay.testrun.plan import Planner
from vllm_overlay.testrun.render import table
from vllm_overlay.testrun.runner import Runner
from vllm_overlay.testrun.trees import Trees
from vllm_overlay.testrun.verdict_store import VerdictStore, scope_name

if TYPE_CHECKING:  # the session's modules are imported when it runs: ``import testrun`` stays light
    from vllm_overlay.apply.engine import Report
    from vllm_overlay.project import Project
    from vllm_overlay.series import Patch
    from vllm_overlay.upstream.lock import Lock
    from vllm_overlay.upstream.trees import Upstream


def run_series(
    *,
    project_root: Path,
    workdir: Path,
    patched_repo: Path,
    upstream_commit: str,
    patch_commits: list[tuple[Patch, str]],  # (patch, its commit) for every applied patch, in order
    selected: list[str],
    python: Path,
    env_key: str | None,
    installed_package: Path,
    store: Store,
    config: Config,
    tool_python: Path | None,
    info: Callable[[str], None],
) -> RunReport:
    started = time.monotonic()
    trees = Trees(workdir, patched_repo, upstream_commit, [c for _, c in patch_commits], installed_package)
    verdicts = VerdictStore(store, scope_name(env_key, python), enabled=config.use_cache)
    plan = Planner(
        project_root=project_root,
        workdir=workdir,
        trees=trees,
        patches=[p for p, _ in patch_commits],
        selected=selected,
        python=python,
        tool_python=tool_python,
        verdicts=verdicts,
        config=config,
    ).plan()
    shadow_steps = sorted({job.step for job in plan.jobs if job.pythonpath is not None})
    if shadow_steps:
        trees.check_shadow(python, project_root, shadow_steps[-1])
    stored = sum(1 for outcome in plan.outcomes for unit in outcome.units if unit.result is not None)
    info(
        f"{stored} result(s) from the verdict store {verdicts.root}"
        + ("" if config.use_cache else " (--no-cache: none read)")
        + f"; {len(plan.jobs)} pytest process(es) to run, {len(shadow_steps)} step(s) laid over "
        f"{installed_package} in {time.monotonic() - started:.1f}s"
    )
    base_env = base_environment(config.jobs)
    base_env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(workdir / "hypothesis")
    setup = time.monotonic() - started
    report = Runner(plan, verdicts, config, info).execute(base_env)
    report.setup_seconds = setup
    return report


# What a run writes in its work directory; a directory holding anything else is the user's.
WORKDIR_NAMES = frozenset(
    {".lock", ".patched.lock", ".patched.spare", "patched", "steps", "upstream-tests", "logs", "junit", "hypothesis"}
)


@dataclass(frozen=True)
class PatchTestOptions:
    """What ``scripts/test-patches`` is asked; the defaults are its options' defaults."""

    only: list[str] | None = None  # series or patch names (--only); None: the whole series
    upstream: str | None = None  # VERSION|DIR|REPO@REV (--upstream); None: the locked release
    keep_going: bool = False
    env: Path | None = None  # a virtual environment to use instead of the cached one (never modified)
    jobs: int | None = None  # pytest processes at once; None: default_jobs()
    timeout: int = 300  # per test, in seconds
    run_timeout: int = 3600  # per pytest process, in seconds
    tool_tests: bool = True
    use_cache: bool = True  # answer from the verdict store where it holds the result
    workdir: Path | None = None  # None: <build>/test-patches
    deep: bool = False  # each series' oracle runs its long budget (--deep) instead of its fixed one


@dataclass
class PatchTestResult:
    """What a session ended with: its exit code and, where it got as far, what the reports say."""

    code: int  # 0 every check passed; 1 a patch or the tests failed; 2 a selection refused (named above it)
    report: RunReport | None = None  # None: stopped before there was anything to report
    apply_failures: list[tuple[str, str]] = field(default_factory=list)  # (patch, detail) that did not apply
    extra: dict[str, object] = field(default_factory=dict)  # more for the JSON report (the failed apply's)

    def to_json(self) -> dict[str, object]:
        """The JSON report's data (JSON types only)."""
        data: dict[str, object] = {**(self.report or RunReport([])).to_json(), **self.extra}
        if self.apply_failures:
            data["ok"] = False
            data["apply_failures"] = [{"patch": n, "detail": d} for n, d in self.apply_failures]
        return json.loads(json.dumps(data, default=str))


def run_patch_tests(proj: Project, options: PatchTestOptions) -> PatchTestResult:
    """The whole test-patches session: prints its progress, table and RESULT line; errors in one line.

    Input errors (the lock, the series, the upstream, the options, the environment) raise
    ``errors.InputError`` and Ctrl-C ``errors.Interrupted``, as every verb's do: cli.main says them.
    """
    from vllm_overlay.apply import staging

    jobs = default_jobs() if options.jobs is None else options.jobs
    if jobs < 1 or options.timeout < 1 or options.run_timeout < 1:
        raise InputError("--jobs, --timeout and --run-timeout must be positive")
    config = Config(
        jobs=jobs,
        per_test_timeout=options.timeout,
        run_timeout=options.run_timeout,
        keep_going=options.keep_going,
        tool_tests=options.tool_tests,
        use_cache=options.use_cache,
        oracle_profile="deep" if options.deep else "ci",
    )
    started = time.monotonic()
    workdir = (options.workdir or proj.build / "test-patches").resolve()
    try:
        staging.check_tool_directory(workdir, WORKDIR_NAMES, (".patched.staging-*", ".patched.retired-*"))
        with workdir_lock(workdir):
            return _session(proj, options, config, workdir, started)
    except (RuntimeError, staging.OutputNotOurs) as exc:  # a busy work directory, a git or process failure
        raise InputError(str(exc)) from exc
    except KeyboardInterrupt:
        raise Interrupted("interrupted; the shared test environment was not modified") from None


def _session(
    proj: Project, options: PatchTestOptions, config: Config, workdir: Path, started: float
) -> PatchTestResult:
    from vllm_overlay import series
    from vllm_overlay.env import shadow, testenv
    from vllm_overlay.upstream import lock
    from vllm_overlay.upstream import trees as upstream_trees

    store = Store()
    # Each series' hypothesis example database, kept in the cache: a failing example replays first.
    config.oracle_db = store.oracle_examples
    the_lock = lock.load(proj.lock_file)
    every = series.load_series(proj.patches)
    selected = series.select(every, options.only)
    problems = _selection_problems(proj, selected)  # before the upstream: a refusal downloads nothing
    for problem in problems:
        output.error(problem)
    if problems:
        return PatchTestResult(2)
    upstream = upstream_trees.obtain(options.upstream, the_lock, store)
    prefix = every[: max(every.index(p) for p in selected) + 1]
    try:
        env = testenv.ensure(the_lock, store, options.env)
        installed = shadow.installed_package_dir(env.python)
    except FileNotFoundError as exc:  # the environment's interpreter has no vllm (testenv.EnvError: an InputError)
        raise InputError(str(exc)) from exc
    applied = _apply_prefix(prefix, upstream, the_lock, store, workdir / "patched")
    if not applied.ok:
        return _apply_failed(applied)
    commits = [(patch, result.commit or "") for patch, result in zip(prefix, applied.results, strict=True)]
    tool_python = tool_test_python() if config.tool_tests else None
    if config.tool_tests and tool_python is None:
        output.warn(
            f"{sys.executable} lacks the tool's test dependencies (scripts/setup --test installs them): "
            "tool tests are not run"
        )
    try:
        result = run_series(
            project_root=proj.root,
            workdir=workdir,
            patched_repo=workdir / "patched",
            upstream_commit=upstream.commit,
            patch_commits=commits,
            selected=[p.name for p in selected],
            python=env.python,
            env_key=env.key,
            installed_package=installed,
            store=store,
            config=config,
            tool_python=tool_python,
            info=output.info,
        )
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        raise InputError(f"preparing the test trees failed: {exc}") from exc
    result.setup_seconds = time.monotonic() - started - result.seconds
    result.extra = {
        "upstream": upstream.to_json(),
        "environment": env.to_json(),
        "only": options.only,
        "applied": [p.name for p in prefix],
        "jobs": config.jobs,
        "per_test_timeout": config.per_test_timeout,
        "oracle_profile": config.oracle_profile,
    }
    output.result(table(result))
    return PatchTestResult(0 if result.ok else 1, result)


def _selection_problems(proj: Project, selected: list[Patch]) -> list[str]:
    """Why the selected patches cannot be tested (empty: they can)."""
    from vllm_overlay import series

    if not selected:
        return ["patches/series lists no patches"]
    return [f"patches/{p.name}: {problem}" for p in selected for problem in series.tests_path_problems(p, proj.root)]


def _apply_prefix(prefix: list[Patch], upstream: Upstream, the_lock: Lock, store: Store, patched: Path) -> Report:
    """Apply the prefix the selected patches need (strictly) into ``patched``."""
    from vllm_overlay.apply import engine as apply
    from vllm_overlay.apply import record as apply_record
    from vllm_overlay.apply import run as apply_run

    output.info(f"applying {len(prefix)} patch(es) onto upstream {upstream.label} -> {patched}")
    return apply_run.apply_series(
        prefix,
        upstream,
        store,
        patched,
        apply.Options(),
        # Unchanged since the last run: answered from the tree's record, nothing rebuilt.
        inputs=apply_record.inputs_for(the_lock, upstream, (False, False, False), False),
    )


def _apply_failed(applied: Report) -> PatchTestResult:
    from vllm_overlay import report

    output.result(report.apply_table(applied))
    failures = [(r.name, f"{r.status}: {r.detail}") for r in applied.results if not r.accepted]
    output.result(f"RESULT: FAILED: {failures[0][0]} does not apply ({failures[0][1]})")
    return PatchTestResult(1, RunReport([]), failures, {"apply": applied.to_json()})
