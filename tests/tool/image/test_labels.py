"""The image's labels, build arguments and the Dockerfile's series block, from the lock and the series."""

from __future__ import annotations

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.images import do_stage
from tests.tool.helpers.repos import two_series


def test_dockerfile_block_args_and_labels(image_project, make_patch, upstream_dir, store_env):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    context = do_stage(image_project)
    text = context.dockerfile.read_text()
    layer = "COPY --from=series /vllm-overlay/build/image/layers/{}/ ${{VLLM_SITE_PACKAGES}}/\n"
    assert layer.format("01-alpha") + layer.format("02-beta") in text
    assert text.index("01-alpha") < text.index("02-beta") < text.index("build/image/overlay/ ${VLLM_SITE_PACKAGES}/")
    assert 'ARG BASE_IMAGE="vllm/vllm-openai:v0.33.0"' in text
    assert f'ARG OVERLAY_SERIES_SHA256="{context.series_sha256}"' in text
    assert 'ARG OVERLAY_CREATED="2023-11-14T22:13:20Z"' in text
    assert context.labels["vllm-overlay.upstream.commit"] == "g4ba787ec9"
    assert context.labels["org.opencontainers.image.version"].startswith("0.33.0-overlay.")
