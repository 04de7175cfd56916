"""What the build context says of itself: the manifest of applied patches, the image's labels, the build arguments.

The manifest goes into the image (the in-image verify reads it); the labels are the OCI annotations
the Dockerfile's LABEL sets from the build arguments, which carry them (and the base and the epoch)
into the build. The project's Dockerfile carries the lock- and series-derived ones as ARG defaults
(:func:`root_defaults`), so ``docker build .`` labels its image the same way. None holds a time or
host-dependent value but the epoch, the git revision and the source URL given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vllm_overlay.series import Patch
from vllm_overlay.upstream.lock import Lock

if TYPE_CHECKING:
    from vllm_overlay.image.model import SeriesLayer

MANIFEST_FORMAT = 1
# ARG defaults of the project's Dockerfile that follow from upstream.lock and the series alone.
ROOT_DEFAULTS = (
    "BASE_IMAGE",
    "SOURCE_DATE_EPOCH",
    "OVERLAY_BASE_DIGEST",
    "OVERLAY_VERSION",
    "OVERLAY_CREATED",
    "OVERLAY_UPSTREAM_VERSION",
    "OVERLAY_UPSTREAM_COMMIT",
    "OVERLAY_SERIES_SHA256",
    "OVERLAY_SERIES",
    "OVERLAY_MANIFEST_SHA256",
    "OVERLAY_SBOM_SHA256",
)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def series_sha256(patches: list[Patch]) -> str:
    """One hash for the whole series: each patch's name and file sha256, in order."""
    text = "".join(f"{p.name} {sha256_bytes(p.raw)}\n" for p in patches)
    return sha256_bytes(text.encode())


def locked_base(lock: Lock) -> str:
    """The lock's base image, by digest when the lock has one."""
    return f"{lock.base_image}@{lock.base_digest}" if lock.base_digest else lock.base_image


def created(epoch: int) -> str:
    """org.opencontainers.image.created of an image staged at ``epoch``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest(
    lock: Lock,
    patches: list[Patch],
    layers: Sequence[SeriesLayer],
    overlay_files: dict[str, str],
    unshipped: list[dict],
    distribution: str | None = None,
) -> dict:
    """The manifest of applied patches: each series' layer, patches and files, the files the image ends with.

    ``distribution`` names the installed distribution the layers go over when it is not the lock's project.
    """
    final: dict[str, str] = {}
    for layer in layers:
        for shipped in layer.files:
            final[shipped.path] = shipped.sha256
    return {
        "format": MANIFEST_FORMAT,
        "upstream": {
            "project": lock.project,
            "version": lock.version,
            "commit": lock.commit,
            **({"distribution": distribution} if distribution and distribution != lock.project else {}),
        },
        "series_sha256": series_sha256(patches),
        "series": [
            {
                "name": layer.name,
                "layer": layer.layer,
                "patches": [{k: v for k, v in p.items() if k != "commit"} for p in layer.patches],
                "files": [f.to_json() for f in layer.files],
            }
            for layer in layers
        ],
        "files": dict(sorted(final.items())),
        "overlay_files": overlay_files,
        "unshipped": unshipped,
    }


def image_labels(
    lock: Lock,
    layers: Sequence[SeriesLayer],
    *,
    base: str,
    base_digest: str,
    revision: str,
    source: str,
    epoch: int,
    series_sha: str,
    manifest_text: str,
    sbom_text: str,
) -> dict[str, str]:
    """The image's labels: the base, the version and revision, the upstream, the series, manifest and SBOM hashes."""
    return {
        "org.opencontainers.image.base.name": base,
        "org.opencontainers.image.base.digest": base_digest,
        "org.opencontainers.image.version": f"{lock.version}-overlay.{series_sha[:12]}",
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.created": created(epoch),
        "vllm-overlay.upstream.version": lock.version,
        "vllm-overlay.upstream.commit": lock.commit,
        "vllm-overlay.series.sha256": series_sha,
        "vllm-overlay.series": ",".join(layer.name for layer in layers),
        "vllm-overlay.manifest.sha256": sha256_bytes(manifest_text.encode()),
        "vllm-overlay.sbom.sha256": sha256_bytes(sbom_text.encode()),
    }


def build_args(lock: Lock, labels: dict[str, str], epoch: int) -> dict[str, str]:
    """The staged Dockerfile's build arguments: the base and epoch, and the labels' values (its LABEL reads them)."""
    return {
        "BASE_IMAGE": labels["org.opencontainers.image.base.name"],
        "SOURCE_DATE_EPOCH": str(epoch),
        "OVERLAY_BASE_DIGEST": labels["org.opencontainers.image.base.digest"],
        "OVERLAY_VERSION": labels["org.opencontainers.image.version"],
        "OVERLAY_REVISION": labels["org.opencontainers.image.revision"],
        "OVERLAY_SOURCE": labels["org.opencontainers.image.source"],
        "OVERLAY_CREATED": labels["org.opencontainers.image.created"],
        "OVERLAY_UPSTREAM_VERSION": lock.version,
        "OVERLAY_UPSTREAM_COMMIT": lock.commit,
        "OVERLAY_SERIES_SHA256": labels["vllm-overlay.series.sha256"],
        "OVERLAY_SERIES": labels["vllm-overlay.series"],
        "OVERLAY_MANIFEST_SHA256": labels["vllm-overlay.manifest.sha256"],
        "OVERLAY_SBOM_SHA256": labels["vllm-overlay.sbom.sha256"],
    }


def root_defaults(lock: Lock, args: dict[str, str]) -> dict[str, str]:
    """:data:`ROOT_DEFAULTS` as the project's Dockerfile carries them: the lock's base, not the one built on."""
    defaults = {name: args[name] for name in ROOT_DEFAULTS}
    defaults["BASE_IMAGE"] = locked_base(lock)
    defaults["OVERLAY_BASE_DIGEST"] = lock.base_digest
    return defaults
