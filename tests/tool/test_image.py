"""build-image staging: one layer per series with only its files, the manifest, the Dockerfile, reproducibility."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.tool.helpers import REPO_ROOT, replace_line, run_apply, write_upstream
from vllm_overlay import apply, cli, lock, series, upstream_trees
from vllm_overlay.image import build_context, dockerfile
from vllm_overlay.project import Project
from vllm_overlay.store import Store

LOCKED = "__version__ = version = '0.33.0'\n__commit_id__ = commit_id = 'g4ba787ec9'\n"


@pytest.fixture
def upstream_dir(tmp_path: Path) -> Path:  # the locked version, so staging accepts it
    return write_upstream(tmp_path / "upstream-a", extra={"vllm/_version.py": LOCKED})


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def store_env(_module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One store for this module: apply-patches imports the locked sdist once, not per test."""
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(_module_cache))
    return _module_cache


@pytest.fixture
def image_project(project: Path) -> Path:
    shutil.copy(REPO_ROOT / "Dockerfile", project / "Dockerfile")
    shutil.copytree(REPO_ROOT / "overlay", project / "overlay", ignore=shutil.ignore_patterns("__pycache__"))
    return project


def apply_no_patches(project: Path, upstream: Path) -> None:
    """build/patched as the pristine upstream: apply-patches refuses an empty series, the engine does not."""
    store = Store()
    up = upstream_trees.obtain(str(upstream), lock.load(project / "upstream.lock"), store)
    result = apply.apply_series(
        [], up, lambda d: upstream_trees.checkout(store, up, d), project / "build/patched", apply.Options()
    )
    assert result.ok


def add_module_and_doc(tree: Path) -> None:
    (tree / "vllm" / "added.py").write_text("ADDED = 1\n")
    (tree / "docs.md").write_text("x\n")


def two_series(make_patch, upstream_dir):
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1", "alpha"
    )
    make_patch(upstream_dir, add_module_and_doc, "a2", "alpha")
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_9 = 9\n", "line_9 = 90\n"), "b1", "beta"
    )


def do_stage(project: Path, epoch: int = 1_700_000_000) -> build_context.BuildContext:
    proj = Project(project)
    return build_context.stage(proj, lock.load(proj.lock_file), series.load_series(proj.patches), epoch=epoch)


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest.update(f"{path.relative_to(root)} {stat.st_mode:o} {int(stat.st_mtime)}\n".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_one_layer_per_series_with_only_its_files(image_project, make_patch, upstream_dir, store_env):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    context = do_stage(image_project)
    layers = context.root / "layers"
    assert sorted(p.name for p in layers.iterdir()) == ["01-alpha", "02-beta"]
    files = {p.relative_to(layers).as_posix() for p in layers.rglob("*") if p.is_file()}
    assert files == {"01-alpha/vllm/core.py", "01-alpha/vllm/added.py", "02-beta/vllm/core.py"}
    # each layer holds the file as it stands after its series
    assert "line_5 = 50\n" in (layers / "01-alpha/vllm/core.py").read_text()
    assert "line_9 = 9\n" in (layers / "01-alpha/vllm/core.py").read_text()
    assert "line_9 = 90\n" in (layers / "02-beta/vllm/core.py").read_text()
    final = (layers / "02-beta/vllm/core.py").read_bytes()
    manifest = json.loads((context.root / "overlay/vllm_overlay_status/manifest.json").read_text())
    assert manifest["files"] == {
        "vllm/added.py": hashlib.sha256(b"ADDED = 1\n").hexdigest(),
        "vllm/core.py": hashlib.sha256(final).hexdigest(),
    }
    assert [s["name"] for s in manifest["series"]] == ["alpha", "beta"]
    patch = manifest["series"][0]["patches"][0]
    assert patch["sha256"] == hashlib.sha256((image_project / "patches" / patch["name"]).read_bytes()).hexdigest()
    assert {f["path"]: f["change"] for f in manifest["series"][0]["files"]} == {
        "vllm/core.py": "modified",
        "vllm/added.py": "added",
    }
    assert manifest["unshipped"] == [{"path": "docs.md", "patches": ["alpha/a2.patch"]}]
    assert (context.root / "overlay/vllm_overlay_status/_record.py").read_bytes() == (
        REPO_ROOT / "vllm_overlay/record.py"
    ).read_bytes()
    record = (context.root / "overlay/vllm_overlay_status-0.1.0.dist-info/RECORD").read_text()
    assert "vllm_overlay_status/manifest.json,sha256=" in record


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


def test_staging_is_reproducible(image_project, make_patch, upstream_dir, store_env):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    first = tree_digest(do_stage(image_project).root)
    second = tree_digest(do_stage(image_project).root)
    assert first == second
    for path in (image_project / "build" / "image").rglob("*"):
        assert int(path.lstat().st_mtime) == 1_700_000_000


def test_stale_tree_is_refused(image_project, make_patch, upstream_dir, store_env):
    path = make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1"
    )
    assert run_apply(image_project, upstream_dir)[0] == 0
    path.write_text(path.read_text().replace("+line_5 = 50", "+line_5 = 51"))
    with pytest.raises(build_context.ImageError, match="changed after apply-patches"):
        do_stage(image_project)


