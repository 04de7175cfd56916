"""vLLM general plugin: in every vLLM process, prove the running files are the manifest's; log the active series.

Registered in the ``vllm.general_plugins`` entry-point group (see this distribution's
entry_points.txt). vLLM calls :func:`register` once in each process it starts (API server, engine
core, workers). It hashes only the replaced files (a few milliseconds), logs one line naming the
active series, and raises on any mismatch so a process never serves with files it does not claim.
Once the check passes it publishes the ``vllm_overlay_info`` metric (see :mod:`.metrics`).
``VLLM_OVERLAY_ALLOW_MISMATCH=1`` turns the failure into an error log (for debugging only).
Note that vLLM loads only the plugins ``VLLM_PLUGINS`` names when that variable is set.
"""

from __future__ import annotations

import logging
import os

from . import ManifestError, load_manifest, metrics, vllm_site_packages
from .checks import environment_note, running

ALLOW_ENV = "VLLM_OVERLAY_ALLOW_MISMATCH"
# A child of vLLM's own logger, so the line appears with vLLM's format and level.
logger = logging.getLogger("vllm.overlay")
_checked = False


class OverlayMismatch(RuntimeError):
    """The running vllm files are not the ones this image's manifest lists."""


def summary(manifest: dict) -> str:
    upstream = manifest["upstream"]
    series = (
        ", ".join(
            f"{s['name']} ({len(s['patches'])} patch{'es' if len(s['patches']) != 1 else ''})"
            for s in manifest["series"]
        )
        or "none"
    )
    return (
        f"vllm {upstream['version']} ({upstream['commit']}) + overlay: series {series}; "
        f"{len(manifest.get('files', {}))} file(s) replaced; series sha256 {manifest['series_sha256'][:16]}"
    )


def register() -> None:
    global _checked
    if _checked:
        return
    _checked = True
    try:
        manifest = load_manifest()
    except ManifestError as exc:
        _fail([str(exc)])
        return
    site = vllm_site_packages()
    problems = running(site, manifest) if site is not None else ["no-vllm: the vllm package cannot be found"]
    if problems:
        _fail(problems)
        return
    logger.info("%s [%s]", summary(manifest), environment_note())
    metrics.publish(manifest)


def _fail(problems: list[str]) -> None:
    message = "vllm overlay: the running files do not match the image's manifest:\n  " + "\n  ".join(problems)
    logger.error(message)
    if os.environ.get(ALLOW_ENV) != "1":
        raise OverlayMismatch(
            message + f"\n(run `python3 -m vllm_overlay_status verify` for the full check; {ALLOW_ENV}=1 overrides)"
        )
