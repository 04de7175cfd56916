"""testrun.verdicts: the pure rules from test outcomes to red, green and upstream verdicts."""

from __future__ import annotations

import pytest

from tests.tool.helpers.patch_tests import cases
from vllm_overlay import testrun
from vllm_overlay.junit import Case
from vllm_overlay.testrun import verdicts
from vllm_overlay.testrun.verdicts import Result


def test_spec_file_and_a_spec_selecting_one_test_keeps_its_files_collection_error() -> None:
    assert verdicts.spec_file("t/test_a.py::TestX::test_y[1]") == "t/test_a.py"
    found = cases(
        ("t/test_a.py::<collection>", "error"), ("t/test_a.py::test_x", "passed"), ("t/test_b.py::test_x", "passed")
    )
    selected = [c.id for c in verdicts.cases_for("t/test_a.py::test_y", found)]
    assert selected == ["t/test_a.py::<collection>"]  # a file that did not collect fails every spec in it


def test_a_file_spec_matches_by_the_reported_file_too() -> None:
    moved = {"x::test_q": Case("x::test_q", "t/test_a.py", "failed")}  # an id that does not start with the file
    assert [c.id for c in verdicts.cases_for("t/test_a.py", moved)] == ["x::test_q"]
    assert verdicts.cases_for("t/test_b.py", moved) == []


def test_counts_and_short_counts_name_errors_and_timeouts_only_when_there() -> None:
    mixed = cases(("a::1", "passed"), ("a::2", "failed"), ("a::3", "error"), ("a::4", "timeout"), ("a::5", "skipped"))
    tally = verdicts.counts(mixed)
    assert tally == {"passed": 1, "failed": 1, "error": 1, "skipped": 1, "timeout": 1}
    assert verdicts.counts(list(mixed.values())) == tally
    assert verdicts.short_counts(tally) == "1p 1f 1s 1e 1t"
    assert verdicts.short_counts(verdicts.counts(cases(("a::1", "passed")))) == "1p 0f 0s"


def test_result_json_round_trip_is_marked_cached() -> None:
    result = Result(1, False, cases(("t/a.py::x", "failed")), seconds=1.23456)
    data = result.to_json()
    assert data == {"exit_code": 1, "timed_out": False, "seconds": 1.23, "cases": [["t/a.py::x", "t/a.py", "failed"]]}
    back = Result.from_json(data)
    assert back.cached and back.cases["t/a.py::x"].outcome == "failed" and back.seconds == 1.23
    assert not result.cached


@pytest.mark.parametrize(
    ("exit_code", "timed_out", "clean"),
    [(0, False, True), (1, False, True), (1, True, False), (2, False, False), (None, False, False), (-9, False, False)],
)
def test_clean_exit_is_pytest_finishing_in_time(exit_code: int | None, timed_out: bool, clean: bool) -> None:
    assert Result(exit_code, timed_out, {}).clean_exit is clean


def test_part_of_a_shared_run_gets_the_exit_code_it_would_have_had_alone() -> None:
    run = Result(1, False, cases(("t/a.py::x", "passed"), ("t/b.py::y", "failed")), seconds=4.0)
    assert verdicts.part_of(run, ["t/a.py"], shared=True).exit_code == 0
    assert verdicts.part_of(run, ["t/b.py"], shared=True).exit_code == 1
    assert verdicts.part_of(run, ["t/c.py"], shared=True).exit_code == 5
    assert set(verdicts.part_of(run, ["t/a.py"], shared=True).cases) == {"t/a.py::x"}
    assert verdicts.part_of(run, ["t/a.py"], shared=False).exit_code == 1  # alone in its run: pytest's own code
    crashed = Result(-9, False, run.cases)
    assert verdicts.part_of(crashed, ["t/a.py"], shared=True).exit_code == -9  # a crash speaks for every part
    late = Result(1, True, run.cases)
    assert (
        verdicts.part_of(late, ["t/a.py"], shared=True).exit_code == 1
        and verdicts.part_of(late, ["t/a.py"], True).timed_out
    )


def test_combine_lets_the_worst_ending_win() -> None:
    ok = Result(0, False, cases(("a::1", "passed")), 1.0, cached=True)
    failed = Result(1, False, cases(("b::1", "failed")), 2.0, cached=True)
    crashed = Result(3, False, {}, 0.5)
    both = verdicts.combine([ok, failed])
    assert (both.exit_code, both.timed_out, set(both.cases), both.seconds, both.cached) == (
        1,
        False,
        {"a::1", "b::1"},
        3.0,
        True,
    )
    assert verdicts.combine([ok, crashed, failed]).exit_code == 3 and not verdicts.combine([ok, crashed]).cached
    assert verdicts.combine([ok, Result(0, True, {})]).timed_out
    assert verdicts.combine([ok, ok]).exit_code == 0


