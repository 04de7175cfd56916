"""Move the series to a new upstream release: 3-way apply, resolve, export, re-lock, test.

    scripts/bump 0.34.0          apply the series with git am --3way into build/bump
    scripts/bump --continue      after resolving a conflict there (git add the files)
    scripts/bump --abort         give up; patches/ and upstream.lock were not touched

When every patch is in, the refreshed series is exported to patches/ and upstream.lock is
rewritten from the release (sdist and wheel sha256s from the index, the commit id the release
records, its torch and flashinfer pins) in one step; then test-patches runs against the new
lock (skip with --no-test). Run audit-upstream first to see what to expect.

Exit codes: 0 bumped (and tests passed); 1 stopped at a conflict or tests failed; 2 usage/input error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_overlay import bump, cli, indexes, lock, output, project, series, sources
from vllm_overlay.store import Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    indexes.add_argument(parser)
    parser.add_argument("version", nargs="?", help="the new upstream release (e.g. 0.34.0)")
    parser.add_argument("--continue", dest="resume", action="store_true", help="continue after resolving")
    parser.add_argument("--abort", action="store_true", help="abandon the bump in progress")
    parser.add_argument("--repo", type=Path, default=None, help="working repository (default: build/bump)")
    parser.add_argument("--no-test", action="store_true", help="do not run test-patches after re-locking")


def run(args: argparse.Namespace) -> int:
    proj = project.from_args(args)
    repo_dir = (args.repo or proj.build / "bump").resolve()
    store = Store()
    if sum([bool(args.version), args.resume, args.abort]) != 1:
        output.error("give exactly one of: VERSION, --continue, --abort")
        return 2
    try:
        if args.abort:
            bump.abort(repo_dir)
            output.info(f"bump abandoned; {repo_dir} removed")
            return 0
        the_lock = lock.load(proj.lock_file)
        if args.resume:
            bump.resume(repo_dir)
        else:
            upstream = sources.obtain(args.version, the_lock, store)
            if upstream.kind not in ("release", "locked"):
                output.error("bump needs a published release number; use audit-upstream for directories and git")
                return 2
            patches = series.load_series(proj.patches)
            output.info(f"applying {len(patches)} patches onto {upstream.label} with git am --3way in {repo_dir}")
            locked = sources.obtain(None, the_lock, store)
            bump.start(patches, upstream, store, repo_dir, args.version, seed_base=locked.commit)
        state = bump.BumpState.load(repo_dir)
        upstream = sources.Upstream(**state.upstream)  # type: ignore[arg-type]
        relocked = bump.new_lock(the_lock, upstream, store)
        changed = bump.finish(repo_dir, proj.patches)
        lock.write(relocked, proj.lock_file)
    except bump.BumpError as exc:
        output.error(str(exc))
        return 1
    except (lock.LockError, series.SeriesError, sources.SourceError) as exc:
        output.error(str(exc))
        return 2
    output.result(f"series refreshed onto {relocked.version}: {len(changed)} file(s) in patches/ changed")
    output.result(f"upstream.lock now pins {relocked.project} {relocked.version} (commit {relocked.commit})")
    if args.no_test:
        return 0
    if "test-patches" not in cli.VERBS:
        output.warn("test-patches is not available; run the per-patch tests yourself")
        return 0
    return cli.main(["test-patches", "--project", str(proj.root)])
