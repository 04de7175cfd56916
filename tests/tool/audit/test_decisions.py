"""audit.decisions: one keep / refresh / drop / resolve row per patch, and the markdown audit table."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tests.tool.helpers.repos import FORWARDED, PatchMaker, change_line_20
from vllm_overlay import series
from vllm_overlay.apply.classify import HunkNote
from vllm_overlay.apply.engine import PatchResult, Status
from vllm_overlay.audit import decisions, review
from vllm_overlay.audit.decisions import Decision, Findings
from vllm_overlay.audit.dependencies import DependencyDrift, DependencyTarget
from vllm_overlay.audit.targets import Drift, TargetDrift

DATES = {
    "0.31.0": dt.date(2026, 9, 1),
    "0.32.0": dt.date(2026, 10, 1),
    "0.33.0": dt.date(2026, 11, 1),
    "0.34.0": dt.date(2026, 12, 1),
    "0.35.0": dt.date(2027, 1, 1),
}


def result(status: Status, *notes: HunkNote, accepted: bool = True, detail: str = "") -> PatchResult:
    return PatchResult("s/a.patch", "s", "A", status, accepted, list(notes), detail)


def dep(drift: Drift) -> DependencyDrift:
    return DependencyDrift(DependencyTarget("demo-lib", "demo.api", "call"), "1.0", "2.0", drift)


def notes(n: int) -> list[HunkNote]:
    return [HunkNote("vllm/core.py", i, 10 * i, "does not apply") for i in range(1, n + 1)]


def test_releases_since_counts_up_to_the_new_release_or_all() -> None:
    assert decisions.releases_since("2026-10-15", DATES, "0.34.0") == 2
    assert decisions.releases_since("2026-10-15", DATES, None) == 3  # no bound: every later release
    assert decisions.releases_since("2026-10-15", DATES, "9.9.9") == 3  # an unknown bound: no bound
    assert decisions.releases_since(" 2026-11-01 ", DATES, "0.35.0") == 2  # the release day itself is not after
    assert decisions.releases_since("2027-02-01", DATES, "0.35.0") == 0
    assert decisions.releases_since("", DATES, "0.35.0") is None


def test_already_upstream_is_dropped_whatever_else_is_found() -> None:
    decision, reason = decisions.decide(
        result(Status.ALREADY_UPSTREAM),
        [TargetDrift("m:f", Drift.CHANGED)],
        [dep(Drift.REMOVED)],
        Findings(unresolved=["x"]),
    )
    assert decision is Decision.DROP and reason == "upstream already carries the change (the patch reverse-applies)"


def test_conflict_names_its_hunks_and_the_limit_says_how_many_more() -> None:
    conflict = result(Status.CONFLICT, *notes(5), accepted=False)
    decision, full = decisions.decide(conflict, [])
    assert decision is Decision.RESOLVE and full.count("does not apply") == 5
    _, brief = decisions.decide(conflict, [], limit=2)
    assert brief == (
        "conflict: vllm/core.py hunk #1 (line 10): does not apply; "
        "vllm/core.py hunk #2 (line 20): does not apply; and 3 more"
    )
    _, moved = decisions.decide(conflict, [], findings=Findings(moved=["vllm.core:f moved to vllm/new.py"]), limit=0)
    assert moved == "conflict: ; and 5 more; vllm.core:f moved to vllm/new.py"


def test_target_missing_without_hunks_gives_the_detail() -> None:
    decision, reason = decisions.decide(
        result(Status.TARGET_MISSING, accepted=False, detail="a modified file is missing"), []
    )
    assert (decision, reason) == (Decision.RESOLVE, "target-missing: a modified file is missing")


def test_a_conflict_with_a_review_uses_the_review_summary() -> None:
    report = review.ConflictReport(resolve={"vllm/core.py": [18]}, merge=["vllm/other.py"])
    decision, reason = decisions.decide(result(Status.CONFLICT, accepted=False), [], findings=Findings(conflict=report))
    assert decision is Decision.RESOLVE
    assert reason == "conflict: resolve vllm/core.py (conflict at line 18); merge in 3-way: vllm/other.py"


def test_a_merge_that_uses_undefined_names_must_be_resolved() -> None:
    decision, reason = decisions.decide(
        result(Status.MERGED_3WAY), [], findings=Findings(unresolved=["helper (line 3)"])
    )
    assert decision is Decision.RESOLVE
    assert reason.startswith("applies as merged-3way, but the merged code uses names") and reason.endswith(
        "helper (line 3)"
    )


@pytest.mark.parametrize("status", [Status.OFFSET, Status.FUZZ, Status.MERGED_3WAY])
def test_a_patch_that_applies_only_loosely_is_refreshed(status: Status) -> None:
    decision, reason = decisions.decide(
        result(status), [TargetDrift("m:ok", Drift.UNCHANGED), TargetDrift("m:f", Drift.REMOVED)]
    )
    assert decision is Decision.REFRESH
    assert reason == f"applies as {status}: re-export against the new upstream; target changed: m:f"


def test_clean_is_kept_unless_a_target_drifted() -> None:
    assert decisions.decide(result(Status.CLEAN), [TargetDrift("m:f", Drift.ABSENT)]) == (
        Decision.KEEP,
        "applies cleanly; its targets are unchanged",
    )  # absent: a symbol the patch adds is no drift
    decision, reason = decisions.decide(
        result(Status.CLEAN), [TargetDrift("m:f", Drift.APPEARED, "now defined upstream in m.py")]
    )
    assert (decision, reason) == (
        Decision.REFRESH,
        "applied cleanly, target changed: m:f: appeared (now defined upstream in m.py)",
    )


def test_dependency_drift_decides_a_kept_patch_and_worsens_a_refresh() -> None:
    clean = result(Status.CLEAN)
    assert decisions.decide(clean, [], [dep(Drift.UNCHANGED), dep(Drift.ABSENT)])[0] is Decision.KEEP
    decision, reason = decisions.decide(clean, [], [dep(Drift.UNPARSABLE)])
    assert decision is Decision.REFRESH and reason.startswith("dependency API changed: demo-lib 1.0 -> 2.0:")
    decision, reason = decisions.decide(result(Status.OFFSET), [], [dep(Drift.REMOVED)])
    assert decision is Decision.RESOLVE
    assert (
        reason.startswith("applies as offset: re-export") and "; dependency symbol gone: demo-lib 1.0 -> 2.0" in reason
    )
    decision, _ = decisions.decide(result(Status.OFFSET), [], [dep(Drift.CHANGED)])
    assert decision is Decision.REFRESH


def _patch(project: Path, path: Path, extra_header: str = "") -> series.Patch:
    raw = path.read_bytes()
    if extra_header:
        raw = raw.replace(b"\nLast-Update:", f"\n{extra_header}\nLast-Update:".encode(), 1)
    return series.parse_patch_bytes(raw, path, path.relative_to(project / "patches").as_posix())


def test_audit_row_reads_the_headers_and_warns(project: Path, upstream_dir: Path, make_patch: PatchMaker) -> None:
    patch = _patch(project, make_patch(upstream_dir, change_line_20, "Change line 20"), "Applied-Upstream: v0.34.0")
    drift = [TargetDrift("vllm.core:value", Drift.CHANGED, "vllm/core.py")]
    dates = dict(DATES, **{"0.36.0": dt.date(2027, 2, 1), "0.37.0": dt.date(2027, 3, 1)})
    row = decisions.audit_row(patch, result(Status.CLEAN), drift, dates, "0.37.0", max_age_releases=2)
    assert (row.patch, row.series, row.status, row.decision) == (
        "demo/change-line-20.patch",
        "demo",
        "clean",
        Decision.REFRESH,
    )
    assert row.forwarded == FORWARDED.removeprefix("Forwarded: ") and row.applied_upstream == "v0.34.0"
    assert (row.last_update, row.releases_since_update) == ("2026-11-29", 4)
    assert row.warnings == [
        "Applied-Upstream says 'v0.34.0', but this upstream does not carry the change",
        "Last-Update 2026-11-29 is 4 upstream releases old (limit 2)",
        "target changed: vllm.core:value: changed (vllm/core.py)",
    ]
    assert row.drift == ["vllm.core:value: changed (vllm/core.py)"]
    data = row.to_json()
    assert data["decision"] == "refresh" and "brief" not in data


def test_audit_row_of_a_conflict_lists_its_hunks(project: Path, upstream_dir: Path, make_patch: PatchMaker) -> None:
    patch = _patch(project, make_patch(upstream_dir, change_line_20, "Change line 20"))
    conflict = result(Status.CONFLICT, *notes(4), accepted=False)
    row = decisions.audit_row(patch, conflict, [], {}, None, max_age_releases=2)
    assert row.releases_since_update is None and row.warnings == []
    assert (
        row.hunks[0] == {"file": "vllm/core.py", "hunk": 1, "line": 10, "how": "does not apply"} and len(row.hunks) == 4
    )
    assert row.brief.endswith("; and 1 more") and not row.reason.endswith("more")


def _row(name: str, decision: Decision, reason: str, **extra: object) -> decisions.AuditRow:
    base = dict(
        patch=name,
        series="s",
        status="clean",
        decision=decision,
        reason=reason,
        forwarded="no",
        applied_upstream="",
        last_update="2026-11-29",
        releases_since_update=None,
    )
    return decisions.AuditRow(**{**base, **extra})  # type: ignore[arg-type]


def test_markdown_table_escapes_cells_and_counts_decisions() -> None:
    rows = [
        _row("s/a.patch", Decision.KEEP, "fine", releases_since_update=1),
        _row("s/b.patch", Decision.RESOLVE, "long | reason\nline two", brief="short | one", warnings=["old\nheader"]),
    ]
    text = decisions.markdown(rows, "0.33.0", "0.34.0")
    lines = text.splitlines()
    assert lines[0] == "# Series audit: 0.33.0 -> 0.34.0"
    assert lines[4] == "| s/a.patch | clean | **keep** | fine | no | - | 2026-11-29 (1) |"
    assert lines[5] == "| s/b.patch | clean | **resolve** | short \\| one | no | - | 2026-11-29 |"
    assert "- s/b.patch: old header" in lines
    assert any(line.startswith("Patches after a `resolve` row") for line in lines)
    assert lines[-1] == "Totals: keep 1, refresh 0, drop 0, resolve 1"
    assert text.endswith("\n")


def test_markdown_without_warnings_or_resolve_rows_has_no_such_sections() -> None:
    text = decisions.markdown([_row("s/a.patch", Decision.DROP, "upstream has it")], "a", "b")
    assert "Warnings:" not in text and "resolve` row" not in text
    assert text.splitlines()[-1] == "Totals: keep 0, refresh 0, drop 1, resolve 0"
