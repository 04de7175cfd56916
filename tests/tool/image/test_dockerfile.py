"""The project's Dockerfile and the staged one: the generated parts, their sync and staleness."""

from __future__ import annotations

import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.images import do_stage
from tests.tool.helpers.repos import replace_line, two_series
from vllm_overlay import cli, series
from vllm_overlay.image import build_context, dockerfile
from vllm_overlay.project import Project


def stages(text: str) -> tuple[str, str]:
    """(everything before the image's stage, the image's stage) of a Dockerfile."""
    head, sep, tail = text.partition("\nFROM ${BASE_IMAGE}\n")
    assert sep, "no FROM ${BASE_IMAGE} stage"
    return head, tail


def test_staged_dockerfile_is_the_projects_with_the_staged_files_as_first_stage(
    image_project, make_patch, upstream_dir, store_env
):
    """docker build . and build-image share the image's stage; only the series stage differs."""
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    proj = Project(image_project)
    context = do_stage(image_project, epoch=build_context.series_epoch(series.load_series(proj.patches)))
    assert dockerfile.sync_dockerfile(proj, context)
    root_head, root_image = stages((image_project / "Dockerfile").read_text())
    staged_head, staged_image = stages(context.dockerfile.read_text())
    assert "FROM ${TOOL_IMAGE} AS series" in root_head and "vllm-overlay apply-patches" in root_head
    assert "FROM scratch AS series\nCOPY layers/ /vllm-overlay/build/image/layers/\n" in staged_head
    assert "apply-patches" not in staged_head
    per_build = {"OVERLAY_REVISION", "OVERLAY_SOURCE"}  # the host's git facts: build-image fills them in
    differing = [(a, b) for a, b in zip(root_image.splitlines(), staged_image.splitlines(), strict=True) if a != b]
    assert {a.split("=")[0].removeprefix("ARG ") for a, _ in differing} == per_build
    assert dockerfile.stale_dockerfile_lines(proj, context) == []
    assert not dockerfile.sync_dockerfile(proj, context)  # idempotent


def test_check_dockerfile_fails_until_synced(image_project, make_patch, upstream_dir, store_env, capsys):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    argv = ["build-image", "--project", str(image_project), "--stage-only"]
    assert cli.main([*argv, "--check-dockerfile"]) == 1  # the repository's Dockerfile holds another series
    err = capsys.readouterr().err
    assert "+COPY --from=series /vllm-overlay/build/image/layers/01-alpha/" in err and "--sync-dockerfile" in err
    assert cli.main([*argv, "--sync-dockerfile"]) == 0
    assert cli.main([*argv, "--check-dockerfile"]) == 0
    text = (image_project / "Dockerfile").read_text()
    assert 'ARG OVERLAY_SERIES="alpha,beta"' in text and "ARG OVERLAY_REVISION=\n" in text
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_7 = 7\n", "line_7 = 70\n"), "b2", "beta"
    )
    assert run_apply(image_project, upstream_dir)[0] == 0
    capsys.readouterr()
    assert cli.main([*argv, "--check-dockerfile"]) == 1  # a new patch: new series sha256, manifest, SBOM
    assert "-ARG OVERLAY_SERIES_SHA256=" in capsys.readouterr().err


def test_dockerfile_is_checked_at_the_series_epoch_only(image_project, make_patch, upstream_dir, store_env):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    context = do_stage(image_project, epoch=12345)  # e.g. SOURCE_DATE_EPOCH set: other labels, other SBOM
    with pytest.raises(build_context.ImageError, match="unset SOURCE_DATE_EPOCH"):
        dockerfile.stale_dockerfile_lines(Project(image_project), context)


def test_export_brings_the_dockerfile_in_line(image_project, make_patch, upstream_dir, store_env, capsys):
    """An edited patch changes the series sha256, manifest and SBOM: export-patches rewrites the defaults."""
    import git

    from tests.tool.helpers.repos import IDENTITY

    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    argv = ["build-image", "--project", str(image_project), "--stage-only"]
    assert cli.main([*argv, "--sync-dockerfile"]) == 0
    before = (image_project / "Dockerfile").read_text()
    repo = git.Repo(image_project / "build" / "patched")
    replace_line(image_project / "build" / "patched" / "vllm" / "core.py", "line_9 = 90\n", "line_9 = 900\n")
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aq", "--amend", "--no-edit")
    capsys.readouterr()
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(image_project)]) == 0
    assert "updated the generated parts of Dockerfile" in capsys.readouterr().out
    after = (image_project / "Dockerfile").read_text()
    assert after != before
    assert not list((image_project / "build").glob(".dockerfile-sync-*"))  # the scratch staging is gone
    assert cli.main([*argv, "--check-dockerfile"]) == 0
    # patches/ already current (an earlier export wrote it) but the Dockerfile stale: still brought in line.
    dockerfile = image_project / "Dockerfile"
    dockerfile.write_text(after.replace('ARG OVERLAY_SERIES="alpha,beta"', 'ARG OVERLAY_SERIES="alpha"'))
    capsys.readouterr()
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(image_project)]) == 0
    assert "updated the generated parts of Dockerfile" in capsys.readouterr().out
    assert dockerfile.read_text() == after
