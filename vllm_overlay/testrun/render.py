"""The run's report for people and for CI: the table, and the JUnit cases (JSON: ``RunReport.to_json``)."""

from __future__ import annotations

from vllm_overlay import junit
from vllm_overlay.testrun.execute import log_tail
from vllm_overlay.testrun.outcome import PatchOutcome, RunReport, Unit
from vllm_overlay.testrun.verdicts import Verdict, short_counts


def _upstream_cells(p: PatchOutcome) -> tuple[str, str]:
    if not p.upstream_tests:
        return "n/a", "n/a"
    before = short_counts(p.comparison.before) if p.comparison else "-"
    if p.upstream is None:
        return before, "not run"
    if p.comparison is None:
        return before, p.upstream.status
    regressed = len(p.comparison.regressions)
    after = short_counts(p.comparison.after) + (f" ({regressed} WORSE)" if regressed else "")
    if p.upstream.status not in ("ok", "REGRESSED"):
        after += f" [{p.upstream.status}]"
    return before, after


def _whole(label: str, verdict: Verdict | None, unit: Unit | None) -> str:
    if verdict is None:
        return f"{label}: not run"
    cached = " (cached)" if unit is not None and not unit.executed else ""
    return f"{label}: {verdict.status} - {verdict.detail}{cached}"


def _cell(text: str, width: int, right: bool) -> str:
    return text.rjust(width) if right else text.ljust(width)


def table(report: RunReport) -> str:
    rows = [("patch", "red", "green", "upstream before", "upstream after", "cached", "s")]
    for p in report.patches:
        before, after = _upstream_cells(p)
        rows.append(
            (
                p.name,
                (p.red.status if p.red else "not run"),
                (p.green.status if p.green else "not run"),
                before,
                after,
                "yes" if p.cached else "no",
                f"{p.seconds:.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    lines = [
        "  ".join(_cell(cell, w, i == last) for i, (cell, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(_whole("full series, all Tests together", report.final, report.final_unit))
    for name, unit in report.oracle_units.items():
        lines.append(_whole(f"oracle of {name}", report.oracles.get(name), unit))
    lines.append(_whole("tool tests", report.tool, report.tool_unit))
    passed = sum(p.ok for p in report.patches)
    cached = sum(p.cached for p in report.patches)
    lines.append(
        f"{passed}/{len(report.patches)} patches ok ({cached} from the verdict store); "
        f"{report.processes} pytest process(es); wall time {report.seconds + report.setup_seconds:.0f}s "
        f"(setup {report.setup_seconds:.0f}s, tests {report.seconds:.0f}s)"
    )
    failure = report.first_failure()
    lines.append("RESULT: ok" if report.ok else f"RESULT: FAILED: {failure or 'stopped before the end'}")
    return "\n".join(lines)


def _case(suite: str, name: str, verdict: Verdict | None, units: list[Unit], body_extra: str = "") -> junit.ReportCase:
    jobs = []
    for unit in units:
        if unit.executed and unit.job is not None and all(unit.job is not j for j in jobs):
            jobs.append(unit.job)
    seconds = sum(j.seconds for j in jobs)
    if verdict is None:
        return junit.ReportCase(suite, name, seconds, skipped="not run")
    body = verdict.detail
    if verdict.files:
        body += "\n" + "\n".join(f"{f}: {s}" for f, s in sorted(verdict.files.items()))
    body += body_extra
    body += "".join(f"\nlog: {j.log}" for j in jobs) or ("\n(from the verdict store)" if units else "")
    if verdict.ok:
        return junit.ReportCase(suite, name, seconds, output=body)
    tail = "".join(log_tail(j.log) for j in jobs)
    if verdict.status in ("error", "COLLECTION-ERROR", "ERROR"):
        return junit.ReportCase(suite, name, seconds, error=body + "\n" + tail)
    return junit.ReportCase(suite, name, seconds, failure=body + "\n" + tail)


def junit_cases(report: RunReport, apply_failures: list[tuple[str, str]] | None = None) -> list[junit.ReportCase]:
    cases: list[junit.ReportCase] = []
    for name, detail in apply_failures or []:
        cases.append(junit.ReportCase(suite="apply", name=name, seconds=0.0, failure=detail))
    for p in report.patches:
        suite = f"patches.{p.series or 'unnamed'}"
        cases.append(_case(suite, f"{p.name} [red]", p.red, p.red_units))
        cases.append(_case(suite, f"{p.name} [green]", p.green, p.green_units))
        regressions = ""
        if p.comparison and p.comparison.regressions:
            shown = (f"{r['id']}: {r['before']} -> {r['after']}" for r in p.comparison.regressions)
            regressions = "\n" + "\n".join(shown)
        upstream_units = [*p.baseline_units, *([p.upstream_unit] if p.upstream_unit else [])]
        cases.append(_case(suite, f"{p.name} [upstream-tests]", p.upstream, upstream_units, regressions))
    for name, unit in report.oracle_units.items():
        cases.append(_case(f"patches.{name}", f"oracle of {name}", report.oracles.get(name), [unit]))
    for label, verdict, unit in (
        ("all Tests together on the full series", report.final, report.final_unit),
        ("tool tests", report.tool, report.tool_unit),
    ):
        cases.append(_case("full-series", label, verdict, [unit] if unit else []))
    return cases
