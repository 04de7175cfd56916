"""The per-patch runner without vLLM: verdicts, junit parsing, shadows, and a whole run on a fake vllm."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.tool.helpers import PatchMaker, replace_line, write_upstream
from vllm_overlay import cli, junit, record, testenv, testrun
from vllm_overlay.junit import Case
from vllm_overlay.testrun.verdict_store import test_inputs as inputs_of
from vllm_overlay.testrun.verdict_store import tests_digest as digest_of

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


def case(test_id: str, outcome: str) -> Case:
    return Case(test_id, test_id.split("::", 1)[0], outcome)


def cases(*pairs: tuple[str, str]) -> dict[str, Case]:
    return {i: case(i, o) for i, o in pairs}


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


# ---------------------------------------------------------------------------------------------
# A whole run: fake upstream, fake installed vllm (with RECORD), real pytest processes.
# ---------------------------------------------------------------------------------------------

UPSTREAM_TEST = """\
from vllm.core import line_2


def test_line_two():
    assert line_2 == 2


def test_always():
    pass
"""
RED_GREEN_TEST = """\
from vllm.core import line_1


def test_line_one_is_fixed():
    assert line_1 == 100
"""


def fake_env(root: Path, upstream: Path, version: str) -> Path:
    """A venv seeing this interpreter's site-packages (pytest), holding a fake vllm with a RECORD.

    Through a .pth file, not --system-site-packages: when the tests run in a virtual environment
    (scripts/check runs them in .venv), the system site-packages are the base interpreter's, which
    need not have pytest (Debian's python3 has none).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(
        subprocess.run(
            [str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    paths = sysconfig.get_paths()
    (site / "running-interpreter.pth").write_text(f"{paths['purelib']}\n{paths['platlib']}\n")
    shutil.copytree(upstream / "vllm", site / "vllm")
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    lines = [
        f"{p.relative_to(site).as_posix()},{record.record_hash(hashlib.sha256(p.read_bytes()).hexdigest())},"
        f"{p.stat().st_size}"
        for p in sorted((site / "vllm").rglob("*"))
        if p.is_file()
    ]
    (info / "RECORD").write_text("\n".join([*lines, f"{info.name}/RECORD,,"]) + "\n")
    return root


@pytest.fixture
def fake_project(tmp_path: Path, store_env: Path, project: Path, make_patch: PatchMaker, monkeypatch) -> dict:
    pytest.importorskip("pytest_timeout")
    monkeypatch.setattr(testenv, "REQUIRED_MODULES", ("pytest", "pytest_timeout"))
    upstream = write_upstream(
        tmp_path / "upstream",
        extra={"tests/__init__.py": "", "tests/test_core_upstream.py": UPSTREAM_TEST, "pyproject.toml": ""},
    )
    version = json.loads(json.dumps(__import__("tomllib").loads((project / "upstream.lock").read_text())))
    env = fake_env(tmp_path / "venv", upstream, version["upstream"]["version"])
    return {"upstream": upstream, "env": env, "project": project, "make_patch": make_patch}


def add_patch(fx: dict, subject: str, series: str, edit, test_text: str, upstream_tests: str) -> None:
    path = fx["make_patch"](fx["upstream"], edit, subject, series)
    text = path.read_text().replace("Upstream-Tests: tests/test_demo_upstream.py", f"Upstream-Tests: {upstream_tests}")
    path.write_text(text)
    (fx["project"] / "tests" / "patches" / series / "test_demo.py").write_text(test_text)


def run_cli(fx: dict, tmp_path: Path, *extra: str, tool_tests: bool = False) -> tuple[int, dict, ET.Element]:
    json_out, junit_out = tmp_path / "report.json", tmp_path / "report.xml"
    code = cli.main(
        ["test-patches", "--project", str(fx["project"]), "--upstream", str(fx["upstream"]),
         "--env", str(fx["env"]), "--json", str(json_out), "--junit", str(junit_out),
         *([] if tool_tests else ["--no-tool-tests"]), "--jobs", "2", *extra]
    )  # fmt: skip
    return code, json.loads(json_out.read_text()), ET.parse(junit_out).getroot()


def fix_line_one(root: Path) -> None:
    replace_line(root / "vllm" / "core.py", "line_1 = 1\n", "line_1 = 100\n")


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
    assert record.verify_distribution(Path(data["environment"]["site_packages"]), "vllm") == []
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


def test_env_key_follows_lock_and_pins(tmp_path: Path) -> None:
    from vllm_overlay import lock

    lock_path = tmp_path / "upstream.lock"
    shutil.copy(Path(__file__).resolve().parents[2] / "upstream.lock", lock_path)
    the_lock = lock.load(lock_path)
    reqs = testenv.requirements(the_lock)
    assert reqs[0] == f"vllm=={the_lock.version}" and any(r.startswith("pytest-timeout") for r in reqs)
    key = testenv.env_key(the_lock, reqs)
    assert key == testenv.env_key(the_lock, list(reqs))
    assert key != testenv.env_key(the_lock, [*reqs, "extra==1"])
    lock_path.write_text(lock_path.read_text() + "\n# changed\n")
    assert key != testenv.env_key(lock.load(lock_path), reqs)


def add_line_41(root: Path) -> None:
    replace_line(root / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 20  # twenty\nline_41 = 41\n")


LINE_41_TEST = "from vllm import core\n\n\ndef test_line_41():\n    assert getattr(core, 'line_41', 0) == 41\n"


def test_verdict_store_reruns_only_what_changed(fake_project: dict, tmp_path: Path, monkeypatch, capsys) -> None:
    """Unchanged: no pytest at all; a changed Tests file or patch: the patches whose inputs changed."""
    add_patch(fake_project, "Fix line one", "alpha", fix_line_one, RED_GREEN_TEST, "tests/test_core_upstream.py")
    add_patch(fake_project, "Add line 41", "beta", add_line_41, LINE_41_TEST, "none")
    # A basename of its own: test files of one basename cannot share a process (nor the full-series run).
    beta_patch = fake_project["project"] / "patches" / "beta" / "add-line-41.patch"
    beta_patch.write_text(beta_patch.read_text().replace("beta/test_demo.py", "beta/test_line_41.py"))
    beta_test = fake_project["project"] / "tests" / "patches" / "beta" / "test_line_41.py"
    (beta_test.parent / "test_demo.py").rename(beta_test)
    tool_dir = fake_project["project"] / "tests" / "tool"
    tool_dir.mkdir()
    (tool_dir / "test_tiny.py").write_text("def test_tiny():\n    assert 1 + 1 == 2\n")
    code, data, _ = run_cli(fake_project, tmp_path, tool_tests=True)
    assert code == 0, capsys.readouterr().err
    assert [p["cached"] for p in data["patches"]] == [False, False] and data["pytest_processes"] >= 5
    # Patch 2's red and patch 1's green test the same tree: one process for both.
    shared = [r for r in data["patches"][0]["runs"] if r in data["patches"][1]["runs"]]
    assert len(shared) == 1 and shared[0]["step"] == 1 and len(shared[0]["targets"]) == 2

    def no_pytest(self, job):
        raise AssertionError(f"pytest started for {job.targets}")

    with monkeypatch.context() as patched:
        patched.setattr(testrun.Executor, "run", no_pytest)
        code, data, xml_root = run_cli(fake_project, tmp_path, tool_tests=True)
    out = capsys.readouterr()
    assert code == 0 and data["pytest_processes"] == 0, out.err
    assert all(p["cached"] and p["ok"] and p["runs"] == [] for p in data["patches"])
    assert data["full_series"]["cached"] and data["tool_tests"]["cached"] and data["tool_tests"]["ok"]
    assert data["patches"][0]["upstream_regressions"] == [] and data["patches"][0]["upstream_before"]["passed"] == 2
    assert "RESULT: ok" in out.out and "yes" in out.out and xml_root.get("failures") == "0"

    # One patch's Tests file changes: that patch (and the full-series run) runs again, nothing else.
    beta_test.write_text(LINE_41_TEST + "\n\ndef test_core_has_line_1():\n    assert core.line_1 == 100\n")
    code, data, _ = run_cli(fake_project, tmp_path, tool_tests=True)
    assert code == 0
    assert [p["cached"] for p in data["patches"]] == [True, False]
    assert {r["kind"] for r in data["patches"][1]["runs"]} == {"tests"}
    assert not data["full_series"]["cached"] and data["tool_tests"]["cached"]

    # Patch 2 changes (its tree, not only its text): patch 1 tests the same trees and stays cached.
    text = beta_patch.read_text()
    beta_patch.write_text(text.replace("+line_20 = 20  # twenty\n", "+line_20 = 20  # the twentieth\n"))
    code, data, _ = run_cli(fake_project, tmp_path, tool_tests=True)
    assert code == 0, capsys.readouterr().err
    assert [p["cached"] for p in data["patches"]] == [True, False]
    assert [r["step"] for r in data["patches"][1]["runs"]] == [2]  # red on patch 1's tree: still stored
    # Patch 1 changes: its green tree and patch 2's red tree change, so both run again.
    alpha_patch = fake_project["project"] / "patches" / "alpha" / "fix-line-one.patch"
    alpha_patch.write_text(alpha_patch.read_text().replace("+line_1 = 100\n", "+line_1 = 100  # fixed\n"))
    code, data, _ = run_cli(fake_project, tmp_path, tool_tests=True)
    assert code == 0, capsys.readouterr().err
    assert [p["cached"] for p in data["patches"]] == [False, False] and data["patches"][0]["upstream_baseline_cached"]


def test_prune_removes_other_verdict_scopes(project, store_env) -> None:
    from vllm_overlay import cache, lock
    from vllm_overlay.store import Store
    from vllm_overlay.testrun import verdict_store

    the_lock = lock.load(project / "upstream.lock")
    store = Store()
    current = store.root / "verdicts" / verdict_store.scope_name(cache.current_key(the_lock), Path("x"))
    stale = store.root / "verdicts" / "0123456789abcdef01234567-r1"
    for scope in (current, stale):
        (scope / "ab").mkdir(parents=True)
        (scope / "ab" / "abc.json").write_text("{}")
    (store.root / "baselines").mkdir()  # the store's predecessor
    removed = {e.path for e in cache.prune(store, the_lock)}
    assert removed == {stale, store.root / "baselines"}
    assert current.exists() and not stale.exists()


def test_a_helper_imported_from_a_sibling_folder_is_in_the_key(tmp_path: Path) -> None:
    """A stale pass must not be reused after a helper the test imports (from another folder) changed."""
    root = tmp_path / "project"
    alpha, beta, gamma = (root / "tests" / "patches" / name for name in ("alpha", "beta", "gamma"))
    for folder in (alpha, beta, gamma):
        folder.mkdir(parents=True)
    spec = "tests/patches/alpha/test_uses_helper.py"
    (root / spec).write_text("import sys\nimport beta_harness\n\n\ndef test_x():\n    assert beta_harness.VALUE\n")
    (beta / "beta_harness.py").write_text("from gamma_deep import VALUE\n")
    (gamma / "gamma_deep.py").write_text("VALUE = 1\n")
    (gamma / "unrelated.py").write_text("OTHER = 1\n")
    inputs = inputs_of(root, spec)
    assert "tests/patches/beta/beta_harness.py" in inputs and "tests/patches/gamma/gamma_deep.py" in inputs
    assert "tests/patches/gamma/unrelated.py" not in inputs
    before = digest_of(root, [spec])
    (gamma / "unrelated.py").write_text("OTHER = 2\n")
    assert digest_of(root, [spec]) == before  # what the test cannot import does not decide its verdict
    (gamma / "gamma_deep.py").write_text("VALUE = 0\n")
    assert digest_of(root, [spec]) != before
