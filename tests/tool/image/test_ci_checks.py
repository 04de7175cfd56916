"""ci-image's checks: the index and CA bundle of a root build, the engines of check 7, builds as typed library calls."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import REPO_ROOT, two_series
from vllm_overlay import series
from vllm_overlay.image import build_context
from vllm_overlay.project import Project
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


DOCSTRING_OF = "vllm_overlay.commands.docstring_of"  # the help-text reader of the verbs' package, not a verb


class FakeEngine:
    """An engine whose builds and in-image verify pass (nothing runs)."""

    name, exe = "buildah", "/usr/bin/buildah"

    def __init__(self) -> None:
        self.builds: list[tuple[Path, list[str], dict[str, str], bool]] = []

    def image_exists(self, ref: str) -> bool:
        return True

    def digest(self, ref: str) -> str | None:
        return None

    def build(self, root, tags, build_args, epoch, no_cache=False) -> int:
        self.builds.append((Path(root), list(tags), dict(build_args), no_cache))
        return 0

    def run(self, tag, argv):
        return 0, "verified: 0 files"

    def diff_ids(self, ref: str) -> list[str]:
        return ["sha256:base"] if "standin" in ref else ["sha256:base", "sha256:layer"]

    def layer_sizes(self, ref: str) -> list[int | None]:
        return [10, 2]

    def image_size(self, ref: str) -> int | None:
        return 12


def test_root_build_reads_the_index_and_ca_bundle_pip_is_configured_with(tmp_path, monkeypatch):
    """ci-image --root-build: the first stage gets the machine's http(s) indexes and trusts its CA bundle."""
    from vllm_overlay.image import ci_checks, standins
    from vllm_overlay.upstream import indexes

    monkeypatch.delenv(indexes.ENV_VAR, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "https://index.example.invalid/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/wheels-here http://127.0.0.1:9/simple")
    assert ci_checks.index_build_args() == {
        "PIP_INDEX_URL": "https://index.example.invalid/simple",
        "PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/simple",  # a file:// index is this machine's directory
    }
    monkeypatch.setenv(indexes.ENV_VAR, "file:///only/local")
    assert ci_checks.index_build_args() == {}
    bundle = tmp_path / "corporate-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert standins.machine_ca_bundle() == bundle


def test_check_7_takes_every_engine_present_and_names_the_others(monkeypatch):
    from vllm_overlay.image import ci_checks, engine

    installed = {"podman"}
    monkeypatch.setattr(ci_checks.shutil, "which", lambda name: f"/usr/bin/{name}" if name in installed else None)
    present, absent = ci_checks.other_engines("auto")
    assert present == ["podman"] and len(absent) == 1 and "docker: not installed" in absent[0]
    with pytest.raises(engine.EngineError, match="docker"):
        ci_checks.other_engines("docker,podman")  # asked for: required
    installed |= {"docker"}  # the CLI alone is not an engine: the check starts its own dockerd
    assert ci_checks.other_engines("auto")[0] == ["podman"]
    installed |= {"dockerd"}
    assert ci_checks.other_engines("auto") == (["docker", "podman"], [])
    assert ci_checks.other_engines("none")[0] == []
    assert "--runtime" in ci_checks.engine_argv("podman") and "--runtime" not in ci_checks.engine_argv("docker")


def test_the_image_code_calls_no_verb():
    """No argv between verbs: the image package, the README check and the image verbs import no verb and no cli."""
    sources = sorted((REPO_ROOT / "vllm_overlay" / "image").glob("*.py"))
    sources += [REPO_ROOT / "vllm_overlay" / "readme_ci.py"]
    sources += [REPO_ROOT / "vllm_overlay" / "commands" / name for name in ("build_image.py", "ci_image.py")]
    for path in sources:
        imported = _imported_modules(path)
        verbs = {name for name in imported if name.startswith("vllm_overlay.commands.") and name != DOCSTRING_OF}
        assert not verbs and "vllm_overlay.cli" not in imported, f"{path.name}: {verbs or 'vllm_overlay.cli'}"
    assert "argparse" not in _imported_modules(REPO_ROOT / "vllm_overlay" / "image" / "ci_checks.py")


def test_ci_image_builds_call_the_library_typed_over_one_staged_context(
    image_project, make_patch, upstream_dir, store_env, monkeypatch, capsys
):
    """ci-image's builds: build.build_image with typed options, never an ArgumentParser; staged once per run."""
    import argparse

    from vllm_overlay.image import build, ci_checks, engine

    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    proj = Project(image_project)
    fake = FakeEngine()
    seen: list[tuple[str, engine.Options]] = []

    def find_engine(choice, options=None):
        seen.append((choice, options))
        return fake

    staged = []
    real_stage = build_context.stage
    monkeypatch.setattr(build_context, "stage", lambda *a, **k: staged.append(k) or real_stage(*a, **k))
    monkeypatch.setattr(engine, "find_engine", find_engine)
    monkeypatch.setattr(argparse, "ArgumentParser", lambda *a, **k: pytest.fail("an ArgumentParser was built"))
    calls: list[build.BuildOptions] = []
    real_build = build.build_image
    monkeypatch.setattr(build, "build_image", lambda p, o, **k: calls.append(o) or real_build(p, o, **k))
    the_lock = lock.load(proj.lock_file)
    patches = series.load_series(proj.patches)
    run = ci_checks.Run(proj, ci_checks.Options(), the_lock, patches, Store(), fake, [], [])
    run.ref, run.site = "localhost/vllm-standin:0.33.0", "/usr/lib/python3/dist-packages"
    assert ci_checks.check_build(run) == ["sha256:layer"]
    assert ci_checks.check_rebuild(run, ["sha256:layer"]) == ["sha256:layer"]
    assert ci_checks.build_on_standin(run, tag="localhost/vllm-overlay-ci:podman", engine_name="podman") == 0
    with ci_checks.tampered_copy(proj, run.built_context) as (root, victim):
        assert victim.read_text().endswith(ci_checks.TAMPER_LINE) and root != run.built_context.root
    staged_files = [p for p in run.built_context.root.rglob("*.py")]
    assert not any(ci_checks.TAMPER_LINE in p.read_text(encoding="utf-8") for p in staged_files)  # left as staged
    assert len(staged) == 1 and staged[0]["base_image"] == run.ref
    assert all(isinstance(options, build.BuildOptions) for options in calls) and len(calls) == 3
    assert [(o.engine, o.tags, dict(o.build_args), o.pull, o.no_cache) for o in calls[:2]] == [
        ("buildah", (ci_checks.TAG,), {"VLLM_SITE_PACKAGES": run.site, "VLLM_RECORD_SCOPE": ".py"}, False, True)
    ] * 2
    assert seen[-1] == ("podman", ci_checks.ENGINE_OPTIONS["podman"]) and seen[0] == ("buildah", engine.Options())
    assert [b[0] for b in fake.builds] == [run.built_context.root] * 3 and all(b[3] for b in fake.builds)
    assert fake.builds[0][2]["VLLM_SITE_PACKAGES"] == run.site and not run.failures
