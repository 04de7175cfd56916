"""Move the series to a new upstream release: 3-way apply, resolve, export, re-lock, test.

    scripts/bump 0.34.0          apply the series with git am --3way into build/bump
    scripts/bump --continue      after resolving a conflict there (git add the files)
    scripts/bump --abort         give up; restores patches/ and upstream.lock if the bump changed them
    scripts/bump 0.34.0 --drop   the drop step: take out the patches every carried line already has

Before it applies anything, bump checks every carried line for each patch's fix (the locked line
on the new release, the CPU carry on its own upstream or --line-upstream cpu=VERSION|DIR|REPO@REV),
by applying each line's series there. A patch every line that carries it already has is proposed
for drop and the bump stops (exit 1) until the drop is done as a step of its own: --drop removes
it from patches/ (and cpu/patches), moves its tests to tests/upstream-behaviour/<series>/, records
it in docs/drops.md with Applied-Upstream, and sets Applied-Upstream / Forwarded on a patch that
only some lines have; commit that, then run the bump again.

--continue refuses while a changed file still holds conflict markers, and names them. A release
older than the lock needs --allow-downgrade. Resolutions are recorded (git rerere, kept in
build/bump-rr-cache), so a second bump over the same conflicts stops only where something new
needs a person. When every patch is in, patches/ and upstream.lock are saved in the bump
repository, the refreshed series is exported and upstream.lock rewritten from the release
(sdist and wheel sha256s from the index, the commit id the release records, its torch and
flashinfer pins); then test-patches runs against the new lock, and if it fails both are
restored (skip the run with --no-test). Until the new files are committed, --abort restores
them. Run audit-upstream first to see what to expect.

--repo DIR must be absent, empty, or a repository an earlier bump made: bump and --abort never
touch or remove anything else there (exit 2).

Exit codes: 0 bumped (and tests passed); 1 stopped at a conflict, refused, or tests failed (patches/
and upstream.lock restored); 2 usage/input error (a --repo bump did not make included); 130 interrupted
(Ctrl-C or SIGTERM: git children ended, one line saying what --abort would restore).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import output, project
from vllm_overlay.commands import add_line_upstream_argument
from vllm_overlay.errors import InputError, Interrupted, WorkFailure
from vllm_overlay.upstream import indexes

if TYPE_CHECKING:
    from vllm_overlay.store import Store
    from vllm_overlay.upstream.trees import Upstream


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    indexes.add_argument(parser)
    parser.add_argument("version", nargs="?", help="the new upstream release (e.g. 0.34.0)")
    parser.add_argument("--continue", dest="resume", action="store_true", help="continue after resolving")
    parser.add_argument("--abort", action="store_true", help="abandon the bump in progress")
    parser.add_argument("--repo", type=Path, default=None, help="working repository (default: build/bump)")
    parser.add_argument("--no-test", action="store_true", help="do not run test-patches after re-locking")
    parser.add_argument("--allow-downgrade", action="store_true", help="allow a release older than the locked one")
    parser.add_argument(
        "--drop", action="store_true", help="only the drop step: remove the patches every carried line already has"
    )
    add_line_upstream_argument(parser)


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import bump, interrupts

    proj = project.from_args(args)
    repo_dir = (args.repo or proj.build / "bump").resolve()
    existed = repo_dir.exists()
    with interrupts.terminate_as_interrupt():
        try:
            return _run(args, proj, repo_dir)
        except KeyboardInterrupt:
            interrupts.end_child_processes()
    if args.version and not existed and repo_dir.exists() and not bump.made_by_bump(repo_dir):
        shutil.rmtree(repo_dir, ignore_errors=True)  # cut short before it was a bump's repository: ours alone
    backup = repo_dir / ".git" / bump.BACKUP_DIR
    if backup.exists():
        raise Interrupted(
            "interrupted while patches/ and upstream.lock were rewritten: scripts/bump --abort restores them"
        )
    stays = (
        f" (the bump's repository stays in {repo_dir}: --continue or --abort)" if bump.made_by_bump(repo_dir) else ""
    )
    raise Interrupted(f"interrupted; patches/ and upstream.lock unchanged{stays}")


def _run(args: argparse.Namespace, proj: project.Project, repo_dir: Path) -> int:
    from vllm_overlay import bump, series
    from vllm_overlay.store import Store
    from vllm_overlay.upstream import lock
    from vllm_overlay.upstream import trees as upstream_trees

    store = Store()
    if sum([bool(args.version), args.resume, args.abort]) != 1:
        raise InputError("give exactly one of: VERSION, --continue, --abort")
    if args.drop and not args.version:
        raise InputError("--drop needs the VERSION the series moves to")
    # A refused or stopped bump (bump.BumpError) ends in cli.main: exit 1; a foreign --repo there: exit 2.
    if args.abort:
        for line in bump.abort(repo_dir, proj.patches, proj.lock_file):
            output.info(line)
        return 0
    if args.version and repo_dir.exists():
        bump.refuse_foreign(repo_dir)  # before anything is downloaded
    the_lock = lock.load(proj.lock_file)
    if args.resume:
        bump.resume(repo_dir)
    else:
        upstream = upstream_trees.obtain(args.version, the_lock, store)
        if upstream.kind not in ("release", "locked"):
            raise InputError("bump needs a published release number; use audit-upstream for directories and git")
        bump.check_direction(the_lock.version, upstream.version or args.version, args.allow_downgrade)
        if _drop_step(args, proj, upstream, store):
            return 0
        patches = series.load_series(proj.patches)
        output.info(f"applying {len(patches)} patches onto {upstream.label} with git am --3way in {repo_dir}")
        locked = upstream_trees.obtain(None, the_lock, store)
        bump.start(patches, upstream, store, repo_dir, args.version, seed_base=locked.commit)
    state = bump.BumpState.load(repo_dir)
    upstream = upstream_trees.Upstream(**state.upstream)  # type: ignore[arg-type]
    relocked = bump.new_lock(the_lock, upstream, store)
    changed = bump.install(repo_dir, proj.patches, proj.lock_file, relocked)
    output.result(f"series refreshed onto {relocked.version}: {len(changed)} file(s) changed: {', '.join(changed)}")
    output.result(f"upstream.lock now pins {relocked.project} {relocked.version} (commit {relocked.commit})")
    output.result("until they are committed, `scripts/bump --abort` restores patches/ and upstream.lock")
    output.result(
        "the Dockerfile's generated parts (base image, series block, provenance defaults) follow them: "
        "scripts/build-image --stage-only --sync-dockerfile, and commit it with them (scripts/check fails until then)"
    )
    if args.no_test:
        return 0
    code = _test_patches(proj)
    if code != 0:
        restored = bump.restore(repo_dir, proj.patches, proj.lock_file)
        raise WorkFailure(
            f"test-patches failed (exit {code}): restored {len(restored)} file(s) of patches/ and upstream.lock; "
            f"the refreshed series stays in {repo_dir} (fix it there, then scripts/bump --continue, or --abort)"
        )
    return 0


def _drop_step(args: argparse.Namespace, proj: project.Project, upstream: Upstream, store: Store) -> bool:
    """Check every carried line for each patch's fix; with --drop take out those all lines have (True: done).

    Without --drop, a patch every line has stops the bump with the proposal (BumpError, exit 1).
    """
    from vllm_overlay import bump, drops
    from vllm_overlay.audit import lines

    specs = lines.parse_line_specs(args.line_upstream, [line.name for line in lines.carried_lines(proj.root)[1:]])
    plan = drops.plan(proj.root, upstream, store, specs)
    for name in plan.held:
        output.warn(
            f"kept: {name}: {plan.summary(name)}; {plan.version} already has it, so git am stops at it "
            "(nothing left to apply) until every carried line has the fix"
        )
    if not args.drop:
        if plan.drop:
            raise bump.BumpError(
                f"{len(plan.drop)} patch(es) every carried line already has, to drop as a step of its own first:\n"
                + "\n".join(f"  {name}: {plan.summary(name)}" for name in plan.drop)
                + f"\nrun: scripts/bump {args.version} --drop   (then commit it, and run scripts/bump {args.version})"
            )
        return False
    changed = drops.apply_plan(proj.root, plan)
    if not plan.drop:
        output.result("nothing to drop: no patch is upstream on every carried line")
        output.result(f"{len(changed)} file(s) changed: {', '.join(changed)}" if changed else "nothing changed")
        return True
    for name in plan.drop:
        output.result(f"dropped: {name} (Applied-Upstream: {plan.version}; {plan.summary(name)})")
    output.result(f"{len(changed)} file(s) changed: {', '.join(changed)}")
    output.result(
        f"its tests now test the upstream behaviour: once the lock is on {plan.version}, run them with the test "
        f"environment's interpreter (<cache>/envs/<key>/bin/python -m pytest {drops.UPSTREAM_BEHAVIOUR.as_posix()}); "
        f"commit the drop, then scripts/bump {args.version}"
    )
    return True


def _test_patches(proj: project.Project) -> int:
    """test-patches against the new lock, with its defaults: its exit code (its input errors as cli.main ends them)."""
    from vllm_overlay import errors, testrun

    try:
        return testrun.run_patch_tests(proj, testrun.PatchTestOptions()).code
    except (errors.InputError, errors.Interrupted) as exc:  # said as cli.main says it; the bump restores, exits 1
        return errors.report(exc)
