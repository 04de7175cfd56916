"""Tool-side entry to the verify that runs inside the image: same code, any site-packages.

The checks live in overlay/vllm_overlay_status/checks.py (they ship in the image); this module
imports that package from the project's overlay/ directory, where its RECORD checks fall back to
:mod:`vllm_overlay.env.record` (the image carries a staged copy of it). One source for both sides.
Tool-side, the expectation is the locked wheel's RECORD read by the tool itself
(:mod:`vllm_overlay.env.wheel_record`), not the copy the checked site-packages carries.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from vllm_overlay.upstream.lock import Lock

STATUS_PACKAGE = "vllm_overlay_status"


def status_package(overlay_dir: Path) -> ModuleType:
    """Import ``vllm_overlay_status`` from ``overlay_dir`` (not from wherever sys.path would find one)."""
    loaded = sys.modules.get(STATUS_PACKAGE)
    init = (overlay_dir / STATUS_PACKAGE / "__init__.py").resolve()
    if loaded is not None and Path(loaded.__file__ or "").resolve() == init:
        return loaded
    spec = importlib.util.spec_from_file_location(STATUS_PACKAGE, init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {STATUS_PACKAGE} from {overlay_dir}")
    for name in [n for n in sys.modules if n == STATUS_PACKAGE or n.startswith(STATUS_PACKAGE + ".")]:
        del sys.modules[name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[STATUS_PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def pristine_manifest(lock: Lock) -> dict:
    """What an installation with no patches must be: the locked release, exactly as its wheel's RECORD says."""
    return {
        "format": 1,
        "upstream": {"project": lock.project, "version": lock.version, "commit": lock.commit},
        "series_sha256": "",
        "series": [],
        "files": {},
        "overlay_files": {},
        "unshipped": [],
    }


def choose_manifest(site_packages: Path, manifest: Path | None, lock: Lock) -> tuple[dict, str]:
    """The manifest to verify against and where it came from."""
    if manifest is not None:
        return json.loads(manifest.read_text(encoding="utf-8")), str(manifest)
    installed = site_packages / STATUS_PACKAGE / "manifest.json"
    if installed.is_file():
        return json.loads(installed.read_text(encoding="utf-8")), str(installed)
    return pristine_manifest(lock), f"none found: expecting pristine vllm {lock.version}"


def verify_site_packages(site_packages: Path, manifest: dict, overlay_dir: Path, expected: str) -> list[str]:
    """Every difference from the wheel's RECORD ``expected`` and the manifest (empty: verified).

    Never imports vllm or torch.
    """
    status_package(overlay_dir)
    checks = importlib.import_module(f"{STATUS_PACKAGE}.checks")
    return checks.verify(site_packages, manifest, expected=expected)
