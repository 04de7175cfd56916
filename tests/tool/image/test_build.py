"""build-image as a library call: staged without an engine, the engine and its flags as given."""

from __future__ import annotations

import json

from tests.tool.helpers.apply_runs import apply_no_patches
from vllm_overlay import cli


def test_build_image_without_engine_says_so(image_project, upstream_dir, store_env, monkeypatch, capsys):
    apply_no_patches(image_project, upstream_dir)
    monkeypatch.setattr("vllm_overlay.image.engine.shutil.which", lambda name: None)
    assert cli.main(["build-image", "--project", str(image_project)]) == 2
    assert "no container engine" in capsys.readouterr().err


def test_stage_only_needs_no_engine(image_project, upstream_dir, store_env, capsys):
    apply_no_patches(image_project, upstream_dir)
    assert cli.main(["build-image", "--project", str(image_project), "--stage-only"]) == 0
    manifest = json.loads((image_project / "build/image/overlay/vllm_overlay_status/manifest.json").read_text())
    assert manifest["series"] == [] and manifest["files"] == {}


def test_build_image_passes_the_engine_flags(image_project, upstream_dir, store_env, monkeypatch):
    from vllm_overlay.image import engine

    apply_no_patches(image_project, upstream_dir)
    found: list[engine.Options] = []

    def fake_find(choice, options=None):
        found.append(options)
        raise engine.EngineError("stop here")

    monkeypatch.setattr(engine, "find_engine", fake_find)
    argv = ["build-image", "--project", str(image_project), "--engine", "podman", "--runtime", "runc"]
    assert cli.main([*argv, "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]) == 2
    assert found == [engine.Options(runtime="runc", ulimits=("nofile=1024:1024", "nproc=4096:4096"))]
