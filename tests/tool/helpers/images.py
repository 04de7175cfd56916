"""A staged image build context, from a project or bare."""

from __future__ import annotations

from pathlib import Path

from vllm_overlay import series
from vllm_overlay.image import build_context
from vllm_overlay.image.model import BuildContext
from vllm_overlay.project import Project
from vllm_overlay.upstream import lock


def do_stage(project: Path, epoch: int = 1_700_000_000) -> build_context.BuildContext:
    proj = Project(project)
    return build_context.stage(proj, lock.load(proj.lock_file), series.load_series(proj.patches), epoch=epoch)


def bare_build_context(root: Path, manifest: dict | None = None) -> BuildContext:
    """A build context of no layers, built directly (no staging): for code that reads one."""
    return BuildContext(
        root=root,
        layers=[],
        manifest={"series_sha256": "ab" * 32, **(manifest or {})},
        build_args={},
        labels={},
        unshipped=[],
        source_date_epoch=0,
        dockerfile_block="",
        root_defaults=None,
    )