def test_series_not_applied_is_refused(image_project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1")
    with pytest.raises(build_context.ImageError, match="apply-patches"):
        do_stage(image_project)


def test_deleting_a_file_is_refused(image_project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, lambda t: (t / "vllm" / "core.py").unlink(), "drop core")
    assert run_apply(image_project, upstream_dir)[0] == 0
    with pytest.raises(build_context.ImageError, match="cannot delete"):
        do_stage(image_project)


def test_other_upstream_version_is_refused(image_project, make_patch, tmp_path, store_env):
    other = write_upstream(tmp_path / "upstream-other")  # 9.9.9
    make_patch(other, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1")
    assert run_apply(image_project, other)[0] == 0
    with pytest.raises(build_context.ImageError, match=r"locked vllm 0\.33\.0"):
        do_stage(image_project)


def test_overlay_may_not_write_into_vllm(image_project, make_patch, upstream_dir, store_env):
    apply_no_patches(image_project, upstream_dir)
    (image_project / "overlay" / "vllm").mkdir()
    (image_project / "overlay" / "vllm" / "x.py").write_text("")
    with pytest.raises(build_context.ImageError, match="never into it"):
        do_stage(image_project)


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


def test_stand_in_mirror_comes_from_the_machines_apt_sources(tmp_path: Path) -> None:
    from vllm_overlay.image import engine, standins

    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://archive.example.invalid/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://archive.example.invalid/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n"
    )
    assert standins.apt_mirror(apt) == "http://archive.example.invalid/debian"
    (apt / "sources.list").write_text(
        "# deb http://old.example.invalid/debian bookworm main\n"
        "deb [signed-by=/k.gpg] http://one-line.example.invalid/debian bookworm main\n"
    )
    assert standins.apt_mirror(apt) == "http://one-line.example.invalid/debian"  # sources.list comes first
    empty = tmp_path / "empty"
    (empty / "sources.list.d").mkdir(parents=True)
    with pytest.raises(engine.EngineError, match="--mirror"):
        standins.apt_mirror(empty)


def test_stand_in_carries_the_py_files_with_a_record_of_exactly_them(tmp_path: Path) -> None:
    from vllm_overlay import record
    from vllm_overlay.image import standins

    site = tmp_path / "site"
    files = {"vllm/__init__.py": b"", "vllm/envs.py": b"X = 1\n", "vllm/_C.abi3.so": b"\0" * 64}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    info = site / "vllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    rows = [
        f"{p.relative_to(site).as_posix()},{record.record_hash(hashlib.sha256(p.read_bytes()).hexdigest())},"
        f"{p.stat().st_size}"
        for p in sorted(site.rglob("*"))
        if p.is_file()
    ]
    (info / "RECORD").write_text("\n".join([*rows, "../../bin/vllm,sha256=x,1", f"{info.name}/RECORD,,"]) + "\n")
    assert record.verify_distribution(site, "vllm") == []

    target = tmp_path / "standin"
    count, size = standins.carry_files(site, info, target)
    assert count == 3 and size == len(b"X = 1\n") + len(info.joinpath("METADATA").read_bytes())
    assert not (target / "vllm" / "_C.abi3.so").exists() and not (target / "bin").exists()
    assert record.verify_distribution(target, "vllm") == []  # the stand-in is its (trimmed) RECORD
    (target / "vllm" / "envs.py").write_text("X = 2\n")
    assert [p.path for p in record.verify_distribution(target, "vllm")] == ["vllm/envs.py"]


def test_root_build_reads_the_index_and_ca_bundle_pip_is_configured_with(tmp_path, monkeypatch):
    """ci-image --root-build: the first stage gets the machine's http(s) indexes and trusts its CA bundle."""
    from vllm_overlay import indexes
    from vllm_overlay.image import ci_checks, standins

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


def test_export_brings_the_dockerfile_in_line(image_project, make_patch, upstream_dir, store_env, capsys):
    """An edited patch changes the series sha256, manifest and SBOM: export-patches rewrites the defaults."""
    import git

    from tests.tool.helpers import IDENTITY

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


def test_unusual_file_names_and_a_mode_only_change_stage(image_project, make_patch, upstream_dir, store_env):
    """Names git quotes (a space, a non-ASCII letter) and a mode-only change: staged, not "changed after apply"."""

    def edit(tree: Path) -> None:
        (tree / "vllm" / "with space.py").write_text("SPACED = 1\n")
        (tree / "vllm" / "café.py").write_text("ACCENTED = 1\n")
        (tree / "vllm" / "core.py").chmod(0o755)

    make_patch(upstream_dir, edit, "odd names", "alpha")
    assert run_apply(image_project, upstream_dir)[0] == 0
    context = do_stage(image_project)
    manifest = json.loads((context.root / "overlay/vllm_overlay_status/manifest.json").read_text())
    assert {"vllm/with space.py", "vllm/café.py"} <= set(manifest["files"])
    assert (context.root / "layers" / "01-alpha" / "vllm" / "café.py").read_text() == "ACCENTED = 1\n"


