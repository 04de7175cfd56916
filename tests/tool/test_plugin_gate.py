# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The overlay's vLLM plugin fails closed, proven through vLLM's own plugin loader.

The loader is vllm.plugins.load_general_plugins of the locked release, run by the cached test
environment's interpreter (the only place vLLM is installed); without that environment the test is
skipped. vLLM's import costs a few seconds, once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import cache
from vllm_overlay.env import wheel_record
from vllm_overlay.image import build_context
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock

OVERLAY = REPO_ROOT / "overlay"
# vLLM's own loader, twice in one process (one vLLM import): the intact overlay, then the status
# package broken (its modules dropped from sys.modules, vLLM's once-per-process flag reset).
LOADER = """
import sys
import vllm.plugins as plugins
plugins.load_general_plugins()
print("served intact")
init = sys.argv[1]
with open(init, "a") as handle:
    handle.write("\\nraise ImportError('tampered')\\n")
for name in [n for n in sys.modules if n.startswith("vllm_overlay_status")]:
    del sys.modules[name]
plugins.plugins_loaded = False
plugins.load_general_plugins()
print("served broken")
"""


def _test_store() -> Store:
    return Store(Path(os.environ.get("VLLM_OVERLAY_TEST_STORE") or os.path.expanduser("~/.cache/vllm-overlay")))


def _test_env_python() -> Path:
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    python = _test_store().envs / cache.current_key(the_lock) / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no test environment at {python.parent.parent} (scripts/test-patches builds it)")
    return python


def _overlay_site(tmp_path: Path) -> Path:
    """The overlay layer as the image lays it beside vllm: the package, the gate, the dist-info, a manifest
    stating the locked wheel's RECORD (the one the test environment's vllm was proven against) and
    every file of the package, sealed as staging seals it."""
    site = tmp_path / "overlay-site"
    shutil.copytree(OVERLAY, site, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "vllm_overlay" / "env" / "record.py", site / "vllm_overlay_status" / "_record.py")
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    manifest = {"format": 1, "upstream": {"project": "vllm", "version": the_lock.version, "commit": the_lock.commit},
                "series_sha256": "", "series": [], "files": {}, "overlay_files": {}, "unshipped": []}  # fmt: skip
    build_context.seal_status_package(site, manifest, wheel_record.locked(the_lock, _test_store()))
    return site


def _serve(python: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    env.pop("VLLM_PLUGINS", None)
    env.pop("VLLM_OVERLAY_ALLOW_MISMATCH", None)
    init = site / "vllm_overlay_status" / "__init__.py"
    return subprocess.run([str(python), "-c", LOADER, str(init)], env=env, capture_output=True, text=True, timeout=1800)


def test_a_status_package_that_fails_to_import_stops_the_process(tmp_path):
    python = _test_env_python()
    done = _serve(python, _overlay_site(tmp_path))
    assert "served intact" in done.stdout, done.stderr[-2000:]
    assert done.returncode != 0 and "served broken" not in done.stdout
    assert "the status package cannot be imported (ImportError: tampered); refusing to start" in done.stderr


# vLLM's own loader with VLLM_PLUGINS leaving the overlay's plugin out and the status package broken:
# the loader never calls the gate, so the broken package is served. That is the hole the image's
# entrypoint (vllm_overlay_status preflight) closes.
LOADER_EXCLUDED = """
import sys
init = sys.argv[1]
with open(init, "a") as handle:
    handle.write("\\nraise ImportError('tampered')\\n")
import vllm.plugins as plugins
plugins.load_general_plugins()
print("served broken")
"""


def _preflight(python: Path, site: Path, **environ: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", **environ)
    env.pop("VLLM_OVERLAY_ALLOW_MISMATCH", None)
    if "VLLM_PLUGINS" not in environ:
        env.pop("VLLM_PLUGINS", None)
    argv = [str(python), "-m", "vllm_overlay_status", "preflight"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


def test_vllm_skips_the_gate_that_vllm_plugins_leaves_out_and_preflight_refuses_it(tmp_path):
    python = _test_env_python()
    site = _overlay_site(tmp_path)
    clean = _preflight(python, site)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert "preflight: plugin selected and present" in clean.stderr
    refused = _preflight(python, site, VLLM_PLUGINS="some_other_plugin")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "plugins-excluded: VLLM_PLUGINS='some_other_plugin' leaves out vllm_overlay_status" in refused.stderr
    named = _preflight(python, site, VLLM_PLUGINS="some_other_plugin,vllm_overlay_status")
    assert named.returncode == 0, named.stderr[-2000:]
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", VLLM_PLUGINS="some_other_plugin")
    init = site / "vllm_overlay_status" / "__init__.py"
    served = subprocess.run(
        [str(python), "-c", LOADER_EXCLUDED, str(init)], env=env, capture_output=True, text=True, timeout=1800
    )
    assert served.returncode == 0 and "served broken" in served.stdout, served.stderr[-2000:]


def test_preflight_refuses_an_image_whose_entry_point_or_gate_is_gone(tmp_path):
    python = _test_env_python()
    site = _overlay_site(tmp_path)
    (site / "vllm_overlay_status-0.1.0.dist-info" / "entry_points.txt").unlink()
    (site / "vllm_overlay_status_gate.py").unlink()
    done = _preflight(python, site)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "plugin-missing: no vllm.general_plugins entry point named vllm_overlay_status" in done.stderr
    assert "gate-missing: vllm_overlay_status_gate cannot be found" in done.stderr


def test_preflight_refuses_a_changed_file_after_the_plugin_checks(tmp_path):
    python = _test_env_python()
    site = _overlay_site(tmp_path)
    manifest_file = site / "vllm_overlay_status" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["files"] = {"vllm/__init__.py": "0" * 64}  # a replaced file whose content is not this
    manifest_file.write_text(json.dumps(manifest))
    done = _preflight(python, site)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "vllm/__init__.py" in done.stderr and "refusing to start" in done.stderr
