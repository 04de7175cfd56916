"""Apply the patch series onto a fresh copy of the upstream tree.

The output directory becomes a git repository: the upstream tree as the first commit (tagged
upstream/<version>), then one commit per patch, ready to inspect, amend and re-export with
export-patches. Every patch gets exactly one status: clean, offset, fuzz, merged-3way, conflict,
already-upstream or target-missing. Anything but clean fails the run unless widened on purpose
(--allow-offset, --allow-fuzz, --3way). A failed run leaves the output directory as it was.

A re-apply reuses what the output already holds, when it is untouched since this tool published
it from the same upstream.lock, upstream and options (the tree records them): with the same patch
bytes nothing is rebuilt and the recorded statuses are reported; after patch k changed, patches
k..n are re-applied on the published 1..k-1, and the result replaces the output in one step as a
full apply does. An output changed by hand in any way (a commit, an edit, a new file) is built
from upstream as before; --rebuild always builds from upstream.

One run at a time writes an output: a second one waits for the first (or, with --no-wait, exits 2
naming its pid); so it does for the cache's lock, saying once whose run it waits for. Ctrl-C or
SIGTERM stop a run with one line and exit 130; the output is left as it was (or, interrupted after
publishing, is the new tree, as the line says).

Exit codes: 0 all patches applied; 1 a patch was refused (nothing written); 2 usage or input error,
or the output or the cache busy with --no-wait; 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import indexes, output, project
from vllm_overlay.errors import InputError, Interrupted

if TYPE_CHECKING:
    from vllm_overlay import apply, lock, series, upstream_trees
    from vllm_overlay.store import Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    indexes.add_argument(parser)
    parser.add_argument(
        "--upstream",
        default=None,
        metavar="VERSION|DIR|REPO@REV",
        help="upstream to patch: the locked release (default), another release by number (e.g. 0.32.0), "
        "a local source directory, or a git repository and revision",
    )
    parser.add_argument("--output", "-o", type=Path, default=None, help="patched repository (default: build/patched)")
    parser.add_argument("--allow-offset", action="store_true", help="accept hunks that apply at other lines")
    parser.add_argument("--allow-fuzz", action="store_true", help="accept hunks that apply only with reduced context")
    parser.add_argument("--3way", dest="three_way", action="store_true", help="accept patches that need a 3-way merge")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="apply only this series (or this patch and nothing else); repeat for several",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the machine-readable report")
    parser.add_argument(
        "--discard-unexported",
        action="store_true",
        help="replace the output even though it holds commits or changes patches/ does not have "
        "(refused without this flag: exit 2, naming them)",
    )
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="build the output from upstream even when it already holds this build (by default an unchanged "
        "output is left as it is, and after a patch changed only it and the patches after it are re-applied)",
    )
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="if another run is writing the output or holds the cache, exit 2 (naming its pid) instead of "
        "waiting for it",
    )
    parser.add_argument(
        "--base-upstream",
        default=None,
        metavar="VERSION|DIR|REPO@REV",
        help="the upstream the series was written against (default: the lock); used for 3-way merges "
        "and the target-drift comparison",
    )


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import apply, interrupts  # imported here: --help and other verbs never need them

    proj = project.from_args(args)
    target = (args.output or proj.patched_tree).resolve()
    with interrupts.terminate_as_interrupt():
        try:
            return _run(args, proj, target)
        except apply.Interrupted as exc:
            published = exc.published
        except KeyboardInterrupt:  # while obtaining the upstream: end the git it may have started
            interrupts.end_child_processes()
            published = False
    raise Interrupted(f"interrupted; {target} " + ("already holds the new tree" if published else "unchanged"))


def _run(args: argparse.Namespace, proj: project.Project, target: Path) -> int:
    from vllm_overlay import apply, apply_record, lock, series, staging, upstream_trees
    from vllm_overlay.store import Store

    # Input errors (lock, series, upstream, an output this tool did not publish) end in cli.main: exit 2.
    the_lock = lock.load(proj.lock_file)
    store = Store(wait=args.wait)  # --no-wait: the cache's locks too, not only the output's
    options = apply.Options(args.allow_offset, args.allow_fuzz, args.three_way)
    if args.upstream is None and not args.only and not args.rebuild:
        recorded = upstream_trees.imported_locked(the_lock, store)
        mails = series.read_series_bytes(proj.patches, allow_empty=False)
        digest = apply_record.lock_digest(the_lock)
        unchanged = recorded and apply.unchanged_report(
            target, digest, recorded, options, mails, args.wait, output.waiting_for(target)
        )
        if unchanged:
            return _report_applied(args, unchanged, [], the_lock, store, unchanged.upstream, target)
        if recorded:
            # The spare's record, read once: the upstream it was built from, when that is the locked
            # import (the run may then need no upstream file), and how many patches it holds.
            spare_record = apply_record.load(staging.spare_path(target))
            spare = apply_record.upstream_if_imported(spare_record, digest, recorded)
            held = apply_record.same_prefix(spare_record, mails) if spare and spare_record else 0
            spare_upstream = upstream_trees.Upstream(**spare) if spare else None
            return _build(args, proj, target, the_lock, store, options, spare_upstream, mails, held)
    return _build(args, proj, target, the_lock, store, options)


def _build(
    args: argparse.Namespace,
    proj: project.Project,
    target: Path,
    the_lock: lock.Lock,
    store: Store,
    options: apply.Options,
    spare_upstream: upstream_trees.Upstream | None = None,
    mails: list[tuple[str, bytes]] | None = None,
    parsed_before: int = 0,
) -> int:
    """Obtain (and verify) the upstream and apply the series: what every run does that a record cannot answer.

    With ``spare_upstream`` (the locked import, which the output's spare tree was built from) the
    upstream is obtained only if the run checks it out: a re-apply that starts from the spare reads
    no upstream file (the spare holds the verified upstream's commit, as the output does), and
    one that cannot verifies it first, as every build from upstream does. ``mails``: the patch
    files as already read (``series.read_series_bytes``); the first ``parsed_before``, which the
    spare's record names (or more, where a kept build of the run's inputs records more), are parsed
    only if the run needs them (``series.patches_from_bytes``).
    """
    from vllm_overlay import apply, apply_record, kept_builds, series, staging, upstream_trees

    parsed = series.load_series(proj.patches, allow_empty=False) if mails is None else []
    upstream = spare_upstream or upstream_trees.obtain(args.upstream, the_lock, store)
    staging.check_replaceable(target)  # the user's own directory: refused before anything else
    inputs = apply_record.inputs_for(
        the_lock, upstream, (options.allow_offset, options.allow_fuzz, options.three_way), bool(args.only)
    )
    if mails is not None:
        # The patches a kept build of these inputs records were parsed by this engine too: a build
        # into a new output that a kept build serves parses none of them (a run the spare serves
        # does not look).
        kept_before = 0 if args.rebuild or parsed_before else kept_builds.held(store, inputs, mails)
        parsed = series.patches_from_bytes(proj.patches, mails, max(parsed_before, kept_before))
    patches = series.select(parsed, args.only)

    def verified_upstream() -> upstream_trees.Upstream:
        """The upstream, verified (a run that started from the spare's record had not yet read it)."""
        verified = upstream_trees.obtain(args.upstream, the_lock, store) if spare_upstream else upstream
        if verified != upstream:
            raise apply.ApplyError(
                f"the upstream cache's {upstream.tag} changed while this run started ({upstream.commit} was "
                f"recorded, {verified.commit} verified); run again"
            )
        return verified

    def checkout(dest: Path, only: list[str] | None) -> None:
        upstream_trees.checkout(store, verified_upstream(), dest, only)

    def refuse_lost_work() -> None:
        """Under the output's lock, before it is rebuilt (an unchanged output is never replaced)."""
        if not target.is_dir() or args.discard_unexported:
            return
        from vllm_overlay import export  # here: a run that replaces an untouched output never needs it

        lost = export.unexported_work(target, proj.patches, staging.published_head(target))
        if lost:
            raise apply.WorkWouldBeLost(
                f"{target} holds work that is not in patches/, which replacing it would throw away: "
                + "; ".join(lost)
                + ". Commit it and run scripts/export-patches first, or pass --discard-unexported to drop it"
            )

    output.info(f"applying {len(patches)} patch(es) onto upstream {upstream.label} -> {target}")
    try:
        result = apply.apply_series(
            patches,
            upstream,
            checkout,
            target,
            options,
            progress=lambda i, n, name: output.info(f"[{i}/{n}] {name}"),
            seed_base=lambda: base_upstream(args.base_upstream, the_lock, store, upstream).commit,
            wait=args.wait,
            on_wait=output.waiting_for(target),
            partial=bool(args.only),
            inputs=inputs,
            before_replace=refuse_lost_work,
            reuse=not args.rebuild,
            kept=kept_builds.KeptBuilds(store, inputs, upstream.commit, verified_upstream),
        )
    except git_failures() as exc:  # not a patch's fault (that is a status): the machine's
        raise InputError(f"git failed: {git_failure_text(exc)}; {target} unchanged") from exc
    return _report_applied(args, result, patches, the_lock, store, upstream, target)


def git_failures() -> tuple[type[Exception], ...]:
    """The exceptions of a git step that failed: the plain git calls', and GitPython's where a step
    used it (evaluated when an exception arrives: a run that never imported GitPython raises none)."""
    import sys

    from vllm_overlay import patched_repo

    gitpython = sys.modules.get("git")
    return (patched_repo.GitError, gitpython.GitCommandError) if gitpython else (patched_repo.GitError,)


def git_failure_text(exc: Exception) -> str:
    command = getattr(exc, "command", None)  # GitPython's
    if command is None:
        return str(exc)
    return f"{' '.join(map(str, command))}: {str(getattr(exc, 'stderr', '')).strip()}"


def _report_applied(
    args: argparse.Namespace,
    result: apply.Report,
    patches: list[series.Patch],
    the_lock: lock.Lock,
    store: Store,
    upstream: upstream_trees.Upstream,
    target: Path,
) -> int:
    """After the apply: target drift (on another upstream), the table, the JSON report; the exit code."""
    from vllm_overlay import apply, report, upstream_trees

    try:
        if upstream.kind != "locked":
            base = base_upstream(args.base_upstream, the_lock, store, upstream)
            note_target_drift(result, patches, store, base, upstream)
        output.result(report.apply_table(result))
        if args.json:
            report.write_json(result.to_json(), args.json)
    except upstream_trees.SourceError as exc:
        raise upstream_trees.SourceError(f"{exc} (the patched tree was written: {target})") from exc
    except KeyboardInterrupt:
        raise apply.Interrupted(target, result.published) from None
    return 0 if result.ok else 1


def base_upstream(
    spec: str | None, the_lock: lock.Lock, store: Store, upstream: upstream_trees.Upstream
) -> upstream_trees.Upstream:
    """The upstream the series was written for (obtained only when needed: it may download)."""
    from vllm_overlay import upstream_trees

    if spec is None and upstream.kind == "locked":
        return upstream
    return upstream_trees.obtain(spec, the_lock, store)


def note_target_drift(
    result: apply.Report,
    patches: list[series.Patch],
    store: Store,
    locked: upstream_trees.Upstream,
    upstream: upstream_trees.Upstream,
) -> None:
    """Warn, for each patch that applied, about Targets whose AST differs from the locked upstream."""
    from vllm_overlay import apply
    from vllm_overlay.audit import session
    from vllm_overlay.audit.decisions import DRIFTING

    drift = session.drift_by_patch(store, locked, upstream, patches)
    for patch_result in result.results:
        changed = [d for d in drift.get(patch_result.name, []) if d.drift in DRIFTING]
        if patch_result.accepted or patch_result.status in (apply.Status.OFFSET, apply.Status.FUZZ):
            for item in changed:
                patch_result.warnings.append(f"applied {patch_result.status}, target changed: {item}")
