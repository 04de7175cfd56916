# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The verdict store serves only what it wrote, under the key it was written for, and keys on the machine."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tool.helpers.patch_tests import RED_GREEN_TEST, add_line_41, add_patch, fix_line_one, run_cli
from vllm_overlay import testrun
from vllm_overlay.store import Store
from vllm_overlay.testrun.execute import Config
from vllm_overlay.testrun.plan import Planner
from vllm_overlay.testrun.verdict_store import VerdictStore
from vllm_overlay.testrun.verdict_store import test_inputs as inputs_of
from vllm_overlay.testrun.verdict_store import tests_digest as digest_of
from vllm_overlay.testrun.verdicts import Case, Result

FAILED = Result(1, False, {"t.py::test_a": Case("t.py::test_a", "t.py", "failed")})


def _store() -> VerdictStore:
    return VerdictStore(Store(), "scope-r3")


def test_an_edited_verdict_is_ignored_and_named(store_env, capsys):
    verdicts = _store()
    key = verdicts.key("what", 1)
    assert verdicts.save(key, FAILED, {"kind": "tests"})
    assert verdicts.load(key).exit_code == 1
    path = verdicts.path(key)
    data = json.loads(path.read_text())
    data["result"]["exit_code"] = 0
    data["result"]["cases"] = [["t.py::test_a", "t.py", "passed"]]
    path.write_text(json.dumps(data))
    assert verdicts.load(key) is None
    assert "this cache's store did not write it" in capsys.readouterr().err


def test_a_verdict_forged_from_scratch_is_ignored(store_env, capsys):
    verdicts = _store()
    key = verdicts.key("what", 2)
    path = verdicts.path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": key, "what": {}, "result": {"exit_code": 0, "timed_out": False, "cases": []}}))
    assert verdicts.load(key) is None
    assert "did not write it" in capsys.readouterr().err


def test_a_verdict_of_another_cache_is_ignored(store_env, tmp_path, monkeypatch, capsys):
    verdicts = _store()
    key = verdicts.key("what", 3)
    verdicts.save(key, FAILED, {})
    copied = verdicts.path(key).read_bytes()
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(tmp_path / "other-cache"))
    other = _store()
    other.path(key).parent.mkdir(parents=True)
    other.path(key).write_bytes(copied)
    assert other.load(key) is None
    assert "did not write it" in capsys.readouterr().err


def test_a_verdict_under_another_keys_name_is_ignored_and_says_which(store_env, capsys):
    verdicts = _store()
    key, other = verdicts.key("what", 4), verdicts.key("what", 5)
    verdicts.save(key, FAILED, {})
    verdicts.path(other).parent.mkdir(parents=True, exist_ok=True)
    verdicts.path(other).write_bytes(verdicts.path(key).read_bytes())
    assert verdicts.load(other) is None
    assert f"it answers key '{key}', not {other}" in capsys.readouterr().err


class _Trees:
    def tree_id(self, step: int) -> str:
        return "0" * 40


def _tests_key(tmp_path: Path, python: Path) -> str:
    planner = Planner(
        project_root=tmp_path,
        workdir=tmp_path,
        trees=_Trees(),  # type: ignore[arg-type]
        patches=[],
        selected=[],
        python=python,
        tool_python=python,
        verdicts=_store(),
        config=Config(),
    )
    return planner.unit("tests", 0, ["tests/x.py"]).key


def test_what_the_machine_has_installed_is_in_the_key(store_env, tmp_path, monkeypatch):
    """The same tree and tests with another package installed (or the tool not installed) is another key."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    before = _tests_key(tmp_path, python)
    assert _tests_key(tmp_path, python) == before  # stable
    (site / "vllm_overlay-0.1.dist-info").mkdir()
    installed = _tests_key(tmp_path, python)
    assert installed != before
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert _tests_key(tmp_path, python) != installed


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
    from vllm_overlay import cache
    from vllm_overlay.store import Store
    from vllm_overlay.testrun import verdict_store
    from vllm_overlay.upstream import lock

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