def test_file_statuses_rank_collection_errors_above_failures() -> None:
    collect = list(cases(("f::<collection>", "error"), ("f::x", "failed")).values())
    assert verdicts.red_file_status(collect) == verdicts.green_file_status(collect) == "collection-error"
    timeout = list(cases(("f::x", "timeout"), ("f::y", "error")).values())
    assert verdicts.red_file_status(timeout) == "detected" and verdicts.green_file_status(timeout) == "failed"
    assert verdicts.red_file_status([]) == verdicts.green_file_status([]) == "no-tests"
    skipped = list(cases(("f::x", "skipped")).values())
    assert verdicts.red_file_status(skipped) == "not-detected" and verdicts.green_file_status(skipped) == "all-skipped"


def test_exit_problem_says_what_went_wrong() -> None:
    assert verdicts.exit_problem(0, False) is None and verdicts.exit_problem(1, False) is None
    assert verdicts.exit_problem(0, True) == "the pytest process ran past its time limit and was killed"
    assert verdicts.exit_problem(None, False) == "did not run"
    assert verdicts.exit_problem(-11, False) == "pytest died from signal 11"
    assert verdicts.exit_problem(5, False) == "pytest exit code 5 (no tests collected)"
    assert verdicts.exit_problem(2, False) == "pytest exit code 2 (interrupted)"
    assert verdicts.exit_problem(77, False) == "pytest exit code 77 (unknown)"


def test_red_verdict_of_a_timeout_that_detects_and_a_run_that_timed_out() -> None:
    spec = ["t/test_a.py"]
    slow = verdicts.red_verdict(spec, cases(("t/test_a.py::x", "timeout")), 1)
    assert slow.ok and slow.detail == "failed before the patch as it must (0p 0f 0s 1t)"
    assert slow.files == {"t/test_a.py": "detected"}
    killed = verdicts.red_verdict(spec, cases(("t/test_a.py::x", "failed")), 1, timed_out=True)
    assert (killed.ok, killed.status) == (False, "error") and "time limit" in killed.detail
    none = verdicts.red_verdict(spec, {}, 1)
    assert (none.ok, none.status, none.detail) == (False, "NO-TESTS", "t/test_a.py: no-tests")


def test_green_verdict_with_every_case_passing_but_exit_1_is_failed() -> None:
    odd = verdicts.green_verdict(["t/test_a.py"], cases(("t/test_a.py::x", "passed")), 1)
    assert (odd.ok, odd.status, odd.detail) == (False, "FAILED", "exit 1")
    mixed = verdicts.green_verdict(["t/a.py", "t/b.py"], cases(("t/a.py::x", "error"), ("t/b.py::y", "failed")), 1)
    assert mixed.status == "FAILED" and mixed.detail == "t/a.py: error; t/b.py: failed"
    assert verdicts.green_verdict([], {}, 0).to_json() == {
        "ok": False,
        "status": "no-tests",
        "detail": "the patch names no Tests",
        "files": {},
    }


def test_tool_verdict() -> None:
    assert verdicts.tool_verdict(Result(0, False, cases(("a::1", "passed"))), "log").detail == "1p 0f 0s"
    assert verdicts.tool_verdict(Result(5, False, {}), "log").status == "n/a"
    failed = verdicts.tool_verdict(Result(1, False, cases(("a::1", "failed"))), "/w/tool.log")
    assert (failed.ok, failed.status, failed.detail) == (False, "FAILED", "0p 1f 0s; see /w/tool.log")
    crashed = verdicts.tool_verdict(Result(None, True, {}), "log")
    assert crashed.detail == "the pytest process ran past its time limit and was killed"


def test_upstream_verdict_keeps_a_baselines_own_failures_and_lists_at_most_five() -> None:
    spec = ["tests/test_u.py"]
    base = Result(
        1, False, cases(*((f"tests/test_u.py::t{i}", "passed") for i in range(7)), ("tests/test_u.py::bad", "failed"))
    )
    same = Result(1, False, dict(base.cases))
    verdict, comparison = verdicts.upstream_verdict([base], same, spec)
    assert verdict.ok and verdict.detail == "7p 1f 0s -> 7p 1f 0s, no test worse than pristine"
    assert comparison is not None and comparison.regressions == []
    worse = Result(1, False, cases(*((f"tests/test_u.py::t{i}", "failed") for i in range(7))))
    verdict, comparison = verdicts.upstream_verdict([base], worse, spec)
    assert (verdict.ok, verdict.status) == (False, "REGRESSED")
    assert verdict.detail.startswith("7 test(s) worse than pristine: tests/test_u.py::t0 (passed -> failed)")
    assert verdict.detail.endswith(" ... and 2 more")
    assert comparison is not None and len(comparison.regressions) == 7


