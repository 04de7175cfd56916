"""junit: pytest's own --junitxml read back as {test id: Case}; the runner's report written for CI."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from vllm_overlay import junit
from vllm_overlay.junit import Case, ReportCase

TESTS = """\
import pytest


def test_passes():
    assert True


def test_fails():
    assert 1 == 2, "one is not two"


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1


class TestGroup:
    def test_method(self):
        pass


@pytest.fixture
def broken():
    yield
    raise RuntimeError("teardown broke")


def test_teardown_error(broken):
    pass
"""


def test_read_cases_of_a_real_pytest_run(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "test_mix.py").write_text(TESTS)
    (tmp_path / "pkg" / "test_broken.py").write_text("import no_such_module_here\n")
    report = tmp_path / "out.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "junit_family=xunit1",
            "--continue-on-collection-errors",
            f"--junitxml={report}",
            "--rootdir",
            str(tmp_path),
            "pkg",
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    found = junit.read_cases(report)
    assert {i: c.outcome for i, c in found.items()} == {
        "pkg/test_broken.py::<collection>": "error",
        "pkg/test_mix.py::test_passes": "passed",
        "pkg/test_mix.py::test_fails": "failed",
        "pkg/test_mix.py::test_skipped": "skipped",
        "pkg/test_mix.py::test_param[1]": "passed",
        "pkg/test_mix.py::test_param[2]": "failed",
        "pkg/test_mix.py::TestGroup::test_method": "passed",
        "pkg/test_mix.py::test_teardown_error": "error",  # passed in the call, the teardown error wins
    }
    assert found["pkg/test_mix.py::test_fails"].file == "pkg/test_mix.py"
    assert "one is not two" in found["pkg/test_mix.py::test_fails"].message
    assert found["pkg/test_mix.py::test_skipped"].message == "not today"


def _xml(path: Path, *testcases: str) -> Path:
    path.write_text('<?xml version="1.0"?><testsuites><testsuite>' + "".join(testcases) + "</testsuite></testsuites>")
    return path


def test_without_a_file_attribute_the_longest_requested_module_wins(tmp_path: Path) -> None:
    path = _xml(
        tmp_path / "j.xml",
        '<testcase classname="tests.a.test_b.TestC" name="test_x" time="1.5"/>',
        '<testcase classname="other.test_z" name="test_y" time="0"/>',
    )
    found = junit.read_cases(path, ["tests/test_x.py", "tests/a.py", "tests/a/test_b.py::TestC::test_x"])
    assert set(found) == {"tests/a/test_b.py::TestC::test_x", "other/test_z.py::test_y"}
    assert found["tests/a/test_b.py::TestC::test_x"].seconds == 1.5
    assert found["other/test_z.py::test_y"].file == "other/test_z.py"  # nothing requested: the classname's path


def test_a_long_message_is_cut_to_500_characters_and_json_leaves_out_seconds(tmp_path: Path) -> None:
    long = "x" * 900
    path = _xml(
        tmp_path / "j.xml",
        f'<testcase classname="t.test_a" name="test_l" file="t/test_a.py" time="2">'
        f'<failure message="{long}">text</failure></testcase>',
    )
    (case,) = junit.read_cases(path).values()
    assert case.message == "x" * 500
    assert case.to_json() == {
        "id": "t/test_a.py::test_l",
        "file": "t/test_a.py",
        "outcome": "failed",
        "message": long[:500],
    }


def test_a_torn_file_reads_as_no_cases(tmp_path: Path) -> None:
    torn = tmp_path / "torn.xml"
    torn.write_text('<?xml version="1.0"?><testsuites><testsuite><testcase classname="a" name="b"')
    assert junit.read_cases(torn) == {}


def test_write_report_groups_suites_and_counts(tmp_path: Path) -> None:
    cases = [
        ReportCase("demo/a.patch", "red", 1.25),
        ReportCase("demo/a.patch", "green", 0.5, failure="FAILED: 1 test\nt/test_a.py::x failed", output="log tail"),
        ReportCase("demo/a.patch", "upstream-tests", 0.0, skipped="the patch names no Upstream-Tests"),
        ReportCase("full series", "all Tests", 2.0, error="pytest died from signal 9"),
    ]
    path = tmp_path / "deep" / "report.xml"
    path.parent.mkdir()
    junit.write_report(cases, path, name="runner")
    root = ET.parse(path).getroot()
    assert (root.tag, root.get("name"), root.get("tests"), root.get("failures"), root.get("errors")) == (
        "testsuites",
        "runner",
        "4",
        "1",
        "1",
    )
    first, second = root.findall("testsuite")
    assert {k: first.get(k) for k in ("name", "tests", "failures", "errors", "skipped", "time")} == {
        "name": "demo/a.patch",
        "tests": "3",
        "failures": "1",
        "errors": "0",
        "skipped": "1",
        "time": "1.750",
    }
    assert [c.get("name") for c in first] == ["red", "green", "upstream-tests"]
    assert all(c.get("classname") == "demo/a.patch" for c in first)
    green = first[1]
    assert green.find("failure").get("message") == "FAILED: 1 test"  # the first line only
    assert green.find("failure").text == "FAILED: 1 test\nt/test_a.py::x failed"
    assert green.find("system-out").text == "log tail"
    assert first[2].find("skipped").get("message") == "the patch names no Upstream-Tests"
    assert len(first[0]) == 0  # a passing case has no children
    assert second.get("name") == "full series" and second.find("testcase/error").text == "pytest died from signal 9"
    assert list(tmp_path.joinpath("deep").iterdir()) == [path]  # written atomically: no temporary left


def test_a_report_read_back_gives_the_same_outcomes(tmp_path: Path) -> None:
    cases = [
        ReportCase("s", "ok", 0.1),
        ReportCase("s", "bad", 0.1, failure="boom"),
        ReportCase("s", "n", 0, skipped=""),
    ]
    junit.write_report(cases, tmp_path / "r.xml")
    back = junit.read_cases(tmp_path / "r.xml", ["s.py"])
    assert {c.id: c.outcome for c in back.values()} == {
        "s.py::ok": "passed",
        "s.py::bad": "failed",
        "s.py::n": "skipped",
    }
    assert ET.parse(tmp_path / "r.xml").getroot().get("name") == "test-patches"


def test_worst_outcome_wins_by_severity() -> None:
    assert sorted(junit.SEVERITY, key=junit.SEVERITY.get) == ["passed", "skipped", "failed", "timeout", "error"]
    assert Case("a", "a", "passed").to_json()["message"] == ""


XUNIT1 = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="" name="tests.patches.s.test_b" file="tests/patches/s/test_b.py" time="0.0">
  <error message="collection failure">ImportError</error></testcase>
<testcase classname="tests.patches.s.test_a.TestC" name="test_x" file="tests/patches/s/test_a.py" time="0.01">
  <failure message="assert 0">boom</failure></testcase>
<testcase classname="tests.patches.s.test_a" name="test_ok" file="tests/patches/s/test_a.py" time="0.0"/>
<testcase classname="tests.patches.s.test_a" name="test_p[1]" file="tests/patches/s/test_a.py" time="0.0">
  <skipped type="pytest.skip" message="no">skip</skipped></testcase>
<testcase classname="tests.patches.s.test_a" name="test_slow" file="tests/patches/s/test_a.py" time="2.0">
  <failure message="Failed: Timeout (&gt;2.0s) from pytest-timeout.">t</failure></testcase>
<testcase classname="tests.patches.s.test_a" name="test_ok" file="tests/patches/s/test_a.py" time="0.0">
  <error message="failed on teardown">x</error></testcase>
<testcase classname="tests.v1.test_u" name="test_old_style" time="0.0"/>
</testsuite></testsuites>
"""


def test_read_cases_ids_outcomes_and_worst_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "j.xml"
    path.write_text(XUNIT1)
    found = junit.read_cases(path, ["tests/v1/test_u.py"])
    outcomes = {i: c.outcome for i, c in found.items()}
    assert outcomes == {
        "tests/patches/s/test_b.py::<collection>": "error",
        "tests/patches/s/test_a.py::TestC::test_x": "failed",
        "tests/patches/s/test_a.py::test_ok": "error",  # teardown error outranks the pass
        "tests/patches/s/test_a.py::test_p[1]": "skipped",
        "tests/patches/s/test_a.py::test_slow": "timeout",
        "tests/v1/test_u.py::test_old_style": "passed",  # no file attribute: derived from classname
    }
    assert junit.read_cases(tmp_path / "absent.xml") == {}
