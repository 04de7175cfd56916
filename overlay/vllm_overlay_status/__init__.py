"""Provenance of a patched vLLM installation: which patches it carries and whether its files say so.

Shipped beside the vllm package in the overlay image (never inside it). ``manifest.json`` next to
this file is written by ``scripts/build-image`` when it stages the image: the upstream release, the
applied patches (name, series, sha256 of each patch file) and every file the series ship (path and
sha256). ``python -m vllm_overlay_status status`` prints it; ``verify`` proves an installation
matches it; :mod:`vllm_overlay_status.plugin` checks the running files in every vLLM process.

Standard library only, and no import of vllm or torch: this must work in a broken image too.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

__version__ = "0.1.0"

MANIFEST_NAME = "manifest.json"
# The CycloneDX SBOM build-image writes beside the manifest (vllm_overlay.image.sbom makes it).
SBOM_NAME = "sbom.cdx.json"
MANIFEST_FORMAT = 1
# Points at another manifest (e.g. to check a site-packages against a manifest kept elsewhere).
MANIFEST_ENV = "VLLM_OVERLAY_MANIFEST"


class ManifestError(RuntimeError):
    """The manifest is missing or unreadable."""


def manifest_path() -> Path:
    override = os.environ.get(MANIFEST_ENV)
    return Path(override) if override else Path(__file__).resolve().parent / MANIFEST_NAME


def load_manifest(path: Path | str | None = None) -> dict:
    """The manifest as a dict (see the module docstring); raises ManifestError with the reason."""
    path = Path(path) if path is not None else manifest_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: no manifest (was this package staged by scripts/build-image?)") from exc
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: not a format-{MANIFEST_FORMAT} overlay manifest")
    return data


def vllm_site_packages() -> Path | None:
    """The directory that holds the ``vllm`` package this interpreter imports, found without importing it."""
    import sys

    module = sys.modules.get("vllm")
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec("vllm")
        origin = spec.origin if spec is not None else None
    if not origin:
        return None
    return Path(origin).resolve().parent.parent
