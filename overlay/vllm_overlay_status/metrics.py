"""``vllm_overlay_info`` on the API server's /metrics: which upstream and series a replica runs.

One gauge, always 1, whose labels carry the provenance (the Prometheus "info" idiom):

    vllm_overlay_info{upstream_version="0.33.0",upstream_commit="g4ba787ec9",
                      series_sha256="…",patches="loader-layouts/…,route-sanitization/…"} 1.0

A gauge rather than prometheus_client's Info type because Info has no multiprocess mode: with
``--api-server-count`` > 1 vLLM serves /metrics from PROMETHEUS_MULTIPROC_DIR, and a gauge with
``multiprocess_mode="livemax"`` is written there by every process and merged into one sample.
In a single API server it lands in prometheus_client's default registry, which vLLM's /metrics
serves. prometheus_client is imported only here and only when vLLM runs; without it nothing is
registered (the checks never need it).
"""

from __future__ import annotations

METRIC = "vllm_overlay_info"
LABELS = ("upstream_version", "upstream_commit", "series_sha256", "patches")
_published = False


def info_labels(manifest: dict) -> dict[str, str]:
    """The label values for a manifest: patches as series/name, in series order, comma-separated."""
    upstream = manifest["upstream"]
    patches = [
        f"{series['name']}/{patch['name'].rsplit('/', 1)[-1].removesuffix('.patch')}"
        for series in manifest["series"]
        for patch in series["patches"]
    ]
    return {
        "upstream_version": str(upstream["version"]),
        "upstream_commit": str(upstream["commit"]),
        "series_sha256": str(manifest["series_sha256"]),
        "patches": ",".join(patches),
    }


def publish(manifest: dict) -> bool:
    """Register and set the info gauge once per process; False where prometheus_client is absent."""
    global _published
    if _published:
        return True
    try:
        from prometheus_client import Gauge
    except ImportError:
        return False
    # The mode matters only where PROMETHEUS_MULTIPROC_DIR is set; elsewhere prometheus_client ignores it.
    gauge = Gauge(
        METRIC,
        "vLLM upstream release and patch series this process runs (always 1)",
        LABELS,
        multiprocess_mode="livemax",
    )
    gauge.labels(**info_labels(manifest)).set(1)
    _published = True
    return True