# --- engines: the flags each one gets, check 7's engine choice, the check's own Docker daemon -----------


def _argv_of(monkeypatch, eng, call):
    """The command lines ``call(eng)`` would run (nothing runs)."""
    from vllm_overlay.image import engine

    seen: list[list[str]] = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_run(argv, **_kwargs):
        seen.append(list(argv))
        return Done()

    monkeypatch.setattr(engine, "_run", fake_run)
    call(eng)
    return seen


def test_podman_gets_its_runtime_as_a_global_flag_and_ulimits_on_build_and_run(monkeypatch, tmp_path):
    """Debian's podman 4.3 runs nothing with its default runtime: build-image --engine podman must pass them."""
    from vllm_overlay.image import engine

    options = engine.Options(runtime="runc", ulimits=("nofile=1024:1024", "nproc=4096:4096"), network="none")
    podman = engine.Engine("podman", "/usr/bin/podman", options)
    (build,) = _argv_of(monkeypatch, podman, lambda e: e.build(tmp_path, ["t"], {}, 0))
    (run,) = _argv_of(monkeypatch, podman, lambda e: e.run("t", ["python3", "-V"]))
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--network", "none"]
    for argv, verb in ((build, "build"), (run, "run")):
        assert argv[:4] == ["/usr/bin/podman", "--runtime", "runc", verb]
        at = argv.index(limits[0])
        assert argv[at : at + len(limits)] == limits
    docker = engine.Engine("docker", "docker", options)
    (build,) = _argv_of(monkeypatch, docker, lambda e: e.build(tmp_path, ["t"], {}, 0))
    (run,) = _argv_of(monkeypatch, docker, lambda e: e.run("t", ["python3"]))
    assert "--runtime" not in build and "--force-rm" in build  # docker build picks no runtime
    assert run[:4] == ["docker", "run", "--rm", "--runtime"] and "nproc=4096:4096" in run


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


FAKE_DOCKERD = """#!{python}
import sys, time
from pathlib import Path
Path(sys.argv[sys.argv.index("--pidfile") + 1]).write_text(str(__import__("os").getpid()))
time.sleep(300)
"""


def test_the_checks_docker_daemon_is_stopped_by_its_pid_and_a_leftover_one_too(tmp_path):
    """A stand-in dockerd (sleeps; writes its pid file as dockerd does): started, answered, stopped by its pid."""
    import os
    import subprocess
    import sys

    from vllm_overlay.image import dockerd

    fake = tmp_path / "bin" / "dockerd"
    fake.parent.mkdir()
    fake.write_text(FAKE_DOCKERD.format(python=sys.executable))
    fake.chmod(0o755)
    client = tmp_path / "bin" / "docker"  # answers once the daemon wrote its pid file
    client.write_text(f"#!/bin/sh\ntest -s {tmp_path / 'run' / 'docker.pid'}\n")
    client.chmod(0o755)
    store = Store(tmp_path / "store")
    daemon = dockerd.Daemon(store, run_dir=tmp_path / "run")
    daemon.start(str(fake), str(client))
    pid = daemon.process.pid
    assert dockerd._alive(pid) and daemon._ours(pid)
    daemon.stop()
    assert not dockerd._alive(pid) and daemon.process is None

    # A daemon a killed check left: found by the pid file, stopped by that pid; another process is left alone.
    argv = [str(fake), "--data-root", str(daemon.data_root), "--pidfile", str(daemon.pidfile)]
    left = subprocess.Popen(argv)
    try:
        for _ in range(100):
            if daemon.pidfile.exists() and daemon.pidfile.read_text() == str(left.pid):
                break
            __import__("time").sleep(0.1)
        assert dockerd.Daemon(store, run_dir=tmp_path / "other").stop_leftover() is None
        assert dockerd.Daemon(store, run_dir=tmp_path / "run").stop_leftover() == left.pid
        assert left.wait(timeout=30) is not None
    finally:
        if left.poll() is None:
            os.kill(left.pid, 9)
            left.wait()


# --- ci-image's builds: the library function, typed, over one build context ---------------------------


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


DOCSTRING_OF = "vllm_overlay.commands.docstring_of"  # the help-text reader of the verbs' package, not a verb


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
        ("buildah", (ci_checks.TAG,), {"VLLM_SITE_PACKAGES": run.site}, False, True)
    ] * 2
    assert seen[-1] == ("podman", ci_checks.ENGINE_OPTIONS["podman"]) and seen[0] == ("buildah", engine.Options())
    assert [b[0] for b in fake.builds] == [run.built_context.root] * 3 and all(b[3] for b in fake.builds)
    assert fake.builds[0][2]["VLLM_SITE_PACKAGES"] == run.site and not run.failures
