"""testrun.outcome: a patch's verdicts from whatever of its units have results, and the run's report."""

from __future__ import annotations

from pathlib import Path

from vllm_overlay.junit import Case
from vllm_overlay.testrun.execute import Job
from vllm_overlay.testrun.outcome import PatchOutcome, RunReport, Unit, decide
from vllm_overlay.testrun.verdicts import Result, Verdict

TESTS = "tests/patches/demo/test_demo.py"
UPSTREAM = "tests/test_u.py"


def result(exit_code: int, *pairs: tuple[str, str], cached: bool = False) -> Result:
    return Result(exit_code, False, {i: Case(i, i.split("::", 1)[0], o) for i, o in pairs}, cached=cached)


def job(kind: str, seconds: float, exit_code: int | None = 0) -> Job:
    root = Path("/w")
    return Job(
        kind,
        "who",
        1,
        [TESTS],
        root,
        root / "python",
        None,
        root / f"{kind}.log",
        root / f"{kind}.xml",
        exit_code=exit_code,
        seconds=seconds,
    )


def unit(kind: str, step: int, spec: str, res: Result | None, ran: Job | None = None) -> Unit:
    return Unit(kind, step, [spec], f"key-{kind}-{step}", {"kind": kind}, res, ran)


def outcome(tests: list[str], upstream: list[str]) -> PatchOutcome:
    return PatchOutcome("demo/a.patch", "demo", "A", 1, tests, upstream)


def test_a_unit_is_executed_only_when_its_job_ran() -> None:
    assert not unit("tests", 0, TESTS, None).executed
    assert unit("tests", 0, TESTS, None, job("tests", 1.0)).executed
    assert not unit("tests", 0, TESTS, None, job("tests", 1.0, exit_code=None)).executed
    skipped = job("tests", 0.0)
    skipped.skipped_reason = "fail-fast"
    assert not unit("tests", 0, TESTS, None, skipped).executed


def test_decide_proves_red_green_and_upstream_from_results() -> None:
    shared = job("tests", 2.0)
    o = outcome([TESTS], [UPSTREAM])
    o.red_units = [unit("tests", 0, TESTS, result(1, (f"{TESTS}::t", "failed")), shared)]
    o.green_units = [unit("tests", 1, TESTS, result(0, (f"{TESTS}::t", "passed")), shared)]
    o.baseline_units = [unit("baseline", 0, UPSTREAM, result(0, (f"{UPSTREAM}::u", "passed"), cached=True))]
    o.upstream_unit = unit("upstream", 1, UPSTREAM, result(0, (f"{UPSTREAM}::u", "passed")), job("upstream", 3.0))
    decide(o)
    assert o.ok and o.failures() == []
    assert (o.red.status, o.green.status, o.upstream.status) == ("ok", "ok", "ok")
    assert o.jobs == [shared, o.upstream_unit.job]  # one job serving two units is counted once
    assert o.seconds == 5.0 and not o.cached and o.baseline_cached
    data = o.to_json()
    assert data["ok"] is True and data["upstream_before"]["passed"] == 1 and data["upstream_regressions"] == []
    assert [r["kind"] for r in data["runs"]] == ["tests", "upstream"]


def test_decide_without_tests_or_upstream_tests() -> None:
    o = outcome([], [])
    decide(o)
    assert o.red == o.green == Verdict(False, "no-tests", "the patch names no Tests")
    assert o.upstream == Verdict(True, "n/a", "the patch names no Upstream-Tests")
    assert not o.ok and o.failures() == [
        "red: no-tests: the patch names no Tests",
        "green: no-tests: the patch names no Tests",
    ]
    assert o.cached  # nothing to run: every (no) result is at hand


