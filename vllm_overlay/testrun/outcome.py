"""What a run decides: one outcome per patch (red, green, upstream) and the run's report.

A *unit* is one thing the plan needs to know: the result of some test specs on one tree. Its
result comes from the verdict store or from the pytest job that ran it; several units can share
one job. :func:`decide` turns a patch's unit results into its verdicts (see ``verdicts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_overlay.testrun.execute import Job
from vllm_overlay.testrun.verdicts import (
    Comparison,
    Result,
    Verdict,
    combine,
    green_verdict,
    red_verdict,
    upstream_verdict,
)


@dataclass(eq=False)
class Unit:
    kind: str  # tests | baseline | upstream | final | oracle | tool
    step: int
    specs: list[str]
    key: str
    what: dict[str, object]
    result: Result | None = None
    job: Job | None = None  # the process that produced the result in this run (None: cached or not run)

    @property
    def executed(self) -> bool:
        return self.job is not None and self.job.ran


def _phase(units: list[Unit]) -> Result | None:
    if not units or any(u.result is None for u in units):
        return None
    return combine([u.result for u in units if u.result is not None])


@dataclass
class PatchOutcome:
    name: str
    series: str
    subject: str
    step: int
    tests: list[str]
    upstream_tests: list[str]
    red_units: list[Unit] = field(default_factory=list)
    green_units: list[Unit] = field(default_factory=list)
    baseline_units: list[Unit] = field(default_factory=list)
    upstream_unit: Unit | None = None
    red: Verdict | None = None
    green: Verdict | None = None
    upstream: Verdict | None = None
    comparison: Comparison | None = None

    @property
    def units(self) -> list[Unit]:
        return [*self.red_units, *self.green_units, *self.baseline_units, *filter(None, [self.upstream_unit])]

    @property
    def jobs(self) -> list[Job]:
        """The pytest processes of this patch that ran in this run."""
        seen: list[Job] = []
        for unit in self.units:
            if unit.executed and unit.job is not None and all(unit.job is not j for j in seen):
                seen.append(unit.job)
        return seen

    @property
    def cached(self) -> bool:
        """Every result came from the verdict store (none ran in this run, none is missing)."""
        return all(u.result is not None and not u.executed for u in self.units)

    @property
    def baseline_cached(self) -> bool:
        return bool(self.baseline_units) and not any(u.executed for u in self.baseline_units)

    @property
    def seconds(self) -> float:
        return sum(j.seconds for j in self.jobs)

    @property
    def ok(self) -> bool:
        return all(v is not None and v.ok for v in (self.red, self.green, self.upstream))

    def red_so_far(self) -> Verdict | None:
        phase = _phase(self.red_units)
        return None if phase is None else red_verdict(self.tests, phase.cases, phase.exit_code, phase.timed_out)

    def green_so_far(self) -> Verdict | None:
        phase = _phase(self.green_units)
        return None if phase is None else green_verdict(self.tests, phase.cases, phase.exit_code, phase.timed_out)

    def failures(self) -> list[str]:
        found = []
        for phase, verdict in (("red", self.red), ("green", self.green), ("upstream-tests", self.upstream)):
            if verdict is None:
                found.append(f"{phase}: not run")
            elif not verdict.ok:
                found.append(f"{phase}: {verdict.status}: {verdict.detail}")
        return found

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "series": self.series,
            "subject": self.subject,
            "step": self.step,
            "tests": self.tests,
            "upstream_tests": self.upstream_tests,
            "ok": self.ok,
            "cached": self.cached,
            "seconds": round(self.seconds, 2),
            "red": self.red.to_json() if self.red else None,
            "green": self.green.to_json() if self.green else None,
            "upstream": self.upstream.to_json() if self.upstream else None,
            "upstream_before": self.comparison.before if self.comparison else None,
            "upstream_after": self.comparison.after if self.comparison else None,
            "upstream_regressions": self.comparison.regressions if self.comparison else None,
            "upstream_fixed": self.comparison.fixed if self.comparison else None,
            "upstream_baseline_cached": self.baseline_cached,
            "runs": [j.to_json() for j in self.jobs],
        }


def decide(outcome: PatchOutcome) -> None:
    """Set the patch's verdicts from whatever of its units have a result."""
    if not outcome.tests:
        outcome.red = outcome.green = Verdict(False, "no-tests", "the patch names no Tests")
    else:
        outcome.red = outcome.red_so_far() or outcome.red
        outcome.green = outcome.green_so_far() or outcome.green
    if not outcome.upstream_tests:
        outcome.upstream = Verdict(True, "n/a", "the patch names no Upstream-Tests")
        return
    after = outcome.upstream_unit.result if outcome.upstream_unit else None
    if after is None:
        return
    baselines = [u.result for u in outcome.baseline_units]
    if any(b is None for b in baselines):
        outcome.upstream = Verdict(False, "error", "no pristine baseline (its run did not finish)")
        return
    outcome.upstream, outcome.comparison = upstream_verdict(
        [b for b in baselines if b is not None], after, outcome.upstream_tests
    )


@dataclass
class RunReport:
    patches: list[PatchOutcome]
    final: Verdict | None = None
    final_unit: Unit | None = None
    tool: Verdict | None = None
    tool_unit: Unit | None = None
    stopped: bool = False
    seconds: float = 0.0
    setup_seconds: float = 0.0
    processes: int = 0  # pytest processes started
    extra: dict[str, object] = field(default_factory=dict)
    oracle_units: dict[str, Unit] = field(default_factory=dict)  # series -> its oracle's unit
    oracles: dict[str, Verdict] = field(default_factory=dict)  # series -> its oracle's verdict, once decided

    @property
    def ok(self) -> bool:
        checks = [p.ok for p in self.patches]
        checks += [self.oracles[name].ok if name in self.oracles else False for name in self.oracle_units]
        if self.final is not None:
            checks.append(self.final.ok)
        if self.tool is not None:
            checks.append(self.tool.ok)
        return all(checks) and not self.stopped

    def first_failure(self) -> str | None:
        for patch in self.patches:
            if not patch.ok:
                return f"{patch.name}: " + "; ".join(patch.failures())
        if self.final is not None and not self.final.ok:
            return f"full series: {self.final.status}: {self.final.detail}"
        for name in self.oracle_units:
            verdict = self.oracles.get(name)
            if verdict is None or not verdict.ok:
                return f"oracle of {name}: " + (f"{verdict.status}: {verdict.detail}" if verdict else "not run")
        if self.tool is not None and not self.tool.ok:
            return f"tool tests: {self.tool.status}: {self.tool.detail}"
        return None

    @staticmethod
    def _whole(verdict: Verdict | None, unit: Unit | None) -> dict[str, object]:
        job = unit.job if unit is not None and unit.executed else None
        return {
            **(verdict.to_json() if verdict else {"status": "not run"}),
            "cached": unit is not None and unit.result is not None and not unit.executed,
            "run": job.to_json() if job else None,
        }

    def to_json(self) -> dict[str, object]:
        return {
            **self.extra,
            "ok": self.ok,
            "stopped": self.stopped,
            "seconds": round(self.seconds, 1),
            "setup_seconds": round(self.setup_seconds, 1),
            "pytest_processes": self.processes,
            "patches": [p.to_json() for p in self.patches],
            "full_series": self._whole(self.final, self.final_unit),
            "oracles": {name: self._whole(self.oracles.get(name), unit) for name, unit in self.oracle_units.items()},
            "tool_tests": self._whole(self.tool, self.tool_unit),
        }
