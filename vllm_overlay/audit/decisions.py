"""The keep / refresh / drop / resolve audit of a series against a new upstream.

One row per patch: what applying it to the new upstream did, whether the symbols it changes
drifted (AST comparison against the locked upstream), what its DEP-3 headers say about its
upstream fate, and how old it is in upstream releases.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from vllm_overlay.apply.engine import PatchResult, Status
from vllm_overlay.audit import dependencies, lines, review, targets
from vllm_overlay.series import Patch


class Decision(enum.StrEnum):
    KEEP = "keep"
    REFRESH = "refresh"
    DROP = "drop"
    RESOLVE = "resolve"


DRIFTING = {targets.Drift.CHANGED, targets.Drift.REMOVED, targets.Drift.APPEARED, targets.Drift.UNPARSABLE}


@dataclass
class AuditRow:
    patch: str
    series: str
    status: str
    decision: Decision
    reason: str
    forwarded: str
    applied_upstream: str
    last_update: str
    releases_since_update: int | None
    drift: list[str] = field(default_factory=list)
    dependency_drift: list[str] = field(default_factory=list)
    # conflict rows: files still conflicting in a 3-way merge (-> conflict start lines), files
    # that merge, and every failing hunk (file, hunk, line, how it failed)
    resolve_files: dict[str, list[int]] = field(default_factory=dict)
    merge_files: list[str] = field(default_factory=list)
    hunks: list[dict[str, object]] = field(default_factory=list)
    unresolved_names: list[str] = field(default_factory=list)  # merged, but uses what the tree lacks
    moved_targets: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # each carried line: has the fix, lacks it, does not carry it
    brief: str = field(default="", repr=False)  # the reason as the markdown table shows it

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["decision"] = str(self.decision)
        data.pop("brief")
        return data


store_reader = targets.commit_reader  # files of an upstream commit, from the store repository


def releases_since(last_update: str, release_dates: Mapping[str, dt.date], up_to: str | None) -> int | None:
    """Upstream releases published after ``last_update`` (YYYY-MM-DD) up to release ``up_to``."""
    try:
        since = dt.date.fromisoformat(last_update.strip())
    except ValueError:
        return None
    limit = release_dates.get(up_to) if up_to else None
    return sum(1 for day in release_dates.values() if day > since and (limit is None or day <= limit))


def dependency_verdict(deps: list[dependencies.DependencyDrift]) -> tuple[Decision, str] | None:
    """The decision the dependency symbols force on an otherwise applying patch (None: nothing)."""
    gone = [d for d in deps if d.drift is targets.Drift.REMOVED]
    if gone:
        return Decision.RESOLVE, "dependency symbol gone: " + "; ".join(str(d) for d in gone)
    # Unchecked counts as changed: a keep that was never verified is the false keep to avoid.
    changed = [d for d in deps if d.drift in (targets.Drift.CHANGED, targets.Drift.UNPARSABLE)]
    if changed:
        return Decision.REFRESH, "dependency API changed: " + "; ".join(str(d) for d in changed)
    return None


@dataclass
class Findings:
    """What the audit found beyond the apply status (see vllm_overlay.audit.review)."""

    conflict: review.ConflictReport | None = None
    unresolved: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)


MARKDOWN_HUNKS = 3


def hold_for_lines(row: AuditRow, checks: list[lines.LineCheck]) -> None:
    """Apply the drop rule across carried lines: a patch leaves patches/ only when every line that carries it has it.

    A ``drop`` row whose fix some carried line still lacks becomes ``keep`` (that line still needs
    the patch); the per-line answers are recorded on every row and named in the reason of any row
    where some line has the fix.
    """
    row.lines = [str(check) for check in checks]
    if not any(check.has_it for check in checks):
        return
    summary = lines.verdict(checks)
    if row.decision is Decision.DROP and not lines.every_line_has_it(checks):
        row.decision = Decision.KEEP
        row.reason = f"{summary}: kept until every carried line has the fix"
        row.brief = row.reason
        return
    row.reason = f"{row.reason}; {summary}"
    row.brief = f"{row.brief}; {summary}" if row.brief else row.reason


def decide(
    result: PatchResult,
    drift: list[targets.TargetDrift],
    deps: list[dependencies.DependencyDrift] | None = None,
    findings: Findings | None = None,
    limit: int | None = None,
) -> tuple[Decision, str]:
    """The row's decision and reason (``limit``: name at most that many failing hunks, "and N more")."""
    decision, reason = _decide_upstream(result, drift, findings or Findings(), limit)
    verdict = dependency_verdict(deps or [])
    if verdict is None or decision in (Decision.DROP,):
        return decision, reason
    if decision is Decision.KEEP:
        return verdict
    worst = Decision.RESOLVE if Decision.RESOLVE in (decision, verdict[0]) else decision
    return worst, f"{reason}; {verdict[1]}"


