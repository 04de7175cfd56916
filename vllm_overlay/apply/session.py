"""apply-patches as a whole: answer a re-apply from the output's record, else obtain the upstream
and build, then report (target drift on another upstream, the table, the JSON report).

``commands/apply_patches.py`` parses the arguments into a ``Request``; everything the verb does
after that is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay import interrupts, output, project, series
from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import kept_builds, staging
from vllm_overlay.apply import record as apply_record
from vllm_overlay.apply import run as apply_run
from vllm_overlay.errors import InputError, Interrupted
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees


@dataclass(frozen=True)
class Request:
    """What apply-patches was asked (its options, as the command line gave them)."""

    upstream: str | None = None  # VERSION|DIR|REPO@REV; None: the locked release
    output: Path | None = None  # None: the project's build/patched
    only: list[str] | None = None
    allow_offset: bool = False
    allow_fuzz: bool = False
    three_way: bool = False
    rebuild: bool = False
    wait: bool = True
    base_upstream: str | None = None
    discard_unexported: bool = False
    json: Path | None = None


def run(proj: project.Project, request: Request) -> int:
    """apply-patches: answer from the output's record where it can, else build; the exit code."""
    target = (request.output or proj.patched_tree).resolve()
    with interrupts.terminate_as_interrupt():
        try:
            return _run(request, proj, target)
        except apply.Interrupted as exc:
            published = exc.published
        except KeyboardInterrupt:  # while obtaining the upstream: end the git it may have started
            interrupts.end_child_processes()
            published = False
    raise Interrupted(f"interrupted; {target} " + ("already holds the new tree" if published else "unchanged"))


def _run(request: Request, proj: project.Project, target: Path) -> int:
    # Input errors (lock, series, upstream, an output this tool did not publish) end in cli.main: exit 2.
    the_lock = lock.load(proj.lock_file)
    store = Store(wait=request.wait)  # --no-wait: the cache's locks too, not only the output's
    options = apply.Options(request.allow_offset, request.allow_fuzz, request.three_way)
    if request.upstream is None and not request.only and not request.rebuild:
        recorded = upstream_trees.imported_locked(the_lock, store)
        mails = series.read_series_bytes(proj.patches, allow_empty=False)
        digest = apply_record.lock_digest(the_lock)
        unchanged = recorded and apply_run.unchanged_report(
            target, digest, recorded, options, mails, request.wait, output.waiting_for(target)
        )
        if unchanged:
            return _report_applied(request, unchanged, [], the_lock, store, unchanged.upstream, target)
        if recorded:
            # The spare's record, read once: the upstream it was built from, when that is the locked
            # import (the run may then need no upstream file), and how many patches it holds.
            spare_record = apply_record.load(staging.spare_path(target))
            spare = apply_record.upstream_if_imported(spare_record, digest, recorded)
            held = apply_record.same_prefix(spare_record, mails) if spare and spare_record else 0
            spare_upstream = upstream_trees.Upstream(**spare) if spare else None
            return _build(request, proj, target, the_lock, store, options, spare_upstream, mails, held)
    return _build(request, proj, target, the_lock, store, options)


def _build(
    request: Request,
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

    parsed = series.load_series(proj.patches, allow_empty=False) if mails is None else []
    upstream = spare_upstream or upstream_trees.obtain(request.upstream, the_lock, store)
    staging.check_replaceable(target)  # the user's own directory: refused before anything else
    inputs = apply_record.inputs_for(
        the_lock, upstream, (options.allow_offset, options.allow_fuzz, options.three_way), bool(request.only)
    )
    if mails is not None:
        # The patches a kept build of these inputs records were parsed by this engine too: a build
        # into a new output that a kept build serves parses none of them (a run the spare serves
        # does not look).
        kept_before = 0 if request.rebuild or parsed_before else kept_builds.held(store, inputs, mails)
        parsed = series.patches_from_bytes(proj.patches, mails, max(parsed_before, kept_before))
    patches = series.select(parsed, request.only)

    def verified_upstream() -> upstream_trees.Upstream:
        """The upstream, verified (a run that started from the spare's record had not yet read it)."""
        verified = upstream_trees.obtain(request.upstream, the_lock, store) if spare_upstream else upstream
        if verified != upstream:
            raise apply.ApplyError(
                f"the upstream cache's {upstream.tag} changed while this run started ({upstream.commit} was "
                f"recorded, {verified.commit} verified); run again"
            )
        return verified

    def refuse_lost_work() -> None:
        """Under the output's lock, before it is rebuilt (an unchanged output is never replaced)."""
        if not target.is_dir() or request.discard_unexported:
            return
        from vllm_overlay.apply import export  # here: a run that replaces an untouched output never needs it

        lost = export.unexported_work(target, proj.patches, staging.published_head(target))
        if lost:
            raise apply.WorkWouldBeLost(
                f"{target} holds work that is not in patches/, which replacing it would throw away: "
                + "; ".join(lost)
                + ". Commit it and run scripts/export-patches first, or pass --discard-unexported to drop it"
            )

    output.info(f"applying {len(patches)} patch(es) onto upstream {upstream.label} -> {target}")
    try:
        result = apply_run.apply_series(
            patches,
            upstream,
            store,
            target,
            options,
            progress=lambda i, n, name: output.info(f"[{i}/{n}] {name}"),
            seed_base=lambda: base_upstream(request.base_upstream, the_lock, store, upstream).commit,
            wait=request.wait,
            on_wait=output.waiting_for(target),
            partial=bool(request.only),
            inputs=inputs,
            before_replace=refuse_lost_work,
            reuse=not request.rebuild,
            kept=kept_builds.KeptBuilds(store, inputs, upstream.commit, verified_upstream),
            verify_upstream=verified_upstream,
        )
    except gitcmd.GitError as exc:  # not a patch's fault (that is a status): the machine's
        raise InputError(f"git failed: {exc}; {target} unchanged") from exc
    return _report_applied(request, result, patches, the_lock, store, upstream, target)


def _report_applied(
    request: Request,
    result: apply.Report,
    patches: list[series.Patch],
    the_lock: lock.Lock,
    store: Store,
    upstream: upstream_trees.Upstream,
    target: Path,
) -> int:
    """After the apply: target drift (on another upstream), the table, the JSON report; the exit code."""
    from vllm_overlay import report

    try:
        if upstream.kind != "locked":
            base = base_upstream(request.base_upstream, the_lock, store, upstream)
            note_target_drift(result, patches, store, base, upstream)
        output.result(report.apply_table(result))
        if request.json:
            report.write_json(result.to_json(), request.json)
    except upstream_trees.SourceError as exc:
        raise upstream_trees.SourceError(f"{exc} (the patched tree was written: {target})") from exc
    except KeyboardInterrupt:
        raise apply.Interrupted(target, result.published) from None
    return 0 if result.ok else 1


def base_upstream(
    spec: str | None, the_lock: lock.Lock, store: Store, upstream: upstream_trees.Upstream
) -> upstream_trees.Upstream:
    """The upstream the series was written for (obtained only when needed: it may download)."""

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
    from vllm_overlay.audit import session as audit_session
    from vllm_overlay.audit.decisions import DRIFTING

    drift = audit_session.drift_by_patch(store, locked, upstream, patches)
    for patch_result in result.results:
        changed = [d for d in drift.get(patch_result.name, []) if d.drift in DRIFTING]
        if patch_result.accepted or patch_result.status in (apply.Status.OFFSET, apply.Status.FUZZ):
            for item in changed:
                patch_result.warnings.append(f"applied {patch_result.status}, target changed: {item}")