def test_upstream_verdict_a_crash_the_baseline_did_not_have_is_an_error() -> None:
    spec = ["tests/test_u.py"]
    base = Result(5, False, {})
    assert verdicts.upstream_verdict([base], Result(5, False, {}), spec)[0].ok  # no tests before or after: same ending
    verdict, _ = verdicts.upstream_verdict([base], Result(3, False, {}), spec)
    assert (verdict.ok, verdict.status, verdict.detail) == (False, "error", "pytest exit code 3 (internal error)")
    verdict, _ = verdicts.upstream_verdict([base], Result(5, True, {}), spec)
    assert verdict.status == "error"  # a time limit is never excused by the baseline


def test_red_verdicts() -> None:
    spec = ["t/test_a.py"]
    ok = testrun.red_verdict(spec, cases(("t/test_a.py::x", "failed"), ("t/test_a.py::y", "passed")), 1)
    assert ok.ok and ok.status == "ok"
    passes = testrun.red_verdict(spec, cases(("t/test_a.py::x", "passed")), 0)
    assert not passes.ok and passes.status == "NOT-DETECTED" and "does not detect" in passes.detail
    collect = testrun.red_verdict(spec, cases(("t/test_a.py::<collection>", "error")), 1)
    assert not collect.ok and collect.status == "COLLECTION-ERROR"
    errors_only = testrun.red_verdict(spec, cases(("t/test_a.py::x", "error")), 1)
    assert not errors_only.ok and errors_only.status == "ERROR"
    crashed = testrun.red_verdict(spec, {}, 4)
    assert not crashed.ok and crashed.status == "error" and "usage error" in crashed.detail
    # Two files: one detects, the other passes -> the run fails and names the file.
    two = testrun.red_verdict(
        ["t/test_a.py", "t/test_b.py"], cases(("t/test_a.py::x", "failed"), ("t/test_b.py::y", "passed")), 1
    )
    assert not two.ok and two.status == "NOT-DETECTED" and "t/test_b.py" in two.detail
    assert not testrun.red_verdict([], {}, 0).ok


def test_green_verdicts() -> None:
    spec = ["t/test_a.py"]
    assert testrun.green_verdict(spec, cases(("t/test_a.py::x", "passed"), ("t/test_a.py::y", "skipped")), 0).ok
    failed = testrun.green_verdict(spec, cases(("t/test_a.py::x", "failed")), 1)
    assert not failed.ok and failed.status == "FAILED"
    skipped = testrun.green_verdict(spec, cases(("t/test_a.py::x", "skipped")), 0)
    assert not skipped.ok and skipped.status == "ALL-SKIPPED"
    assert not testrun.green_verdict(spec, cases(("t/test_a.py::x", "passed")), 0, timed_out=True).ok


def test_spec_with_test_id_selects_only_its_cases() -> None:
    found = cases(("t/test_a.py::test_x", "failed"), ("t/test_a.py::test_x[1]", "failed"), ("t/test_a.py::z", "passed"))
    selected = {c.id for c in testrun.cases_for("t/test_a.py::test_x", found)}
    assert selected == {"t/test_a.py::test_x", "t/test_a.py::test_x[1]"}  # its parametrized cases too
    assert len(testrun.cases_for("t/test_a.py", found)) == 3


def test_compare_counts_only_changes_for_the_worse() -> None:
    before = {"a": "passed", "b": "skipped", "c": "failed", "d": "timeout", "e": "passed", "f": "error"}
    after = {"a": "failed", "b": "error", "c": "failed", "d": "timeout", "f": "passed", "g": "failed", "h": "passed"}
    result = testrun.compare(before, after)
    assert [(r["id"], r["before"], r["after"]) for r in result.regressions] == [
        ("a", "passed", "failed"),
        ("b", "skipped", "error"),
        ("g", "absent", "failed"),
        ("e", "passed", "missing"),
    ]
    assert result.fixed == ["f"]
    assert result.before["passed"] == 2 and result.after["failed"] == 3
    assert testrun.compare(before, dict(before, e="timeout")).regressions[0]["after"] == "timeout"
    assert testrun.compare(before, before).regressions == []


def test_parse_specs_drops_none() -> None:
    assert testrun.parse_specs(["none"]) == []
    assert testrun.parse_specs(["tests/a.py", "-"]) == ["tests/a.py"]
