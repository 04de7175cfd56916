"""A whole test-patches session on fake patches over a fake vllm: red -> green proven, failures named, usage errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.tool.helpers.patch_tests import RED_GREEN_TEST, add_patch, fix_line_one, run_cli
from tests.tool.helpers.repos import replace_line
from vllm_overlay import cli
from vllm_overlay.env import record


def test_whole_run_proves_red_green_and_upstream(fake_project: dict, tmp_path: Path, capsys) -> None:
    add_patch(fake_project, "Fix line one", "alpha", fix_line_one, RED_GREEN_TEST, "tests/test_core_upstream.py")
    code, data, xml_root = run_cli(fake_project, tmp_path)
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    (patch,) = data["patches"]
    assert patch["red"]["ok"] and patch["green"]["ok"] and patch["upstream"]["ok"], patch
    assert patch["upstream_before"]["passed"] == 2 and patch["upstream_regressions"] == []
    assert data["full_series"]["ok"]
    assert "RESULT: ok" in out.out and "alpha/fix-line-one.patch" in out.out
    assert "red" in out.err and "green" in out.err  # progress lines
    assert xml_root.get("failures") == "0" and int(xml_root.get("tests")) >= 4
    # The shared environment was not modified, and a second run reuses the cached baseline.
    site = Path(data["environment"]["site_packages"])
    wheel = (fake_project["env"] / "wheel-RECORD").read_text()  # the fake wheel's, kept by the fixture
    assert record.verify_distribution(site, "vllm", expected=wheel) == []
    code, data, _ = run_cli(fake_project, tmp_path, "--no-cache")
    assert code == 0 and not data["patches"][0]["cached"] and data["pytest_processes"] == 5
    assert not (fake_project["project"] / "build" / "patched").exists()  # apply-patches' tree untouched


def test_failing_patches_are_named_and_fail_the_run(fake_project: dict, tmp_path: Path, capsys) -> None:
    def no_fix(root: Path) -> None:  # the "fix" leaves line_1 alone: the test stays red
        replace_line(root / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 30  # touched\n")

    def break_upstream(root: Path) -> None:
        replace_line(root / "vllm" / "core.py", "line_2 = 2\n", "line_2 = -2\n")

    add_patch(fake_project, "Claims a fix", "alpha", no_fix, RED_GREEN_TEST, "tests/test_core_upstream.py")
    add_patch(fake_project, "Breaks upstream", "beta", break_upstream,
              "from vllm.core import line_2\n\ndef test_neg():\n    assert line_2 == -2\n",
              "tests/test_core_upstream.py")  # fmt: skip
    code, data, xml_root = run_cli(fake_project, tmp_path, "--keep-going")
    out = capsys.readouterr().out
    assert code == 1
    alpha, beta = data["patches"]
    assert alpha["red"]["ok"] and alpha["green"]["status"] == "FAILED"
    assert beta["red"]["ok"] and beta["green"]["ok"] and beta["upstream"]["status"] == "REGRESSED"
    assert beta["upstream_regressions"] == [
        {"id": "tests/test_core_upstream.py::test_line_two", "before": "passed", "after": "failed"}
    ]
    assert "RESULT: FAILED: alpha/claims-a-fix.patch" in out
    assert int(xml_root.get("failures")) >= 2
    # --only tests one patch, with the patches before it applied as its prefix.
    code, data, _ = run_cli(fake_project, tmp_path, "--only", "beta")
    assert code == 1 and [p["name"] for p in data["patches"]] == ["beta/breaks-upstream.patch"]
    assert data["applied"] == ["alpha/claims-a-fix.patch", "beta/breaks-upstream.patch"]


def test_test_that_passes_without_its_patch_is_not_detected(fake_project: dict, tmp_path: Path) -> None:
    add_patch(fake_project, "Fix line one", "alpha", fix_line_one,
              "def test_trivially_true():\n    assert True\n", "none")  # fmt: skip
    code, data, _ = run_cli(fake_project, tmp_path)
    assert code == 1
    assert data["patches"][0]["red"]["status"] == "NOT-DETECTED"
    assert data["patches"][0]["upstream"]["status"] == "n/a"


def test_usage_errors_exit_2(fake_project: dict, tmp_path: Path) -> None:
    add_patch(fake_project, "Fix line one", "alpha", fix_line_one, RED_GREEN_TEST, "none")
    assert cli.main(["test-patches", "--project", str(fake_project["project"]), "--only", "nope"]) == 2
    site = next((fake_project["env"] / "lib").glob("python*/site-packages"))
    (site / "vllm" / "core.py").write_text(textwrap.dedent("line_1 = 100\n"))
    code = cli.main(["test-patches", "--project", str(fake_project["project"]), "--upstream",
                     str(fake_project["upstream"]), "--env", str(fake_project["env"])])  # fmt: skip
    assert code == 2  # a given environment that is not pristine is refused, never rebuilt


def _tool_tests_run(fake_project: dict, tmp_path: Path, capsys, name: str, text: str) -> dict:
    """A project whose tests/tool holds one test file, run by test-patches; its tool-test report."""
    add_patch(fake_project, "Fix line one", "alpha", fix_line_one, RED_GREEN_TEST, "tests/test_core_upstream.py")
    tool_dir = fake_project["project"] / "tests" / "tool"
    tool_dir.mkdir()
    (tool_dir / name).write_text(text)
    code, data, _ = run_cli(fake_project, tmp_path, tool_tests=True)
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    return data["tool_tests"]


def test_tool_tests_run_in_the_tools_interpreter_not_the_vllm_environment(
    fake_project: dict, tmp_path: Path, capsys
) -> None:
    """The tool tests run where vllm is not importable, as scripts/check runs them in .venv. Run in
    the test environment, which held pytest and the tool's modules, 7 of them failed: some assert
    what a machine without vllm does, some lint with ruff, which that environment lacks."""
    # The fake environment sees this interpreter's site-packages too: every module the tool tests need.
    report = _tool_tests_run(
        fake_project,
        tmp_path,
        capsys,
        "test_where.py",
        "import importlib.util\nimport sys\n\n\n"
        "def test_vllm_is_not_importable_here():\n"
        "    assert importlib.util.find_spec('vllm') is None, sys.executable\n",
    )
    assert report["ok"] and not report["cached"], report


def test_tool_tests_see_git_as_the_user_has_it_not_isolated(
    fake_project: dict, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Some tool tests check what the tool does with the user's own git configuration (forward's
    sign-off). Run with test-patches' isolated environment, the identity the isolation injects as
    command-line settings overrode each test's own repository and home: 5 failed on a machine
    with a global git identity, none where there is none."""
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Ada Outside")
    report = _tool_tests_run(
        fake_project,
        tmp_path,
        capsys,
        "test_git_env.py",
        "import os\n\n\n"
        "def test_git_as_the_user_has_it():\n"
        "    assert os.environ.get('GIT_CONFIG_GLOBAL') is None, os.environ.get('GIT_CONFIG_GLOBAL')\n"
        "    assert 'GIT_CONFIG_COUNT' not in os.environ\n"
        "    assert os.environ['GIT_AUTHOR_NAME'] == 'Ada Outside'\n",
    )
    assert report["ok"], report


