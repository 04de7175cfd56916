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
import os
from pathlib import Path

from vllm_overlay import output, project
from vllm_overlay.upstream import indexes

# The environment override (vllm_overlay.env.testenv.ENV_VAR: named here so --help need not import envs).
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
        "--deep",
        action="store_true",
        help="run each series' oracle (tests/patches/SERIES/oracle_*.py) with its long example budget "
        "instead of its fixed CI budget",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch directory (default: build/test-patches; the patched repo is WORKDIR/patched)",
    )


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import junit, report, testrun

    options = testrun.PatchTestOptions(
        only=args.only,
        upstream=args.upstream,
        keep_going=args.keep_going,
        env=args.env,
        jobs=args.jobs,
        timeout=args.timeout,
        run_timeout=args.run_timeout,
        tool_tests=not args.no_tool_tests,
        use_cache=not args.no_cache,
        workdir=args.workdir,
        deep=args.deep,
    )
    result = testrun.run_patch_tests(project.from_args(args), options)
    if result.report is None:  # stopped before there was anything to report (exit 2)
        return result.code
    if args.json:
        report.write_json(result.to_json(), args.json)
        output.info(f"JSON report: {args.json}")
    if args.junit:
        junit.write_report(testrun.junit_cases(result.report, result.apply_failures), args.junit)
        output.info(f"JUnit report: {args.junit}")
    return result.code
