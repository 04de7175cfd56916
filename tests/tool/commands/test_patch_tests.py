"""test-patches' command module: its flags, their translation into one run_patch_tests call, its reports.

run_patch_tests builds a ~10 GB test environment and runs pytest per patch: the tests stand in for
that one call alone, at the attribute the command looks it up by (``from vllm_overlay import
testrun`` inside run, then ``testrun.run_patch_tests``), so nothing is installed or tested.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import cli, testrun
from vllm_overlay.project import Project
from vllm_overlay.upstream import indexes

OPTIONS = (
    "--project",
    "--index-url",
    "--only",
    "--upstream",
    "--keep-going",
    "--env",
    "--json",
    "--junit",
    "--jobs",
    "--timeout",
    "--run-timeout",
    "--no-tool-tests",
    "--no-cache",
    "--deep",
    "--workdir",
)


class Calls(list):
    result = testrun.PatchTestResult(0, testrun.RunReport([]))


@pytest.fixture
def calls(monkeypatch):
    """run_patch_tests replaced by a recorder returning ``calls.result``."""
    recorded = Calls()

    def fake_run_patch_tests(proj, options):
        recorded.append((proj, options))
        recorded.indexes = indexes.configured()  # what the run reads
        return recorded.result

    monkeypatch.setattr(testrun, "run_patch_tests", fake_run_patch_tests)
    return recorded


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("test-patches", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "Exit codes: 0 every check passed" in text
    flat = " ".join(text.split())  # argparse wraps the help lines
    assert "(pytest-timeout; default 300)" in flat and "one pytest process (default 3600)" in flat


@pytest.mark.parametrize("flag", ["--jobs", "--timeout", "--run-timeout"])
def test_a_count_that_is_not_a_number_is_refused_by_the_parser(calls, capsys, flag):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["test-patches", flag, "many"])
    assert exit_info.value.code == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err
    assert calls == []


def test_defaults_are_the_library_defaults(project, calls):
    assert cli.main(["test-patches", "--project", str(project)]) == 0
    assert calls == [(Project(project.resolve()), testrun.PatchTestOptions())]


def test_every_flag_reaches_the_options(project, calls, tmp_path):
    argv = ["test-patches", "--project", str(project), "--only", "demo", "--only", "demo/a.patch"]
    argv += ["--upstream", "0.33.1", "--keep-going", "--env", str(tmp_path / "venv"), "-j", "3"]
    argv += ["--timeout", "7", "--run-timeout", "70", "--no-tool-tests", "--no-cache"]
    argv += ["--workdir", str(tmp_path / "work"), "--index-url", "file:///srv/index/", "--deep"]
    assert cli.main(argv) == 0
    [(_, options)] = calls
    assert options == testrun.PatchTestOptions(
        only=["demo", "demo/a.patch"],
        upstream="0.33.1",
        keep_going=True,
        env=tmp_path / "venv",
        jobs=3,
        timeout=7,
        run_timeout=70,
        tool_tests=False,
        use_cache=False,
        workdir=tmp_path / "work",
        deep=True,
    )
    assert calls.indexes == ["file:///srv/index"]  # --index-url is the index the run reads
    assert indexes.configured() != ["file:///srv/index"]  # and only that run's: the process's next run reads pip's


@pytest.mark.parametrize("code", [0, 1])
def test_the_reports_are_written_from_the_result_and_its_code_returned(project, calls, tmp_path, capsys, code):
    calls.result = testrun.PatchTestResult(code, testrun.RunReport([]), [("demo/a.patch", "does not apply")])
    json_path, junit_path = tmp_path / "out" / "r.json", tmp_path / "out" / "r.xml"
    argv = ["test-patches", "--project", str(project), "--json", str(json_path), "--junit", str(junit_path)]
    assert cli.main(argv) == code
    assert json.loads(json_path.read_text()) == calls.result.to_json()
    assert json.loads(json_path.read_text())["apply_failures"] == [
        {"patch": "demo/a.patch", "detail": "does not apply"}
    ]
    cases = ElementTree.parse(junit_path).getroot().iter("testcase")
    assert ("apply", "demo/a.patch") in {(case.get("classname"), case.get("name")) for case in cases}
    err = capsys.readouterr().err
    assert f"JSON report: {json_path}" in err and f"JUnit report: {junit_path}" in err


@pytest.mark.parametrize("code", [2, 130])
def test_a_run_stopped_before_a_report_writes_none(project, calls, tmp_path, code):
    calls.result = testrun.PatchTestResult(code)
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    argv = ["test-patches", "--project", str(project), "--json", str(json_path), "--junit", str(junit_path)]
    assert cli.main(argv) == code
    assert not json_path.exists() and not junit_path.exists()


def test_without_report_flags_nothing_is_written(project, calls, tmp_path, capsys):
    before = sorted(p.name for p in Path(project).iterdir())
    assert cli.main(["test-patches", "--project", str(project)]) == 0
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in Path(project).iterdir()) == before


@pytest.mark.parametrize("flag", ["--jobs", "--timeout", "--run-timeout"])
def test_a_count_below_one_is_exit_2_in_one_line(project, store_env, capsys, flag):
    """The real run_patch_tests: it refuses the count before any environment or tree is made."""
    assert cli.main(["test-patches", "--project", str(project), flag, "0"]) == 2
    assert capsys.readouterr().err == "error: --jobs, --timeout and --run-timeout must be positive\n"
    assert not store_env.exists()
    assert not (project / "build").exists()


def test_an_interrupt_is_exit_130_in_one_line(project, store_env, capsys, monkeypatch):
    """The real run_patch_tests: Ctrl-C (or SIGTERM) in the session ends through cli.main's one branch."""
    from vllm_overlay.testrun import session

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "_session", interrupted)
    assert cli.main(["test-patches", "--project", str(project)]) == 130
    assert capsys.readouterr() == ("", "error: interrupted; the shared test environment was not modified\n")


def test_a_project_without_a_lock_is_exit_2_in_one_line(tmp_path, store_env, capsys):
    assert cli.main(["test-patches", "--project", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"
