"""Export the patched repository back to patches/ and patches/series, byte-stable.

Every commit after the upstream commit becomes one git-format-patch file. Exporting an unchanged
series changes no byte. With --check nothing is written: the command prints the difference and
exits 1 if patches/ is stale (exit 0 when up to date). After writing, the generated parts of the
Dockerfile (series block, provenance defaults: what `docker build .` reads) are brought in line.

The patched repository must be built on the locked release (tag upstream/<version>, as
apply-patches leaves it); a tree applied onto another upstream is refused (exit 2) unless
--allow-other-upstream says so. Merge commits, empty commits and commits that change a
.gitattributes file (binary patches) are refused, naming the commit. A tree apply-patches
--only made holds part of the series: only its patches are written, every other patch file and
its place in patches/series are left as they are.

It reads the patched repository under that tree's lock (an apply-patches run replacing it is
waited for) and writes patches/ under patches/'s own lock (one export at a time); --no-wait exits 2
instead of waiting.

Exit codes: 0 exported (or, with --check, up to date); 1 --check found patches/ stale; 2 usage or
input error (a tree on another upstream, a refused commit, a lock held with --no-wait); 130
interrupted (Ctrl-C or SIGTERM): one line says whether patches/ is unchanged or holds the whole
new series (it is written whole or not at all).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from vllm_overlay import output, project
from vllm_overlay.errors import InputError, Interrupted, WorkFailure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument("--repo", type=Path, default=None, help="patched repository (default: build/patched)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 and show the diff if stale")
    parser.add_argument(
        "--allow-other-upstream",
        action="store_true",
        help="export a tree built on another upstream than the lock's release (its patches fit that upstream, "
        "and a strict apply onto the lock may refuse them); refused without this flag",
    )
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="exit 2 if another run is writing the patched repository or patches/, instead of waiting",
    )


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import interrupts
    from vllm_overlay.apply import staging

    proj = project.from_args(args)
    repo_dir = (args.repo or proj.patched_tree).resolve()
    if not repo_dir.is_dir():
        raise InputError(f"{repo_dir}: no patched repository; run scripts/apply-patches first")

    written: list[bool] = []  # set once patches/ holds the new series (the write is never cut in two)
    with interrupts.terminate_as_interrupt():
        try:
            with contextlib.ExitStack() as locks:
                # The tree first, then patches/: the same order in every export, so two never deadlock.
                for path in [repo_dir] if args.check else [repo_dir, proj.patches]:
                    locks.enter_context(staging.output_lock(path, wait=args.wait, on_wait=output.waiting_for(path)))
                return _export(args, proj, repo_dir, written)
        except KeyboardInterrupt:
            interrupts.end_child_processes()  # the git a SIGTERM did not reach
    if written:
        raise Interrupted("interrupted after patches/ was written: it holds the whole exported series")
    raise Interrupted("interrupted; patches/ unchanged")


def _export(args: argparse.Namespace, proj: project.Project, repo_dir: Path, written: list[bool]) -> int:
    from vllm_overlay import faults, interrupts
    from vllm_overlay.apply import export, staging
    from vllm_overlay.upstream import lock

    if not args.allow_other_upstream:
        export.check_locked_upstream(repo_dir, lock.load(proj.lock_file).version)
    exported = export.export_commits(repo_dir)
    partial = export.is_partial(repo_dir)
    wanted = export.rendered_partial(exported, proj.patches) if partial else export.rendered(exported)
    faults.phase("export-read")
    if args.check:
        diff = export.differences(proj.patches, wanted)
        if diff:
            sys.stdout.writelines(diff)
            raise WorkFailure("patches/ is stale: run scripts/export-patches")
        output.info(f"patches/ is up to date ({len(wanted) - 1} patches)")
        return 0
    removed = set(export.stale_files(proj.patches, wanted))
    with interrupts.deferred():  # a signal arrives once patches/, the marker and the Dockerfile are written
        changed = export.write(proj.patches, wanted)
        staging.mark_published(repo_dir)  # its work is in patches/ now: apply-patches may replace it
        refresh_dockerfile(proj)  # also when patches/ was already written by an earlier export
        written.append(True)
    for name in changed:
        output.result(f"{'removed' if name in removed else 'wrote'} patches/{name}")
    if partial:
        output.info(
            f"{len(exported)} patch(es) exported from a tree apply-patches --only made; the other patches "
            "listed in patches/series were left as they are"
        )
    else:
        output.info(f"{len(wanted) - 1} patches exported; {len(changed)} file(s) changed")
    return 0


def refresh_dockerfile(proj: project.Project) -> None:
    """Sync the Dockerfile's generated parts after patches/ changed; a warning (not a failure) if it cannot."""
    from vllm_overlay import series  # image (and its SBOM library) only when writing
    from vllm_overlay.image import build, build_context
    from vllm_overlay.upstream import lock  # image (and its SBOM library) only when writing

    try:
        lines = build.refresh_project_dockerfile(proj, lock.load(proj.lock_file), series.load_series(proj.patches))
    except (lock.LockError, series.SeriesError, build_context.ImageError) as exc:
        output.warn(
            f"Dockerfile not updated ({exc}); run scripts/apply-patches (a commit exported for the first time "
            "gets its Patch-File trailer there), then scripts/build-image --stage-only --sync-dockerfile"
        )
        return
    if lines:
        output.result(f"updated the generated parts of Dockerfile ({lines} line(s)): commit it with patches/")
