"""The run: take a plan, run its jobs in a pool, keep every result, decide each patch as soon as
its results are in, and stop at the first failure unless told to keep going."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from vllm_overlay.testrun.execute import Config, Executor, Job, log_tail
from vllm_overlay.testrun.outcome import PatchOutcome, RunReport, Unit, decide
from vllm_overlay.testrun.plan import Plan
from vllm_overlay.testrun.verdict_store import VerdictStore
from vllm_overlay.testrun.verdicts import counts, exit_problem, green_verdict, part_of, short_counts, tool_verdict


class Runner:
    def __init__(self, plan: Plan, verdicts: VerdictStore, config: Config, info: Callable[[str], None]) -> None:
        self.plan = plan
        self.verdicts = verdicts
        self.config = config
        self.info = info
        self._print_lock = threading.Lock()
        self.report = RunReport(plan.outcomes, final_unit=plan.final, tool_unit=plan.tool, oracle_units=plan.oracles)
        self.decided: set[str] = set()

    def say(self, message: str) -> None:
        with self._print_lock:
            self.info(message)

    def execute(self, base_env: dict[str, str]) -> RunReport:
        started = time.monotonic()
        executor = Executor(self.config, base_env)
        queue = list(self.plan.jobs)
        number = {id(job): i for i, job in enumerate(queue, start=1)}
        total = len(queue)

        def describe(job: Job) -> str:
            where = "pristine" if job.step == 0 else f"patches 1..{job.step}"
            return f"[{number[id(job)]}/{total}] {job.kind:<8} {job.label} on {where}"

        def start(job: Job) -> Job:
            if not executor.stopping.is_set():
                self.say(describe(job) + " ...")
            return executor.run(job)

        failed = self.settle()  # what the verdict store decided already
        if failed and not self.config.keep_going:
            queue = []
            self.say("stopping at the first failure (--keep-going runs everything)")
        try:
            with ThreadPoolExecutor(max_workers=max(1, self.config.jobs)) as pool:
                pending: set[Future[Job]] = set()
                while queue or pending:
                    while queue and len(pending) < max(1, self.config.jobs) and not executor.stopping.is_set():
                        pending.add(pool.submit(start, queue.pop(0)))
                    if not pending:
                        break
                    try:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    except KeyboardInterrupt:  # stop the processes before the pool waits for them
                        executor.stop()
                        raise
                    for future in done:
                        job = future.result()
                        if not job.ran:
                            continue
                        self.say(f"{describe(job)}: {self.job_summary(job)} ({job.seconds:.1f}s)")
                        self.keep(job)
                        failed = self.settle(job) or failed
                        if failed and not self.config.keep_going and not executor.stopping.is_set():
                            self.say("stopping at the first failure (--keep-going runs everything)")
                            executor.stop()
        except KeyboardInterrupt:
            executor.stop()
            raise
        self.report.stopped = any(not job.ran for job in self.plan.jobs)
        for outcome in self.plan.outcomes:  # patches cut short by a stop: decide on what did run
            if outcome.name not in self.decided:
                decide(outcome)
        self.report.seconds = time.monotonic() - started
        self.report.processes = executor.started
        return self.report

    def keep(self, job: Job) -> None:
        """Give the job's units their results and store them."""
        units = self.plan.units_of(job)
        for unit in units:
            if unit.kind in ("tests", "baseline"):
                unit.result = part_of(job.result, unit.specs, shared=len(units) > 1)
            else:
                unit.result = job.result
            self.verdicts.save(unit.key, unit.result, unit.what)

    def settle(self, job: Job | None = None) -> bool:
        """Decide whatever now has all its results; True when something failed."""
        failed = False
        for outcome in self.plan.outcomes:
            if outcome.name in self.decided:
                continue
            if all(u.result is not None for u in outcome.units):
                decide(outcome)
                self.decided.add(outcome.name)
                self.say(self.patch_line(outcome))
                if not outcome.ok:
                    self.show_failure_logs(outcome)
                    failed = True
            elif job is not None and not self.config.keep_going:
                # A red or green phase that already failed fails the patch: no need to wait.
                for verdict in (outcome.red_so_far(), outcome.green_so_far()):
                    if verdict is not None and not verdict.ok and any(u.job is job for u in outcome.units):
                        self.say(f"  {outcome.name}: {verdict.status}: {verdict.detail}\n  log: {job.log}")
                        self.say(log_tail(job.log, 30))
                        failed = True
        for series_name, unit in self.plan.oracles.items():
            if unit.result is None or series_name in self.report.oracles:
                continue
            r = unit.result
            verdict = green_verdict(unit.specs, r.cases, r.exit_code, r.timed_out)
            self.report.oracles[series_name] = verdict
            cached = "" if unit.executed else " (cached)"
            self.say(f"  => oracle of {series_name}: {verdict.status}{cached}")
            if not verdict.ok:
                if unit.executed and unit.job is not None:
                    self.say(f"  --- oracle log (last lines): {unit.job.log}\n{log_tail(unit.job.log, 60)}  ---")
                failed = True
        for name, unit in (("final", self.plan.final), ("tool", self.plan.tool)):
            if unit is None or unit.result is None or getattr(self.report, name) is not None:
                continue
            log = unit.job.log if unit.job else "(cached)"
            if name == "final":
                r = unit.result
                verdict = green_verdict(unit.specs, r.cases, r.exit_code, r.timed_out)
            else:
                verdict = tool_verdict(unit.result, str(log))
            setattr(self.report, name, verdict)
            if not unit.executed:
                self.say(f"  => {'all Tests together' if name == 'final' else 'tool tests'}: {verdict.status} (cached)")
            if not verdict.ok:
                if unit.executed and unit.job is not None:
                    self.say(f"  --- {unit.kind} log (last lines): {log}\n{log_tail(unit.job.log, 30)}  ---")
                failed = True
        return failed

    def job_summary(self, job: Job) -> str:
        c = short_counts(counts(job.cases))
        problem = exit_problem(job.exit_code, job.timed_out)
        return f"{c}; {problem}" if problem else c

    def patch_line(self, outcome: PatchOutcome) -> str:
        how = "cached" if outcome.cached else f"{outcome.seconds:.0f}s of test time"
        if outcome.ok:
            return f"  => {outcome.name}: ok (red, green, upstream-tests) ({how})"
        return f"  => {outcome.name}: FAILED ({how}): " + "; ".join(outcome.failures())

    def show_failure_logs(self, outcome: PatchOutcome) -> None:
        verdicts = {"red": outcome.red, "green": outcome.green, "upstream": outcome.upstream}
        for phase, units in (
            ("red", outcome.red_units),
            ("green", outcome.green_units),
            ("upstream", [u for u in [outcome.upstream_unit] if u is not None]),
        ):
            verdict = verdicts[phase]
            shown: list[Unit] = []
            for unit in units:
                if verdict is not None and not verdict.ok and unit.executed and unit.job is not None:
                    if any(s.job is unit.job for s in shown):
                        continue
                    shown.append(unit)
                    self.say(f"  --- {phase} log (last lines): {unit.job.log}\n{log_tail(unit.job.log, 30)}  ---")
            if verdict is not None and not verdict.ok and not shown:
                self.say(f"  ({phase} verdict from the verdict store; --no-cache runs it again)")