def _decide_upstream(
    result: PatchResult, drift: list[targets.TargetDrift], findings: Findings, limit: int | None = None
) -> tuple[Decision, str]:
    drifted = [d for d in drift if d.drift in DRIFTING]
    if result.status is Status.ALREADY_UPSTREAM:
        return Decision.DROP, "upstream already carries the change (the patch reverse-applies)"
    if result.status is Status.CONFLICT and findings.conflict is not None:
        return Decision.RESOLVE, f"{result.status}: {review.summary(findings.conflict, limit)}"
    if result.status in (Status.CONFLICT, Status.TARGET_MISSING):
        notes = result.hunks if limit is None else result.hunks[:limit]
        where = "; ".join(str(h) for h in notes) or result.detail
        if len(notes) < len(result.hunks):
            where += f"; and {len(result.hunks) - len(notes)} more"
        if findings.moved:
            where += "; " + "; ".join(findings.moved)
        return Decision.RESOLVE, f"{result.status}: {where}"
    if findings.unresolved:
        return Decision.RESOLVE, (
            f"applies as {result.status}, but the merged code uses names the new tree does not define "
            "(an earlier patch that did not apply may define them): " + "; ".join(findings.unresolved)
        )
    if result.status in (Status.OFFSET, Status.FUZZ, Status.MERGED_3WAY):
        extra = f"; target changed: {', '.join(d.target for d in drifted)}" if drifted else ""
        return Decision.REFRESH, f"applies as {result.status}: re-export against the new upstream{extra}"
    if drifted:
        return Decision.REFRESH, "applied cleanly, target changed: " + "; ".join(str(d) for d in drifted)
    return Decision.KEEP, "applies cleanly; its targets are unchanged"


def audit_row(
    patch: Patch,
    result: PatchResult,
    drift: list[targets.TargetDrift],
    release_dates: Mapping[str, dt.date],
    new_version: str | None,
    max_age_releases: int,
    deps: list[dependencies.DependencyDrift] | None = None,
    findings: Findings | None = None,
) -> AuditRow:
    findings = findings or Findings()
    decision, reason = decide(result, drift, deps, findings)
    brief = decide(result, drift, deps, findings, limit=MARKDOWN_HUNKS)[1]
    last_update = patch.value("Last-Update") or ""
    age = releases_since(last_update, release_dates, new_version) if release_dates else None
    warnings: list[str] = []
    applied = patch.value("Applied-Upstream") or ""
    if applied and result.status is not Status.ALREADY_UPSTREAM:
        warnings.append(f"Applied-Upstream says {applied!r}, but this upstream does not carry the change")
    if age is not None and age > max_age_releases:
        warnings.append(f"Last-Update {last_update} is {age} upstream releases old (limit {max_age_releases})")
    warnings.extend(f"target changed: {d}" for d in drift if d.drift in DRIFTING and result.accepted)
    warnings.extend(
        f"Dependency-Targets {d.target} is not in the locked pin: {d}"
        for d in deps or []
        if d.drift in (targets.Drift.ABSENT, targets.Drift.APPEARED)
    )
    return AuditRow(
        patch=patch.name,
        series=patch.series,
        status=str(result.status),
        decision=decision,
        reason=reason,
        forwarded=patch.value("Forwarded") or patch.value("Bug") or "",
        applied_upstream=applied,
        last_update=last_update,
        releases_since_update=age,
        drift=[str(d) for d in drift],
        dependency_drift=[str(d) for d in deps or []],
        resolve_files=dict(findings.conflict.resolve) if findings.conflict else {},
        merge_files=list(findings.conflict.merge) if findings.conflict else [],
        hunks=[
            {"file": h.file, "hunk": h.hunk, "line": h.line, "how": h.how}
            for h in (findings.conflict.hunks if findings.conflict else [])
        ]
        or [{"file": n.file, "hunk": n.hunk, "line": n.recorded_line, "how": n.note} for n in result.hunks],
        unresolved_names=list(findings.unresolved),
        moved_targets=list(findings.moved),
        warnings=warnings,
        brief=brief,
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[AuditRow], old: str, new: str, carried: Mapping[str, str] | None = None) -> str:
    """The audit table; ``carried``: each carried line and the upstream it was checked on."""
    lines = [
        f"# Series audit: {old} -> {new}",
        "",
    ]
    if carried and len(carried) > 1:
        lines += [
            "Carried lines checked (a patch is dropped only when every line that carries it has the fix): "
            + ", ".join(f"{name} {where}" for name, where in carried.items()),
            "",
        ]
    lines += [
        "| patch | status | decision | reason | Forwarded | Applied-Upstream | Last-Update (releases since) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        age = "" if row.releases_since_update is None else f" ({row.releases_since_update})"
        lines.append(
            "| "
            + " | ".join(
                _cell(c)
                for c in (
                    row.patch,
                    row.status,
                    f"**{row.decision}**",
                    row.brief or row.reason,
                    row.forwarded,
                    row.applied_upstream or "-",
                    row.last_update + age,
                )
            )
            + " |"
        )
    warnings = [(row.patch, w) for row in rows for w in row.warnings]
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {name}: {_cell(w)}" for name, w in warnings]
    if any(row.decision is Decision.RESOLVE for row in rows):
        lines += [
            "",
            "Patches after a `resolve` row were tried on the tree without it: once it is resolved,",
            "a later patch that builds on it may report differently.",
        ]
    counts = {d: sum(r.decision is d for r in rows) for d in Decision}
    lines += ["", "Totals: " + ", ".join(f"{d} {n}" for d, n in counts.items())]
    return "\n".join(lines) + "\n"