def test_decide_with_results_still_missing_leaves_verdicts_unset() -> None:
    o = outcome([TESTS], [UPSTREAM])
    o.red_units = [unit("tests", 0, TESTS, result(1, (f"{TESTS}::t", "failed")))]
    o.green_units = [unit("tests", 1, TESTS, None)]
    o.baseline_units = [unit("baseline", 0, UPSTREAM, None)]
    o.upstream_unit = unit("upstream", 1, UPSTREAM, None)
    decide(o)
    assert o.red is not None and o.red.ok and o.green is None and o.upstream is None
    assert o.failures() == ["green: not run", "upstream-tests: not run"]
    assert o.red_so_far() == o.red and o.green_so_far() is None
    assert not o.cached
    o.upstream_unit.result = result(0, (f"{UPSTREAM}::u", "passed"))
    decide(o)
    assert o.upstream == Verdict(False, "error", "no pristine baseline (its run did not finish)")


def test_red_so_far_combines_every_red_unit() -> None:
    o = outcome([TESTS, "tests/patches/demo/test_two.py"], [])
    o.red_units = [
        unit("tests", 0, TESTS, result(1, (f"{TESTS}::t", "failed"))),
        unit("tests", 0, "tests/patches/demo/test_two.py", result(0, ("tests/patches/demo/test_two.py::t", "passed"))),
    ]
    red = o.red_so_far()
    assert red is not None and red.status == "NOT-DETECTED" and "test_two.py" in red.detail


def _report(*outcomes: PatchOutcome, **extra: object) -> RunReport:
    return RunReport(list(outcomes), **extra)  # type: ignore[arg-type]


def _proven() -> PatchOutcome:
    o = outcome([TESTS], [])
    o.red, o.green, o.upstream = Verdict(True, "ok"), Verdict(True, "ok"), Verdict(True, "n/a")
    return o


def test_run_report_ok_and_its_first_failure() -> None:
    assert _report(_proven()).ok and _report(_proven()).first_failure() is None
    assert not _report(_proven(), stopped=True).ok
    final = _report(_proven(), final=Verdict(False, "FAILED", "t: failed"))
    assert not final.ok and final.first_failure() == "full series: FAILED: t: failed"
    tool = _report(_proven(), tool=Verdict(False, "FAILED", "0p 1f 0s"))
    assert tool.first_failure() == "tool tests: FAILED: 0p 1f 0s"
    bad = outcome([TESTS], [])
    bad.red = Verdict(False, "NOT-DETECTED", "passes without the patch")
    first = _report(bad, _proven(), final=Verdict(False, "x", "y")).first_failure()
    assert first == "demo/a.patch: red: NOT-DETECTED: passes without the patch; green: not run; upstream-tests: not run"


def test_run_report_json() -> None:
    final_unit = unit("final", 1, TESTS, result(0, (f"{TESTS}::t", "passed"), cached=True))
    report = _report(
        _proven(),
        final=Verdict(True, "ok", "1p 0f 0s"),
        final_unit=final_unit,
        seconds=12.345,
        processes=3,
        extra={"upstream": "0.33.0"},
    )
    data = report.to_json()
    assert data["upstream"] == "0.33.0" and data["ok"] is True and data["seconds"] == 12.3
    assert data["pytest_processes"] == 3 and len(data["patches"]) == 1
    assert data["full_series"] == {
        "ok": True,
        "status": "ok",
        "detail": "1p 0f 0s",
        "files": {},
        "cached": True,
        "run": None,
    }
    assert data["tool_tests"] == {"status": "not run", "cached": False, "run": None}


def test_a_series_oracle_decides_the_run() -> None:
    oracle = unit("oracle", 1, "tests/patches/demo/oracle_demo.py", None)
    waiting = _report(_proven(), oracle_units={"demo": oracle})
    assert not waiting.ok and waiting.first_failure() == "oracle of demo: not run"
    failed = _report(_proven(), oracle_units={"demo": oracle}, oracles={"demo": Verdict(False, "FAILED", "0p 1f 0s")})
    assert not failed.ok and failed.first_failure() == "oracle of demo: FAILED: 0p 1f 0s"
    passed = _report(_proven(), oracle_units={"demo": oracle}, oracles={"demo": Verdict(True, "ok", "1p 0f 0s")})
    assert passed.ok and passed.first_failure() is None
    assert passed.to_json()["oracles"] == {
        "demo": {"ok": True, "status": "ok", "detail": "1p 0f 0s", "files": {}, "cached": False, "run": None}
    }
