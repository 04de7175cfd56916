"""Moving the series to another upstream: target drift, the audit run, and the range-diff."""

from __future__ import annotations

import datetime as dt
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import git

from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import patched_repo
from vllm_overlay.apply import run as apply_run
from vllm_overlay.audit import decisions, dependencies, lines, review, targets
from vllm_overlay.series import Patch
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees
from vllm_overlay.upstream.lock import Lock

Progress = Callable[[int, int, str], None]


def drift_by_patch(store: Store, old: upstream_trees.Upstream, new: upstream_trees.Upstream, patches: list[Patch]):
    """Each patch's Targets compared by AST between two upstream commits of the store."""
    repo = git.Repo(store.upstreams_git)
    read_old = decisions.store_reader(repo, old.commit)
    read_new = decisions.store_reader(repo, new.commit)
    return {patch.name: targets.compare_all(patch.targets, read_old, read_new) for patch in patches}


def dependency_drift(
    store: Store, old: upstream_trees.Upstream, new: upstream_trees.Upstream, patches: list[Patch], lock: Lock
) -> dict[str, list[dependencies.DependencyDrift]]:
    """Each patch's Dependency-Targets compared between the pins each release's metadata states."""
    repo = git.Repo(store.upstreams_git)
    locked = {dependencies.normalize(k): v for k, v in lock.pins.items()}

    def pins(upstream: upstream_trees.Upstream) -> dict[str, str]:
        if upstream.kind == "locked":  # what the lock pins is what the series was tested with
            return locked
        return dependencies.release_pins(decisions.store_reader(repo, upstream.commit))

    old_pins, new_pins = pins(old), pins(new)
    return dependencies.drift_by_patch(patches, old_pins, new_pins, store)


def findings(
    store: Store,
    old: upstream_trees.Upstream,
    new: upstream_trees.Upstream,
    patches: list[Patch],
    report: apply.Report,
    old_report: apply.Report,
    old_dir: Path,
    new_dir: Path,
) -> dict[str, decisions.Findings]:
    """Conflicting vs merging files, broken merges and moved targets, patch by patch."""
    repo = git.Repo(new_dir)
    old_repo = git.Repo(old_dir) if (old_dir / ".git").exists() else None
    store_repo = git.Repo(store.upstreams_git)
    read_new = decisions.store_reader(store_repo, new.commit)
    read_old = decisions.store_reader(store_repo, old.commit)
    base = repo.git.rev_parse(new.commit)
    found: dict[str, decisions.Findings] = {}
    for patch in patches:
        result = report.result_for(patch.name)
        item = decisions.Findings()
        if result is None:
            found[patch.name] = item
            continue
        if result.status is apply.Status.CONFLICT:
            item.conflict = review.conflict_report(repo, base, patch, result)
        elif result.status is apply.Status.TARGET_MISSING:
            item.moved = review.moved_targets(repo, new.commit, patch, read_new, read_old)
        elif review.is_accepted_merge(result):
            old_result = old_report.result_for(patch.name)
            old_read = (
                decisions.store_reader(old_repo, old_result.commit)
                if old_repo is not None and old_result is not None and old_result.commit
                else None
            )
            assert result.commit is not None
            item.unresolved = review.unresolved_names(repo, result.commit, old_read, patch.touched_files)
        if result.accepted and result.commit:
            base = result.commit
        found[patch.name] = item
    return found


RANGE_DIFF_ROW_RE = re.compile(r"^\s*(\d+|-):\s+([0-9a-f]+|-+)\s+([<>=!])\s+(\d+|-):\s+([0-9a-f]+|-+)\s")


def _changes(repo: git.Repo, commit: str) -> list[str]:
    """A commit's changed lines per file, without positions or context: what it changes, not where."""
    diff = repo.git.show("--format=", "--no-color", "--unified=0", commit, strip_newline_in_stdout=False)
    return [
        line
        for line in diff.splitlines()
        if line.startswith(("+", "-", "diff --git")) and not line.startswith(("+++", "---"))
    ]


def range_diff(old_repo: Path, new_repo: Path) -> str:
    """``git range-diff`` of the series as applied on the old and on the new upstream.

    Annotated: a commit that did not apply on the new base (``<``) is followed by its patch as
    it was on the old base, and a changed pair (``!``) whose changed lines are the same on both
    bases is marked "context only" (only surrounding lines or positions differ).
    """
    new = git.Repo(new_repo)
    new.git.fetch("--quiet", "--no-tags", str(old_repo), "+HEAD:refs/vllm-overlay/old-series")
    old_base = patched_repo.upstream_base(old_repo)
    new_base = patched_repo.upstream_base(new)
    if new.git.rev_parse("HEAD") == new.git.rev_parse(new_base):
        # git range-diff refuses an empty range: no patch became a commit on the new upstream.
        return "no patch of the series became a commit on the new upstream (each is there already or did not apply)\n"
    plain = new.git.range_diff(
        "--no-color", f"{old_base}..refs/vllm-overlay/old-series", f"{new_base}..HEAD", strip_newline_in_stdout=False
    )
    lines: list[str] = []
    for line in plain.splitlines():
        row = RANGE_DIFF_ROW_RE.match(line)
        if row is None:
            lines.append(line)
            continue
        _, old_sha, mark, _, new_sha = row.groups()
        if mark == "!" and _changes(new, old_sha) == _changes(new, new_sha):
            lines.append(f"{line}    [context only]")
            continue
        lines.append(line)
        if mark == "<":
            lines.append("    did not apply on the new base; as on the old base:")
            patch = new.git.show("--format=", "--no-color", "--stat", "-p", old_sha, strip_newline_in_stdout=False)
            lines += [f"    {text}".rstrip() for text in patch.splitlines()]
    return "\n".join(lines) + "\n"


