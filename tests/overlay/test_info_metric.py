"""vllm_overlay_info on vLLM's real /metrics app, for one API server and for several.

Runs in the vLLM test environment (it imports vLLM 0.33.0's metrics router and FastAPI's test
client). Each scenario runs in a fresh interpreter: prometheus_client decides at import whether
it writes to PROMETHEUS_MULTIPROC_DIR, exactly as in vLLM's own API-server processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERLAY = REPO_ROOT / "overlay"

pytest.importorskip("vllm", reason="runs in the vLLM test environment (scripts/check runs it there)")


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    """A manifest for the installed (pristine) vllm: the real series names, no replaced files."""
    from importlib.metadata import version

    series: dict[str, list[dict]] = {}
    for line in (REPO_ROOT / "patches" / "series").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            series.setdefault(line.split("/", 1)[0], []).append({"name": line, "sha256": "0" * 64, "subject": ""})
    data = {
        "format": 1,
        "upstream": {"project": "vllm", "version": version("vllm"), "commit": "g4ba787ec9"},
        "series_sha256": "ab" * 32,
        "series": [
            {"name": name, "layer": f"{n:02d}-{name}", "patches": patches, "files": []}
            for n, (name, patches) in enumerate(series.items(), start=1)
        ],
        "files": {},
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def _python(code: str, manifest: Path, **env: str) -> str:
    full_env = {**os.environ, "VLLM_OVERLAY_MANIFEST": str(manifest), "PYTHONPATH": str(OVERLAY), **env}
    done = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


SCRAPE = """
from fastapi import FastAPI
from fastapi.testclient import TestClient
from vllm.entrypoints.serve.instrumentator.metrics import attach_router
{publish}
app = FastAPI()
attach_router(app)
response = TestClient(app).get("/metrics")
assert response.status_code == 200, response.status_code
print("\\n".join(line for line in response.text.splitlines() if "vllm_overlay_info" in line))
"""
PUBLISH = "from vllm_overlay_status.plugin import register; register()"


def _samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vllm_overlay_info{")]


def test_single_api_server_metrics_show_the_series(manifest):
    text = _python(SCRAPE.format(publish=PUBLISH), manifest)
    assert "# TYPE vllm_overlay_info gauge" in text
    (sample,) = _samples(text)
    names = [line.split("#", 1)[0].strip() for line in (REPO_ROOT / "patches/series").read_text().splitlines()]
    expected = ",".join(name.removesuffix(".patch") for name in names if name)
    assert f'patches="{expected}"' in sample
    assert 'upstream_version="0.33.0"' in sample and 'upstream_commit="g4ba787ec9"' in sample
    assert f'series_sha256="{"ab" * 32}"' in sample and sample.endswith(" 1.0")


def test_several_api_servers_merge_into_one_sample(manifest, tmp_path):
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    # Two API-server processes publish (each writes its own value file), a third serves /metrics.
    for _ in range(2):
        _python(PUBLISH, manifest, PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    assert len(list(multiproc.glob("gauge_livemax_*.db"))) == 2
    text = _python(SCRAPE.format(publish=""), manifest, PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    (sample,) = _samples(text)  # merged: one sample, not one per process
    assert 'upstream_version="0.33.0"' in sample and sample.endswith(" 1.0")
