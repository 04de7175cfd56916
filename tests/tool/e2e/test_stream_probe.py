"""e2e.stream_probe: only its command line; the probe itself starts vLLM's engine and runs in the CPU runtime."""

from __future__ import annotations

import subprocess
import sys

from tests.tool.helpers.repos import REPO_ROOT

PROBE = "vllm_overlay.e2e.stream_probe"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", PROBE, *args], capture_output=True, text=True, cwd=REPO_ROOT)


def test_help_needs_neither_vllm_nor_httpx() -> None:
    done = _run("--help")
    assert done.returncode == 0
    assert "positional arguments:\n  model\n" in done.stdout
    assert "--idle IDLE" in done.stdout and "streaming-input session" in done.stdout


def test_importing_the_module_imports_nothing_of_the_runtime() -> None:
    code = f"import sys, {PROBE}\nprint(sorted(m for m in ('vllm', 'httpx', 'fastapi', 'torch') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_a_bad_idle_is_a_usage_error_before_anything_starts() -> None:
    done = _run("/models/tiny", "--idle", "soon")
    assert done.returncode == 2
    assert "argument --idle: invalid float value: 'soon'" in done.stderr
    assert "Traceback" not in done.stderr
