"""Prove every patch red -> green and guard vLLM's own tests, patch by patch.

The series is applied (strictly) into build/test-patches/patched, never touching build/patched.
For patch k of the series, with the files of the series prefix laid over the test environment's
installed vllm (a shadow package first on PYTHONPATH; the environment itself is never modified):

  red        the patch's Tests on patches 1..k-1 must FAIL: every Tests file has a failing test.
             A file that passes is reported NOT-DETECTED ("test does not detect the defect");
             collection errors and other pytest exit codes are reported as such.
  green      the patch's Tests on patches 1..k must PASS.
  upstream   the patch's Upstream-Tests (vLLM's own tests from the upstream tree's tests/, run
             offline with a per-test timeout) after patch k, compared test id by test id with the
             pristine tree: nothing may go from pass/skip to fail/error/timeout.

Every result is kept in the verdict store (the cache's verdicts/) under a key made of what decided
it: the tested tree's git tree id, the content of the test files the run can import, the test
environment's key and the runner's version. A result whose key is stored is reused without
starting pytest (the JSON says "cached" per patch; the table shows it); --no-cache runs everything.

After the last patch: every selected patch's Tests together on the full series (one process),
then the tool tests (tests/tool).

The test environment (vllm==<locked version>, pytest, pytest-timeout, tblib, hypothesis and the
tool's dependencies) is built on first use in the cache (~3 min, ~10 GB) and reused while
upstream.lock and the pins are unchanged; before every run the installed vllm is proven pristine
against its wheel's RECORD (rebuilt if not): in full once, then re-hashing only the files whose
stat (size, mtime, ctime, inode) changed since. --env DIR / $VLLM_OVERLAY_ENV use another one.

Exit codes: 0 every check passed; 1 a patch failed (apply, red, green or upstream tests), or the
full-series or tool tests failed; 2 usage, input or environment error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import indexes, output, project

if TYPE_CHECKING:
    from vllm_overlay import testrun

# The environment override (vllm_overlay.testenv.ENV_VAR: named here so --help need not import envs).
ENV_VAR = "VLLM_OVERLAY_ENV"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    indexes.add_argument(parser)
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="SERIES_OR_PATCH",
        help="test only this series or patch (the patches before it are still applied as its prefix); "
        "repeat for several",
    )
    parser.add_argument(
        "--upstream",
        default=None,
        metavar="VERSION|DIR|REPO@REV",
        help="upstream to apply the series to (default: the locked release). The environment still holds the "
        "locked vllm, so use this for trees that match it (a local copy of the release, a rev of it)",
    )
    parser.add_argument(
        "--keep-going", action="store_true", help="run every check even after one failed (default: stop)"
    )
    parser.add_argument(
        "--env",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"use this virtual environment instead of the cached one (also ${ENV_VAR}); never modified",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the machine-readable report")
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE", help="write a JUnit XML report")
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        help=f"pytest processes at once (default: one per core, at most 4: {max(1, min(os.cpu_count() or 1, 4))} here)",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="per-test timeout (pytest-timeout; default %(default)s)",
    )
    parser.add_argument(
        "--run-timeout",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="limit for one pytest process (default %(default)s)",
    )
    parser.add_argument("--no-tool-tests", action="store_true", help="do not run tests/tool at the end")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="run every test even when the verdict store holds its result (results are stored again)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch directory (default: build/test-patches; the patched repo is WORKDIR/patched)",
    )


# What a run writes in its work directory; a directory holding anything else is the user's.
WORKDIR_NAMES = frozenset(
    {".lock", ".patched.lock", "patched", "steps", "upstream-tests", "logs", "junit", "hypothesis"}
)


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import staging, testrun

    if args.jobs is None:
        args.jobs = testrun.default_jobs()
    if args.jobs < 1 or args.timeout < 1 or args.run_timeout < 1:
        output.error("--jobs, --timeout and --run-timeout must be positive")
        return 2
    started = time.monotonic()
    proj = project.from_args(args)
    workdir = (args.workdir or proj.build / "test-patches").resolve()
    try:
        staging.check_tool_directory(workdir, WORKDIR_NAMES, (".patched.staging-*", ".patched.retired-*"))
        with testrun.workdir_lock(workdir):
            return _run(args, proj, workdir, started)
    except (RuntimeError, staging.OutputNotOurs) as exc:
        output.error(str(exc))
        return 2
    except KeyboardInterrupt:
        output.error("interrupted; the shared test environment was not modified")
        return 130


def _run(args: argparse.Namespace, proj: project.Project, workdir: Path, started: float) -> int:
    from vllm_overlay import apply, apply_record, lock, report, series, shadow, testenv, testrun, upstream_trees
    from vllm_overlay.store import Store

    store = Store()
    the_lock = lock.load(proj.lock_file)
    every = series.load_series(proj.patches)
    selected = series.select(every, args.only)
    upstream = upstream_trees.obtain(args.upstream, the_lock, store)
    if not selected:
        output.error("patches/series lists no patches")
        return 2
    outside = [f"patches/{p.name}: {problem}" for p in selected for problem in series.tests_path_problems(p, proj.root)]
    if outside:
        for problem in outside:
            output.error(problem)
        return 2
    last = max(every.index(p) for p in selected)
    prefix = every[: last + 1]
    try:
        env = testenv.ensure(the_lock, store, args.env)
        installed = shadow.installed_package_dir(env.python)
    except (testenv.EnvError, FileNotFoundError) as exc:
        output.error(str(exc))
        return 2

    # Apply the prefix the selected patches need.
    patched = workdir / "patched"
    output.info(f"applying {len(prefix)} patch(es) onto upstream {upstream.label} -> {patched}")
    applied = apply.apply_series(
        prefix,
        upstream,
        lambda dest: upstream_trees.checkout(store, upstream, dest),
        patched,
        apply.Options(),
        # Unchanged since the last run: answered from the tree's record, nothing rebuilt.
        inputs=apply_record.inputs_for(the_lock, upstream, (False, False, False), False),
    )
    if not applied.ok:
        output.result(report.apply_table(applied))
        failures = [(r.name, f"{r.status}: {r.detail}") for r in applied.results if not r.accepted]
        output.result(f"RESULT: FAILED: {failures[0][0]} does not apply ({failures[0][1]})")
        _write_reports(args, testrun.RunReport([]), failures, {"apply": applied.to_json()})
        return 1
    commits = [(patch, result.commit or "") for patch, result in zip(prefix, applied.results, strict=True)]

    config = testrun.Config(
        jobs=args.jobs,
        per_test_timeout=args.timeout,
        run_timeout=args.run_timeout,
        keep_going=args.keep_going,
        tool_tests=not args.no_tool_tests,
        use_cache=not args.no_cache,
    )
    tool_python = testrun.tool_test_python(env.python) if config.tool_tests else None
    if config.tool_tests and tool_python is None:
        output.warn("no interpreter with pytest and the tool's dependencies: tool tests are not run")
    try:
        result = testrun.run_series(
            project_root=proj.root,
            workdir=workdir,
            patched_repo=patched,
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
        output.error(f"preparing the test trees failed: {exc}")
        return 2
    result.setup_seconds = time.monotonic() - started - result.seconds
    result.extra = {
        "upstream": upstream.to_json(),
        "environment": env.to_json(),
        "only": args.only,
        "applied": [p.name for p in prefix],
        "jobs": config.jobs,
        "per_test_timeout": config.per_test_timeout,
    }
    output.result(testrun.table(result))
    _write_reports(args, result, [], {})
    return 0 if result.ok else 1


def _write_reports(
    args: argparse.Namespace, result: testrun.RunReport, apply_failures: list[tuple[str, str]], extra: dict
) -> None:
    from vllm_overlay import junit, report, testrun

    if args.json:
        data = {**result.to_json(), **extra}
        if apply_failures:
            data["ok"] = False
            data["apply_failures"] = [{"patch": n, "detail": d} for n, d in apply_failures]
        report.write_json(json.loads(json.dumps(data, default=str)), args.json)
        output.info(f"JSON report: {args.json}")
    if args.junit:
        junit.write_report(testrun.junit_cases(result, apply_failures), args.junit)
        output.info(f"JUnit report: {args.junit}")
