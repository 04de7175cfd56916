"""CI for the image: build the real Dockerfile with buildah FROM a locally made stand-in base, then tamper tests.

No registry is reachable on CI machines, so the vllm/vllm-openai base is replaced by a stand-in: a
minimal Debian root filesystem with python3 (debootstrap, cached in the tool's store) holding the
pristine vllm package files and dist-info of the locked release, copied from an interpreter that has
them installed (--python; checked against RECORD first) into the stand-in's system site-packages
(/usr/local/lib/python3.X/dist-packages: the same scheme as the vllm-openai image, whose Python may
differ; the Dockerfile is told the path and proves it). Then:

  1. scripts/build-image builds the real Dockerfile on the stand-in and verifies inside the image;
  2. a second --no-cache build must give the same layer digests (reproducible layers);
  3. a file tampered in a staged layer must make the build's verify step fail;
  4. a file tampered in the built image (a replaced one and an untouched one) must make
     `python3 -m vllm_overlay_status verify` and the vLLM plugin fail.

buildah runs with its own storage under the store (CONTAINERS_STORAGE_CONF), driver --storage-driver
(overlay by default; vfs works everywhere but copies the ~1 GB base at every step).
Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap).

Exit codes: 0 every check passed; 1 a check failed; 2 usage, input or environment error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from vllm_overlay import engine, envs, image, lock, output, project, record, series, shadow
from vllm_overlay.commands import build_image
from vllm_overlay.store import Store

STANDIN = "localhost/vllm-openai-standin:v{version}"
TAG = "localhost/vllm-overlay-ci:latest"
TAMPER_LINE = "# tampered by ci-image\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument(
        "--python",
        default=None,
        help="interpreter whose installed vllm is the pristine source (default: the cached test environment "
        "that test-patches uses, built on first use)",
    )
    parser.add_argument(
        "--storage-driver", default="overlay", choices=("overlay", "vfs"), help="buildah storage driver"
    )
    parser.add_argument("--suite", default="bookworm", help="Debian suite of the stand-in (default: bookworm)")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian", help="Debian mirror for debootstrap")
    parser.add_argument("--rebuild-base", action="store_true", help="make the stand-in base again")


def _sh(*argv: str, env: dict | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise engine.EngineError(f"{' '.join(argv[:3])}...: {(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout.strip()


def _storage(store_root: Path, driver: str) -> None:
    """Point buildah at storage of its own under the store."""
    ci = store_root / "ci"
    conf = ci / f"storage-{driver}.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(
        f'[storage]\ndriver = "{driver}"\ngraphroot = "{ci / ("containers-" + driver)}"\n'
        f'runroot = "/run/vllm-overlay-ci-{driver}"\n'
    )
    os.environ["CONTAINERS_STORAGE_CONF"] = str(conf)
    os.environ.pop("STORAGE_DRIVER", None)
    os.environ.setdefault("BUILDAH_ISOLATION", "chroot")


def _rootfs_tar(store_root: Path, suite: str, mirror: str) -> Path:
    tar = store_root / "ci" / f"debian-{suite}-python3.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        raise engine.EngineError("debootstrap is not installed (Debian: apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(dir=tar.parent) as work:
        root = Path(work) / "rootfs"
        output.info(f"      debootstrap {suite} (minbase + python3) from {mirror}; once, then cached")
        _sh("debootstrap", "--variant=minbase", "--include=python3", suite, str(root), mirror)
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        (root / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        partial = tar.with_suffix(".partial")
        _sh("tar", "--sort=name", "--numeric-owner", "-C", str(root), "-cf", str(partial), ".")
        os.replace(partial, tar)
    return tar


def make_standin(eng: engine.Engine, ref: str, the_lock: lock.Lock, python: str, tar: Path) -> str:
    """Build the stand-in base; return the site-packages path vllm has in it."""
    package = shadow.installed_package_dir(python)
    site = package.parent
    dist = record.find_distribution(site, "vllm")
    if dist is None or dist.metadata["Version"] != the_lock.version:
        raise engine.EngineError(
            f"{site}: no vllm {the_lock.version} dist-info (found {dist and dist.metadata['Version']})"
        )
    problems = record.verify_distribution(site, "vllm")
    if problems:
        raise engine.EngineError(f"{site}: vllm is not pristine ({len(problems)} problem(s), first: {problems[0]})")
    container = _sh(eng.exe, "from", "scratch").splitlines()[-1]
    try:
        mount = Path(_sh(eng.exe, "mount", container))
        _sh("tar", "-C", str(mount), "-xf", str(tar))
        purelib = _sh(
            eng.exe, "run", container, "--", "python3", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"
        ).splitlines()[-1]
        target = mount / purelib.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        _sh("cp", "-a", str(package), str(target / "vllm"))
        _sh("cp", "-a", str(Path(dist._path)), str(target / Path(dist._path).name))  # type: ignore[attr-defined]
        _sh(
            eng.exe,
            "config",
            "--label",
            "vllm-overlay.stand-in=true",
            "--env",
            "VLLM_STANDIN_SITE=" + purelib,
            container,
        )
        _sh(eng.exe, "commit", "-q", container, ref)
    finally:
        subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)
    return purelib


def _build(proj: project.Project, base: str, site: str, *extra: str) -> int:
    argv = ["--project", str(proj.root), "--engine", "buildah", "--base", base, "--no-pull", "--tag", TAG]
    argv += ["--build-arg", f"VLLM_SITE_PACKAGES={site}", *extra]
    parser = argparse.ArgumentParser()
    build_image.add_arguments(parser)
    return build_image.run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    proj = project.from_args(args)
    failures: list[str] = []
    figures: list[str] = []
    try:
        the_lock = lock.load(proj.lock_file)
        patches = series.load_series(proj.patches)
        if os.geteuid() != 0:
            raise engine.EngineError("ci-image needs root (buildah with chroot isolation)")
        store = Store()
        _storage(store.root, args.storage_driver)
        eng = engine.find_engine("buildah")
        ref = STANDIN.format(version=the_lock.version)
        output.info(f"== stand-in base {ref} (storage: {args.storage_driver})")
        if args.rebuild_base and eng.image_exists(ref):
            _sh(eng.exe, "rmi", "-f", ref)
        if eng.image_exists(ref):
            site = eng.inspect(ref)["OCIv1"]["config"]["Env"]
            site = next(e.split("=", 1)[1] for e in site if e.startswith("VLLM_STANDIN_SITE="))
            figures.append("stand-in base: present (cached)")
        else:
            started = time.monotonic()
            tar = _rootfs_tar(store.root, args.suite, args.mirror)
            after_rootfs = time.monotonic()
            python = args.python or str(envs.ensure(the_lock, store).python)
            site = make_standin(eng, ref, the_lock, python, tar)
            figures.append(
                f"stand-in base created in {time.monotonic() - started:.0f} s "
                f"(rootfs {after_rootfs - started:.0f} s, vllm copy + commit {time.monotonic() - after_rootfs:.0f} s)"
            )
        output.info(f"      vllm in the stand-in: {site}/vllm")

        output.info("== 1. build the real Dockerfile on the stand-in, verify inside")
        # Both builds start from nothing: the layer cache keys on content, not on the timestamps,
        # so a cached layer of an earlier epoch could make two builds agree (or differ) by accident.
        if _build(proj, ref, site, "--no-cache") != 0:
            failures.append("the build or its in-image verify failed")
            raise engine.EngineError("stopping: the image did not build")
        base_layers = len(eng.diff_ids(ref))
        first = eng.diff_ids(TAG)[base_layers:]

        output.info("== 2. rebuild without cache: same layer digests")
        if _build(proj, ref, site, "--no-cache") != 0:
            failures.append("the --no-cache rebuild failed")
        second = eng.diff_ids(TAG)[base_layers:]
        if first == second:
            figures.append(f"reproducible: {len(first)} added layer digests identical across a --no-cache rebuild")
        else:
            failures.append(f"layer digests differ across rebuilds: {first} vs {second}")

        output.info("== 3. a tampered file in a staged layer fails the build")
        staging = image.stage(proj, the_lock, patches, base_image=ref)
        victim = next(  # a file of the last layer: no later layer masks the change
            (staging.root / "layers" / layer.layer / f.path for layer in staging.layers[::-1] for f in layer.files),
            staging.root / "overlay" / "vllm_overlay_status" / "plugin.py",
        )
        with open(victim, "a") as handle:
            handle.write(TAMPER_LINE)
        args_build = {**staging.build_args, "VLLM_SITE_PACKAGES": site}
        code = eng.build(
            staging.root, ["localhost/vllm-overlay-ci:tampered-layer"], args_build, staging.source_date_epoch
        )
        if code == 0:
            failures.append(f"tampered {victim.relative_to(staging.root)} but the build passed")
        else:
            figures.append(f"tampered layer file {victim.relative_to(staging.root)}: build failed as it must")
        image.stage(proj, the_lock, patches, base_image=ref)  # leave build/image as it should be

        output.info("== 4. tampered files in the built image fail verify and the plugin")
        entry = eng.run(
            TAG,
            [
                "python3",
                "-c",
                "from importlib.metadata import entry_points as e; "
                "print([p.value for p in e(group='vllm.general_plugins')])",
            ],
        )
        if "vllm_overlay_status.plugin:register" not in entry[1]:
            failures.append(f"plugin entry point not registered: {entry[1].strip()}")
        plugin = ["python3", "-c", "from vllm_overlay_status.plugin import register; register()"]
        if eng.run(TAG, plugin)[0] != 0:
            failures.append("the plugin fails on the untampered image")
        replaced = sorted(staging.manifest["files"])
        victims = ([replaced[0]] if replaced else []) + ["vllm/envs.py"]
        for rel in victims:
            container = _sh(eng.exe, "from", "--pull=never", TAG).splitlines()[-1]
            try:
                _sh(eng.exe, "run", container, "--", "sh", "-c", f"echo '{TAMPER_LINE.strip()}' >> {site}/{rel}")
                _sh(eng.exe, "commit", "-q", container, "localhost/vllm-overlay-ci:tampered")
            finally:
                subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)
            code, text = eng.run(
                "localhost/vllm-overlay-ci:tampered", ["python3", "-m", "vllm_overlay_status", "verify"]
            )
            if code == 0 or rel not in text:
                failures.append(f"tampered {rel} in the image, but verify said (exit {code}): {text.strip()[-300:]}")
            else:
                figures.append(f"tampered {rel} in the image: verify failed naming it")
            if rel in replaced:
                code, text = eng.run("localhost/vllm-overlay-ci:tampered", plugin)
                if code == 0 or "OverlayMismatch" not in text:
                    failures.append(f"tampered {rel}, but the plugin did not fail: {text.strip()[-300:]}")
                else:
                    figures.append(f"tampered {rel} in the image: the plugin raised OverlayMismatch")
        for ref_ in ("localhost/vllm-overlay-ci:tampered", "localhost/vllm-overlay-ci:tampered-layer"):
            subprocess.run([eng.exe, "rmi", "-f", ref_], capture_output=True, check=False)
    except (lock.LockError, series.SeriesError, image.ImageError, engine.EngineError, FileNotFoundError) as exc:
        output.error(str(exc))
        for line in figures:
            output.result(line)
        return 1 if failures else 2
    for line in figures:
        output.result(line)
    for failure in failures:
        output.error(failure)
    output.result("ci-image: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0