@dataclass
class AuditResult:
    old: upstream_trees.Upstream
    new: upstream_trees.Upstream
    report: apply.Report
    rows: list[decisions.AuditRow]
    range_diff: str
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase
    lines: dict[str, str] = field(default_factory=dict)  # carried line -> the upstream it was checked on


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 2)
        self._last = now


def run_audit(
    patches: list[Patch],
    lock: Lock,
    store: Store,
    spec: str,
    max_age_releases: int,
    release_dates: dict[str, dt.date] | None,
    progress: Progress | None = None,
    old_spec: str | None = None,
    other_lines: list[tuple[lines.CarriedLine, str | None]] | None = None,
) -> AuditResult:
    """Apply the series to the old upstream (default: the lock) and to the new one (3-way allowed).

    ``other_lines``: the other upstream lines the project carries (the CPU carry), each with the
    upstream to check it on (None: its own lock's). The locked line is checked on the new upstream.
    """
    clock = _Clock()
    old = upstream_trees.obtain(old_spec, lock, store)
    new = upstream_trees.obtain(spec, lock, store)
    clock.lap("obtain upstreams")
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-audit-") as tmp:
        old_dir, new_dir = Path(tmp) / "old", Path(tmp) / "new"
        old_report, report = _apply_on_both(patches, store, old, new, old_dir, new_dir, progress, clock)
        drift = drift_by_patch(store, old, new, patches)
        clock.lap("target drift")
        deps = dependency_drift(store, old, new, patches, lock)
        clock.lap("dependency drift")
        found = findings(store, old, new, patches, report, old_report, old_dir, new_dir)
        clock.lap("conflicts, broken merges, moved targets")
        rows = _audit_rows(patches, report, drift, deps, found, new, release_dates, max_age_releases)
        checked = _hold_for_lines(rows, patches, report, new, store, other_lines or [])
        clock.lap("carried lines")
        diff = range_diff(old_dir, new_dir)
        clock.lap("range-diff")
    clock.lap("remove the scratch trees")
    clock.seconds["total"] = round(sum(clock.seconds.values()), 2)
    return AuditResult(old, new, report, rows, diff, clock.seconds, checked)


def _hold_for_lines(
    rows: list[decisions.AuditRow],
    patches: list[Patch],
    report: apply.Report,
    new: upstream_trees.Upstream,
    store: Store,
    other_lines: list[tuple[lines.CarriedLine, str | None]],
) -> dict[str, str]:
    """Check every carried line for each patch's fix and apply the drop rule to the rows."""
    names = [patch.name for patch in patches]
    per_line = [lines.checks_from_report(lines.LOCKED, new, report, names)]
    checked = {lines.LOCKED: lines.label(new)}
    for line, spec in other_lines:
        upstream, checks = lines.check_line(line, spec, store, names)
        per_line.append(checks)
        checked[line.name] = lines.label(upstream)
    for row in rows:
        decisions.hold_for_lines(row, [checks[row.patch] for checks in per_line])
    return checked


def _apply_on_both(
    patches: list[Patch],
    store: Store,
    old: upstream_trees.Upstream,
    new: upstream_trees.Upstream,
    old_dir: Path,
    new_dir: Path,
    progress: Progress | None,
    clock: _Clock,
) -> tuple[apply.Report, apply.Report]:
    """The series applied on the old upstream as it is, then on the new one with offset, fuzz and 3-way."""
    old_report = apply_run.apply_series(
        patches,
        old,
        store,
        old_dir,
        apply.Options(),
        publish_partial=True,
    )
    clock.lap("apply on the old upstream")
    report = apply_run.apply_series(
        patches,
        new,
        store,
        new_dir,
        apply.Options(allow_offset=True, allow_fuzz=True, three_way=True),
        progress=progress,
        publish_partial=True,
        seed_base=lambda: old.commit,
    )
    clock.lap("apply on the new upstream")
    return old_report, report


def _audit_rows(
    patches: list[Patch],
    report: apply.Report,
    drift: dict,
    deps: dict[str, list[dependencies.DependencyDrift]],
    found: dict,
    new: upstream_trees.Upstream,
    release_dates: dict[str, dt.date] | None,
    max_age_releases: int,
) -> list[decisions.AuditRow]:
    """One audit row per patch, in series order."""
    rows = []
    for patch in patches:
        result = report.result_for(patch.name)
        assert result is not None  # apply_series reports every patch it was given
        rows.append(
            decisions.audit_row(
                patch,
                result,
                drift[patch.name],
                release_dates or {},
                new.version,
                max_age_releases,
                deps[patch.name],
                found[patch.name],
            )
        )
    return rows
