"""The scenarios' checks that need no server: the plugin line per process, worker pids, the info metric's line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from vllm_overlay.e2e import scenarios

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
