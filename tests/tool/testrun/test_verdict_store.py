# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The verdict store serves only what it wrote, under the key it was written for, and keys on the machine."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_overlay.store import Store
from vllm_overlay.testrun.execute import Config
from vllm_overlay.testrun.plan import Planner
from vllm_overlay.testrun.verdict_store import VerdictStore
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