ORACLE_TEXT = """\
import os

from vllm.core import line_1


def test_oracle_runs_on_the_series_tree_with_its_profile_and_database():
    assert line_1 == {line_1}
    assert os.environ["VLLM_OVERLAY_ORACLE_PROFILE"] == "{profile}"
    assert os.environ["VLLM_OVERLAY_ORACLE_DB"].endswith("/oracle-examples/alpha")
"""


def test_a_series_oracle_runs_after_its_last_patch_and_decides_the_run(
    fake_project: dict, tmp_path: Path, capsys
) -> None:
    add_patch(fake_project, "Fix line one", "alpha", fix_line_one, RED_GREEN_TEST, "none")
    oracle = fake_project["project"] / "tests" / "patches" / "alpha" / "oracle_alpha.py"
    oracle.write_text(ORACLE_TEXT.format(line_1=100, profile="ci"))
    code, data, xml_root = run_cli(fake_project, tmp_path)
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert data["oracles"]["alpha"]["ok"] and not data["oracles"]["alpha"]["cached"]
    assert "oracle of alpha: ok" in out.out
    assert any(case.get("name") == "oracle of alpha" for case in xml_root.iter("testcase"))
    code, data, _ = run_cli(fake_project, tmp_path)  # nothing changed: the verdict store answers
    assert code == 0 and data["oracles"]["alpha"]["cached"]
    code, data, _ = run_cli(fake_project, tmp_path, "--deep")  # another budget: run again, deep
    assert code == 1 and data["oracles"]["alpha"]["status"] == "FAILED"
    oracle.write_text(ORACLE_TEXT.format(line_1=1, profile="ci"))  # an oracle that fails on the series' tree
    code, data, _ = run_cli(fake_project, tmp_path, "--keep-going")
    out = capsys.readouterr().out
    assert code == 1 and data["patches"][0]["ok"] and not data["oracles"]["alpha"]["ok"]
    assert "RESULT: FAILED: oracle of alpha: FAILED" in out
