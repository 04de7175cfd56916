"""Verdicts: pure functions from pytest's per-test outcomes to red, green and upstream decisions.

Nothing here starts a process or touches a file: the tool tests drive every rule with hand-made
cases. A *result* (see :class:`Result`) is what one pytest run produced for some test specs on one
tree; the verdict store keeps results, so a cached verdict is the same function of the same input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_overlay import junit
from vllm_overlay.junit import ERROR, FAILED, PASSED, SKIPPED, TIMEOUT, Case

BAD = (FAILED, ERROR, TIMEOUT)
GOOD = (PASSED, SKIPPED)
NO_TESTS_VALUES = {"", "none", "-", "n/a"}


def spec_file(spec: str) -> str:
    return spec.split("::", 1)[0]


def parse_specs(values: list[str]) -> list[str]:
    return [v for v in values if v.strip().lower() not in NO_TESTS_VALUES]


def cases_for(spec: str, cases: dict[str, Case]) -> list[Case]:
    """The cases a Tests / Upstream-Tests entry (a file, or file::id) produced."""
    file = spec_file(spec)
    if "::" in spec:
        return [
            c
            for c in cases.values()
            if c.id == spec
            or c.id.startswith(spec + "::")
            or c.id.startswith(spec + "[")
            or c.id == f"{file}::{junit.COLLECTION}"
        ]
    return [c for c in cases.values() if c.file == file or c.id.startswith(file + "::")]


def counts(cases: list[Case] | dict[str, Case]) -> dict[str, int]:
    values = cases.values() if isinstance(cases, dict) else cases
    result = {PASSED: 0, FAILED: 0, ERROR: 0, SKIPPED: 0, TIMEOUT: 0}
    for case in values:
        result[case.outcome] += 1
    return result


def short_counts(c: dict[str, int]) -> str:
    text = f"{c[PASSED]}p {c[FAILED]}f {c[SKIPPED]}s"
    if c[ERROR]:
        text += f" {c[ERROR]}e"
    if c[TIMEOUT]:
        text += f" {c[TIMEOUT]}t"
    return text


@dataclass
class Result:
    """What one pytest run produced for a set of specs on one tree (stored by the verdict store)."""

    exit_code: int | None
    timed_out: bool
    cases: dict[str, Case]
    seconds: float = 0.0
    cached: bool = False

    @property
    def clean_exit(self) -> bool:
        """pytest ran to its end (exit 0 or 1) within its time limit."""
        return not self.timed_out and self.exit_code in (0, 1)

    def to_json(self) -> dict[str, object]:
        return {
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "seconds": round(self.seconds, 2),
            "cases": [[c.id, c.file, c.outcome] for c in self.cases.values()],
        }

    @classmethod
    def from_json(cls, data: dict) -> Result:
        cases = {i: Case(i, f, o) for i, f, o in data["cases"]}
        return cls(data["exit_code"], data["timed_out"], cases, float(data.get("seconds", 0.0)), cached=True)


def part_of(result: Result, specs: list[str], shared: bool) -> Result:
    """The result of ``specs`` alone, out of a run that may have held other specs too (``shared``).

    A shared run's exit code speaks for all of its files; when pytest ran to its end, each part
    gets the exit code pytest would have given it alone (1 with a bad case, 5 with none, else 0),
    so per-file verdicts stay exact. Any other ending (a crash, a time limit) applies to every part.
    """
    cases: dict[str, Case] = {}
    for spec in specs:
        cases.update({c.id: c for c in cases_for(spec, result.cases)})
    exit_code = result.exit_code
    if shared and result.clean_exit:
        exit_code = 5 if not cases else (1 if any(c.outcome in BAD for c in cases.values()) else 0)
    return Result(exit_code, result.timed_out, cases, result.seconds, result.cached)


def combine(results: list[Result]) -> Result:
    """Several parts (one per spec) read as one run: the worst ending wins."""
    cases: dict[str, Case] = {}
    for result in results:
        cases.update(result.cases)
    timed_out = any(r.timed_out for r in results)
    unclean = [r.exit_code for r in results if r.exit_code not in (0, 1)]
    if unclean:
        exit_code = unclean[0]
    else:
        exit_code = 1 if any(r.exit_code == 1 for r in results) else 0
    return Result(exit_code, timed_out, cases, sum(r.seconds for r in results), all(r.cached for r in results))


def red_file_status(cases: list[Case]) -> str:
    """detected | not-detected | collection-error | error | no-tests."""
    if not cases:
        return "no-tests"
    if any(c.id.endswith("::" + junit.COLLECTION) for c in cases):
        return "collection-error"
    if any(c.outcome in (FAILED, TIMEOUT) for c in cases):
        return "detected"
    if any(c.outcome == ERROR for c in cases):
        return "error"
    return "not-detected"


def green_file_status(cases: list[Case]) -> str:
    """passed | failed | collection-error | error | all-skipped | no-tests."""
    if not cases:
        return "no-tests"
    if any(c.id.endswith("::" + junit.COLLECTION) for c in cases):
        return "collection-error"
    if any(c.outcome in (FAILED, TIMEOUT) for c in cases):
        return "failed"
    if any(c.outcome == ERROR for c in cases):
        return "error"
    if not any(c.outcome == PASSED for c in cases):
        return "all-skipped"
    return "passed"


@dataclass
class Verdict:
    ok: bool
    status: str  # one word for the table
    detail: str = ""  # one line for humans
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "status": self.status, "detail": self.detail, "files": self.files}


def exit_problem(exit_code: int | None, timed_out: bool) -> str | None:
    if timed_out:
        return "the pytest process ran past its time limit and was killed"
    if exit_code is None:
        return "did not run"
    if exit_code < 0:
        return f"pytest died from signal {-exit_code}"
    if exit_code not in (0, 1):
        meaning = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}
        return f"pytest exit code {exit_code} ({meaning.get(exit_code, 'unknown')})"
    return None


def red_verdict(specs: list[str], cases: dict[str, Case], exit_code: int | None, timed_out: bool = False) -> Verdict:
    if not specs:
        return Verdict(False, "no-tests", "the patch names no Tests")
    files = {spec: red_file_status(cases_for(spec, cases)) for spec in specs}
    problem = exit_problem(exit_code, timed_out)
    c = counts(cases)
    if problem:
        return Verdict(False, "error", problem, files)
    bad = {s: v for s, v in files.items() if v != "detected"}
    if not bad and exit_code == 1:
        return Verdict(True, "ok", f"failed before the patch as it must ({short_counts(c)})", files)
    if exit_code == 0 or set(bad.values()) == {"not-detected"}:
        return Verdict(
            False,
            "NOT-DETECTED",
            "test does not detect the defect: passes without the patch: " + ", ".join(sorted(bad)),
            files,
        )
    worst = sorted(set(bad.values()) - {"not-detected"})[0]
    return Verdict(False, worst.upper(), "; ".join(f"{s}: {v}" for s, v in sorted(bad.items())), files)


def green_verdict(specs: list[str], cases: dict[str, Case], exit_code: int | None, timed_out: bool = False) -> Verdict:
    if not specs:
        return Verdict(False, "no-tests", "the patch names no Tests")
    files = {spec: green_file_status(cases_for(spec, cases)) for spec in specs}
    problem = exit_problem(exit_code, timed_out)
    c = counts(cases)
    if problem:
        return Verdict(False, "error", problem, files)
    bad = {s: v for s, v in files.items() if v != "passed"}
    if not bad and exit_code == 0:
        return Verdict(True, "ok", f"passes with the patch ({short_counts(c)})", files)
    worst = "FAILED" if "failed" in bad.values() else sorted(set(bad.values()) or {"failed"})[0].upper()
    return Verdict(False, worst, "; ".join(f"{s}: {v}" for s, v in sorted(bad.items())) or f"exit {exit_code}", files)


def tool_verdict(result: Result, log: str) -> Verdict:
    problem = exit_problem(result.exit_code, result.timed_out)
    c = counts(result.cases)
    if result.exit_code == 0:
        return Verdict(True, "ok", short_counts(c))
    if result.exit_code == 5:
        return Verdict(True, "n/a", "no tool tests collected")
    return Verdict(False, "FAILED", problem or f"{short_counts(c)}; see {log}")


@dataclass
class Comparison:
    regressions: list[dict[str, str]]  # {"id", "before", "after"}
    before: dict[str, int]
    after: dict[str, int]
    fixed: list[str]  # ids that went from bad to passed (informational)


def _tally(outcomes: dict[str, str]) -> dict[str, int]:
    result = {PASSED: 0, FAILED: 0, ERROR: 0, SKIPPED: 0, TIMEOUT: 0}
    for outcome in outcomes.values():
        result[outcome] += 1
    return result


def compare(before: dict[str, str], after: dict[str, str]) -> Comparison:
    """Test id by test id: what went from pass/skip (or from not existing) to fail/error/timeout.

    A test that passed or was skipped before and is gone after counts too ("missing"): a patch
    that stops a test from running must not hide a failure. Tests that were already bad in the
    baseline (failed, error, timeout) are never regressions.
    """
    regressions = []
    for test_id, outcome in sorted(after.items()):
        was = before.get(test_id)
        if outcome in BAD and (was is None or was in GOOD):
            regressions.append({"id": test_id, "before": was or "absent", "after": outcome})
    for test_id, was in sorted(before.items()):
        if was in GOOD and test_id not in after:
            regressions.append({"id": test_id, "before": was, "after": "missing"})
    fixed = sorted(t for t, o in after.items() if o == PASSED and before.get(t) in BAD)
    return Comparison(regressions, _tally(before), _tally(after), fixed)


def upstream_verdict(baselines: list[Result], after: Result, specs: list[str]) -> tuple[Verdict, Comparison | None]:
    """Upstream-Tests after a patch against their pristine baselines (one result per spec)."""
    before = {c.id: c.outcome for b in baselines for c in b.cases.values()}
    exits = {b.exit_code for b in baselines}
    outcomes = {c.id: c.outcome for spec in specs for c in cases_for(spec, after.cases)}
    comparison = compare(before, outcomes)
    problem = exit_problem(after.exit_code, after.timed_out)
    if problem and not (after.exit_code in exits and not after.timed_out):
        return Verdict(False, "error", problem), comparison
    if comparison.regressions:
        shown = ", ".join(f"{r['id']} ({r['before']} -> {r['after']})" for r in comparison.regressions[:5])
        more = len(comparison.regressions) - 5
        detail = f"{len(comparison.regressions)} test(s) worse than pristine: {shown}"
        return Verdict(False, "REGRESSED", detail + (f" ... and {more} more" if more > 0 else "")), comparison
    detail = f"{short_counts(comparison.before)} -> {short_counts(comparison.after)}, no test worse than pristine"
    return Verdict(True, "ok", detail), comparison
