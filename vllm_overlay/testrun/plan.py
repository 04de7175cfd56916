"""The plan: which results a run needs, which of them the verdict store already holds, and the
pytest jobs for the rest.

For patch k (step k = patches 1..k applied): red = its Tests on step k-1, green = its Tests on
step k, one unit per Tests file; baseline = each Upstream-Test on step 0; upstream = its
Upstream-Tests on step k. Then all selected Tests together on the last step (final), each series' oracle
(``tests/patches/<series>/oracle_*.py``, the differential tests that hold the series' tree to
pristine vLLM) on the step of the series' last patch when that patch is selected, and the tool
tests. Units with equal keys are one unit (patch k's red and patch k-1's green when they name the
same file); the missing units of one step's Tests share one pytest process, so the red run of
patch k and the green run of patch k-1 cost one vLLM import, not two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay.testrun.execute import Config, Job
from vllm_overlay.testrun.outcome import PatchOutcome, Unit
from vllm_overlay.testrun.trees import Trees
from vllm_overlay.testrun.verdict_store import VerdictStore, machine_digest, tests_digest, tool_digest
from vllm_overlay.testrun.verdicts import parse_specs, spec_file

if TYPE_CHECKING:
    from vllm_overlay.series import Patch


@dataclass
class Plan:
    outcomes: list[PatchOutcome]
    jobs: list[Job] = field(default_factory=list)
    members: dict[int, list[Unit]] = field(default_factory=dict)  # id(job) -> the units it serves
    final: Unit | None = None
    tool: Unit | None = None
    oracles: dict[str, Unit] = field(default_factory=dict)  # series -> its oracle on its last patch's step

    def units_of(self, job: Job) -> list[Unit]:
        return self.members.get(id(job), [])


class Planner:
    def __init__(
        self,
        *,
        project_root: Path,
        workdir: Path,
        trees: Trees,
        patches: list[Patch],  # every applied patch, in order
        selected: list[str],
        python: Path,
        tool_python: Path | None,
        verdicts: VerdictStore,
        config: Config,
    ) -> None:
        self.project_root = project_root
        self.workdir = workdir
        self.trees = trees
        self.patches = patches
        self.selected = selected
        self.python = python
        self.tool_python = tool_python
        self.verdicts = verdicts
        self.config = config
        self._units: dict[str, Unit] = {}
        self._machines: dict[Path, str] = {}

    def _machine(self, python: Path) -> str:
        """What the machine adds to the outcome (verdict_store.machine_digest), once per interpreter."""
        if python not in self._machines:
            self._machines[python] = machine_digest(python)
        return self._machines[python]

    def unit(self, kind: str, step: int, specs: list[str], *parts: object) -> Unit:
        """The unit for ``specs`` on ``step``, its stored result looked up (one object per key)."""
        what = {"kind": kind, "tree": self.trees.tree_id(step), "specs": specs, "machine": self._machine(self.python)}
        key = self.verdicts.key(what, self.config.per_test_timeout, *parts)
        if key not in self._units:
            self._units[key] = Unit(kind, step, specs, key, what, self.verdicts.load(key))
        return self._units[key]

    def tests_unit(self, step: int, spec: str) -> Unit:
        return self.unit("tests", step, [spec], tests_digest(self.project_root, [spec]))

    def plan(self) -> Plan:
        index_of = {patch.name: i for i, patch in enumerate(self.patches, start=1)}
        outcomes = []
        for name in self.selected:
            step = index_of[name]
            patch = self.patches[step - 1]
            outcome = PatchOutcome(
                name=name,
                series=patch.series,
                subject=patch.subject,
                step=step,
                tests=parse_specs(patch.tests),
                upstream_tests=parse_specs(patch.upstream_tests),
            )
            outcome.red_units = [self.tests_unit(step - 1, spec) for spec in outcome.tests]
            outcome.green_units = [self.tests_unit(step, spec) for spec in outcome.tests]
            outcome.baseline_units = [self.unit("baseline", 0, [spec]) for spec in outcome.upstream_tests]
            if outcome.upstream_tests:
                outcome.upstream_unit = self.unit("upstream", step, outcome.upstream_tests)
            outcomes.append(outcome)
        plan = Plan(outcomes)
        last = len(self.patches)
        all_tests: list[str] = []
        for outcome in outcomes:
            all_tests.extend(t for t in outcome.tests if t not in all_tests)
        if all_tests:
            plan.final = self.unit("final", last, all_tests, tests_digest(self.project_root, all_tests))
        for name, (step, specs) in self.oracle_specs().items():
            digest = tests_digest(self.project_root, specs)
            # The intended differences apply by patch file name: the names are part of the key.
            names = [p.name for p in self.patches if p.series == name]
            plan.oracles[name] = self.unit("oracle", step, specs, digest, self.config.oracle_profile, names)
        if self.config.tool_tests and self.tool_python and (self.project_root / "tests" / "tool").is_dir():
            what = {
                "kind": "tool",
                "python": str(self.tool_python),
                "files": tool_digest(self.project_root),
                "machine": self._machine(self.tool_python),
            }
            key = self.verdicts.key(what)
            plan.tool = Unit("tool", last, ["tests/tool"], key, what, self.verdicts.load(key))
        self._jobs(plan)
        return plan

    def oracle_specs(self) -> dict[str, tuple[int, list[str]]]:
        """Series -> (the step of its last patch, its oracle files), for series whose last patch is selected."""
        last_step: dict[str, int] = {}
        for step, patch in enumerate(self.patches, start=1):
            last_step[patch.series] = step
        found = {}
        for name, step in last_step.items():
            if self.patches[step - 1].name not in self.selected:
                continue
            folder = self.project_root / "tests" / "patches" / name
            specs = sorted(p.relative_to(self.project_root).as_posix() for p in folder.glob("oracle_*.py"))
            if specs:
                found[name] = (step, specs)
        return found

    def _jobs(self, plan: Plan) -> None:
        """One job per group of units without a result, in the order a reader follows the series."""
        queued: set[int] = set()

        def add(
            kind: str,
            label: str,
            units: list[Unit],
            upstream: bool = False,
            timeout: bool = True,
            env: dict[str, str] | None = None,
        ) -> None:
            units = [u for u in units if u.result is None and id(u) not in queued]
            if not units:
                return
            queued.update(id(u) for u in units)
            step = units[0].step
            targets = list(dict.fromkeys(spec for u in units for spec in u.specs))
            stem = label.replace("/", "-").replace(" ", "_").replace(".patch", "")[:80]
            name = f"{len(plan.jobs) + 1:02d}-{kind}-step{step:03d}-{stem}" if kind != "tool" else "tool-tests"
            tool = kind == "tool"
            job = Job(
                kind=kind,
                label=label,
                step=step,
                targets=targets,
                cwd=self.trees.upstream_tests(step) if upstream else self.project_root,
                python=self.tool_python if tool and self.tool_python else self.python,
                pythonpath=None if tool else self.trees.step(step).shadow,
                log=self.workdir / "logs" / f"{name}.log",
                junit_file=self.workdir / "junit" / f"{name}.xml",
                timeout_flag=timeout,
                env=env or {},
            )
            for unit in units:
                unit.job = job
            plan.jobs.append(job)
            plan.members[id(job)] = units

        green_of = {o.step: o for o in plan.outcomes}
        for outcome in plan.outcomes:
            for step, units in ((outcome.step - 1, outcome.red_units), (outcome.step, outcome.green_units)):
                # Every Tests unit of this step, whichever patch needs it (red of k+1, green of k).
                together = [*units]
                if step in green_of and green_of[step] is not outcome:
                    together += green_of[step].green_units
                if step + 1 in green_of and green_of[step + 1] is not outcome:
                    together += green_of[step + 1].red_units
                for group in _importable_together(together):
                    add("tests", _who(step, green_of), group)
            add("baseline", outcome.name, outcome.baseline_units, upstream=True)
            if outcome.upstream_unit is not None:
                add("upstream", outcome.name, [outcome.upstream_unit], upstream=True)
        if plan.final is not None:
            add("final", "all Tests together", [plan.final])
        for name, unit in plan.oracles.items():
            env = {"VLLM_OVERLAY_ORACLE_PROFILE": self.config.oracle_profile}
            if self.config.oracle_db is not None:
                env["VLLM_OVERLAY_ORACLE_DB"] = str(self.config.oracle_db / name)
            # No per-test timeout: an oracle is one long hypothesis test that bounds every wait
            # itself; the process limit (--run-timeout) still holds.
            add("oracle", f"oracle of {name}", [unit], timeout=False, env=env)
        if plan.tool is not None:
            add("tool", "tool tests", [plan.tool], timeout=False)


def _who(step: int, by_step: dict[int, PatchOutcome]) -> str:
    names = []
    if step + 1 in by_step:
        names.append(f"red {by_step[step + 1].name}")
    if step in by_step:
        names.append(f"green {by_step[step].name}")
    return ", ".join(names)


def _importable_together(units: list[Unit]) -> list[list[Unit]]:
    """Split units so no pytest process holds two test files of one basename in different folders.

    Test folders without ``__init__.py`` are imported by basename (pytest's rootdir-relative
    "prepend" mode): two ``test_demo.py`` in one process would fail to collect.
    """
    groups: list[tuple[dict[str, str], list[Unit]]] = []
    for unit in units:
        files = {Path(spec_file(s)).name: spec_file(s) for s in unit.specs}
        for names, members in groups:
            if all(names.get(name, path) == path for name, path in files.items()):
                names.update(files)
                members.append(unit)
                break
        else:
            groups.append((dict(files), [unit]))
    return [members for _, members in groups]
