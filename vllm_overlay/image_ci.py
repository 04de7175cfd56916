"""The image check (scripts/ci-image): the real Dockerfile built FROM a local stand-in base, then tampered.

No registry is reachable on CI machines, so the vllm/vllm-openai base is replaced by a stand-in: a
minimal Debian root filesystem with python3 (debootstrap, cached in the tool's store) holding the
pristine vllm .py files and dist-info of the locked release (the files the checks read; its RECORD
trimmed to them), copied from an interpreter that has them installed (--python; checked against
RECORD first) into the stand-in's system site-packages
(/usr/local/lib/python3.X/dist-packages: the same scheme as the vllm-openai image, whose Python may
differ; the Dockerfile is told the path and proves it). Then:

  1. scripts/build-image builds the real Dockerfile on the stand-in and verifies inside the image;
  2. a second --no-cache build must give the same layer digests (reproducible layers);
  3. a file tampered in a staged layer must make the build's verify step fail;
  4. the built image's SBOM (`python3 -m vllm_overlay_status sbom`) must pass cyclonedx-python-lib's
     schema validator and list exactly the patches of patches/series, and a file tampered in the
     built image (a replaced one and an untouched one) must make `python3 -m vllm_overlay_status
     verify` and the vLLM plugin fail;
  5. (--root-build) the project's own Dockerfile, as `docker build .` builds it: its first stage
     runs on a second stand-in (Debian --tool-suite with python3, venv and git, trusting this
     machine's CA bundle), installs this tool from the package index pip is configured with
     (passed as PIP_INDEX_URL / PIP_EXTRA_INDEX_URL; file:// indexes stay on the host), downloads
     the locked sdist and applies the series; the image must have the same added layer digests
     and the same labels as build-image's;
  6. (--root-build) the project's Dockerfile over a non-root base like vLLM's vllm-openai-nonroot
     target (the stand-in plus user vllm, uid 2000 gid 0, WORKDIR /home/vllm, and vLLM's own
     vllm-nonroot-entrypoint.sh from the locked release as entrypoint), built with
     IMAGE_USER=vllm: the image keeps that user, workdir and entrypoint, and the entrypoint
     wrapper, run as vllm, reaches a verify that passes.

buildah runs with its own storage under the store (CONTAINERS_STORAGE_CONF), driver --storage-driver
(overlay by default; vfs works everywhere but copies the ~1 GB base at every step).
The stand-in's Debian root filesystem comes from the machine's own apt sources (/etc/apt/sources.list,
sources.list.d/*.list and *.sources; ``apt_mirror``) unless --mirror names one.
Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap).

Exit codes (run_checks): 0 every check passed; 1 a check failed; 2 usage, input or environment error.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git

from vllm_overlay import engine, envs, image, indexes, lock, output, project, record, sbom, series, shadow, sources
from vllm_overlay.store import Store
from vllm_overlay.targets import commit_reader

STANDIN = "localhost/vllm-openai-standin:v{version}-py"  # -py: carries the .py files only (see carry_files)
CARRIED_SUFFIXES = (".py",)
TAG = "localhost/vllm-overlay-ci:latest"
ROOT_TAG = "localhost/vllm-overlay-ci:root-build"
NONROOT_TAG = "localhost/vllm-overlay-ci:nonroot"
# The first stage of the project's Dockerfile needs python3 (3.11.4+, with venv), git and CA certificates:
# Debian trixie's (3.13; bookworm's 3.11.2 lacks tarfile's data filter).
TOOL_STANDIN = "localhost/vllm-overlay-tool-standin:{suite}"
TOOL_PACKAGES = ("python3", "python3-venv", "git", "ca-certificates")
NONROOT_USER = "vllm"
NONROOT_HOME = "/home/vllm"
NONROOT_ENTRYPOINT = "/usr/local/bin/vllm-nonroot-entrypoint.sh"
NONROOT_ENTRYPOINT_SOURCE = "docker/entrypoints/vllm-nonroot-entrypoint.sh"  # in the locked release
# vLLM's console script needs torch and a GPU; the wrapper's `exec vllm serve` reaches this stand-in,
# which says who runs it and proves the overlay from that process.
VLLM_STUB = """#!/bin/sh
echo "vllm stand-in: args '$*', user $(id -un) uid $(id -u) gid $(id -g), HOME=$HOME, cwd $(pwd)"
exec python3 -m vllm_overlay_status verify
"""
TAMPER_LINE = "# tampered by ci-image\n"


def _sh(*argv: str, env: dict | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise engine.EngineError(f"{' '.join(argv[:3])}...: {(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout.strip()


def _deb822_sources(text: str) -> list[tuple[list[str], list[str]]]:
    """(URIs, Suites) of each ``Types: deb`` stanza of a deb822 .sources file."""
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            found.append((fields.get("uris", "").split(), fields.get("suites", "").split()))
    return found


def _one_line_sources(text: str) -> list[tuple[list[str], list[str]]]:
    """(URIs, Suites) of each ``deb [options] URI suite components`` line."""
    found = []
    for line in text.splitlines():
        body = line.split("#", 1)[0].strip()
        if not body.startswith("deb "):
            continue
        rest = body[4:].strip()
        if rest.startswith("["):
            rest = rest.split("]", 1)[-1]
        words = rest.split()
        if len(words) >= 2:
            found.append(([words[0]], [words[1]]))
    return found


def apt_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive this machine installs from (its apt sources), for debootstrap.

    The first ``deb`` source whose suites include a release suite (not -security, -updates or
    -backports): sources.list first, then sources.list.d/*.list and *.sources (deb822).
    """
    entries: list[tuple[list[str], list[str]]] = []
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in files:
        if path.is_file():
            entries += _one_line_sources(path.read_text(encoding="utf-8", errors="replace"))
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        entries += _deb822_sources(path.read_text(encoding="utf-8", errors="replace"))
    for uris, suites in entries:
        if uris and any("-" not in suite and "/" not in suite for suite in suites):
            return uris[0]
    raise engine.EngineError(f"no Debian release source in {apt_dir}/sources.list(.d): pass --mirror URL")


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


def _rootfs_tar(store_root: Path, suite: str, mirror: str, packages: tuple[str, ...] = ("python3",)) -> Path:
    name = "python3" if packages == ("python3",) else "tool"
    tar = store_root / "ci" / f"debian-{suite}-{name}.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        raise engine.EngineError("debootstrap is not installed (Debian: apt-get install debootstrap)")
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tar.parent) as work:
        root = Path(work) / "rootfs"
        output.info(f"      debootstrap {suite} (minbase + {', '.join(packages)}) from {mirror}; once, then cached")
        _sh("debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(root), mirror)
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        (root / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        partial = tar.with_suffix(".partial")
        _sh("tar", "--sort=name", "--numeric-owner", "-C", str(root), "-cf", str(partial), ".")
        os.replace(partial, tar)
    return tar


def carry_files(site: Path, dist_info: Path, target: Path) -> tuple[int, int]:
    """Copy into ``target`` what the image checks read: vllm's .py files and its dist-info.

    The checks verify every file RECORD lists, import nothing compiled, and tamper with .py files;
    the package's ~820 MB of compiled extensions and headers are never read, and copying and
    committing them was most of a cold stand-in (564 s of 673 s). The stand-in's RECORD lists
    exactly the files it carries, with the wheel's own hashes, so "the package is its RECORD"
    still holds file for file. Returns (files, bytes) copied.
    """
    record_rel = f"{dist_info.name}/RECORD"
    rows = list(csv.reader((dist_info / "RECORD").read_text(encoding="utf-8").splitlines()))
    kept = []
    size = 0
    for row in rows:
        rel = row[0]
        in_package = rel.startswith("vllm/") and rel.endswith(CARRIED_SUFFIXES)
        if rel == record_rel or not (in_package or rel.startswith(dist_info.name + "/")):
            continue
        source = site / rel
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
        size += source.stat().st_size
        kept.append(row)
    with open(target / record_rel, "w", encoding="utf-8", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows([*kept, [record_rel, "", ""]])
    return len(kept), size


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
        files, size = carry_files(site, Path(dist._path), target)  # type: ignore[attr-defined]
        output.info(
            f"      stand-in carries {files:,} files of vllm ({size / 1e6:.0f} MB): the .py files and dist-info"
        )
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


def machine_ca_bundle() -> Path | None:
    """The CA bundle this machine reaches the index with: pip's ``cert``, else OpenSSL's default file."""
    for candidate in (indexes.pip_cert(), ssl.get_default_verify_paths().cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def make_tool_standin(eng: engine.Engine, ref: str, tar: Path, ca_bundle: Path | None) -> None:
    """The first stage's stand-in: the Debian root filesystem of TOOL_PACKAGES, trusting what this machine trusts.

    A machine whose egress re-signs TLS (a corporate proxy) reaches the index only with its own CA
    bundle; a team there uses a tool image that trusts that CA, and so does this stand-in: the
    bundle replaces the image's, and PIP_CERT names it (pip otherwise trusts only its vendored certifi).
    """
    container = _sh(eng.exe, "from", "scratch").splitlines()[-1]
    try:
        mount = Path(_sh(eng.exe, "mount", container))
        _sh("tar", "-C", str(mount), "-xf", str(tar))
        config = ["--label", "vllm-overlay.stand-in=tool"]
        if ca_bundle is not None:
            target = mount / "etc" / "ssl" / "certs" / "ca-certificates.crt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copyfile(ca_bundle, target)
            config += ["--env", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]
            output.info(f"      tool stand-in trusts this machine's CA bundle ({ca_bundle})")
        _sh(eng.exe, "config", *config, container)
        _sh(eng.exe, "commit", "-q", container, ref)
    finally:
        subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)


def nonroot_entrypoint(the_lock: lock.Lock, store: Store) -> str:
    """vLLM's own non-root entrypoint wrapper, read from the locked release in the upstream cache."""
    upstream = sources.obtain(None, the_lock, store)
    text = commit_reader(git.Repo(store.upstreams_git), upstream.commit)(NONROOT_ENTRYPOINT_SOURCE)
    if text is None:
        raise engine.EngineError(f"vllm {the_lock.version} has no {NONROOT_ENTRYPOINT_SOURCE}")
    return text + "\n"


def make_nonroot_standin(eng: engine.Engine, base: str, ref: str, wrapper: str) -> None:
    """``base`` made like vLLM's vllm-openai-nonroot target (its docker/Dockerfile, 0.33.0).

    The user is created as vLLM's vllm-base stage does (uid 2000, gid 0, group-0 writable home,
    /etc/passwd group-writable for the wrapper); then USER, WORKDIR and ENTRYPOINT as the target sets them.
    """
    container = _sh(eng.exe, "from", "--pull=never", base).splitlines()[-1]
    try:
        mount = Path(_sh(eng.exe, "mount", container))
        script = (
            f"useradd --uid 2000 --gid 0 --create-home --home-dir {NONROOT_HOME} --shell /bin/bash {NONROOT_USER}"
            f" && chmod -R g+rwX {NONROOT_HOME} && chgrp 0 /etc/passwd /etc/group && chmod g=u /etc/passwd /etc/group"
        )
        _sh(eng.exe, "run", container, "--", "sh", "-c", script)
        for rel, text in ((NONROOT_ENTRYPOINT, wrapper), ("/usr/local/bin/vllm", VLLM_STUB)):
            path = mount / rel.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755)
        _sh(
            eng.exe,
            "config",
            "--user",
            NONROOT_USER,
            "--workingdir",
            NONROOT_HOME,
            "--entrypoint",
            json.dumps([NONROOT_ENTRYPOINT]),
            "--label",
            "vllm-overlay.stand-in=nonroot",
            container,
        )
        _sh(eng.exe, "commit", "-q", container, ref)
    finally:
        subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)


def index_build_args() -> dict[str, str]:
    """PIP_INDEX_URL / PIP_EXTRA_INDEX_URL for the first stage: the indexes the tool reads.

    file:// indexes are directories of this machine, which the build cannot see: left out.
    """
    reachable = [url for url in indexes.configured() if url.startswith(("http://", "https://"))]
    found = {}
    if reachable:
        found["PIP_INDEX_URL"] = reachable[0]
    if reachable[1:]:
        found["PIP_EXTRA_INDEX_URL"] = " ".join(reachable[1:])
    return found


def _config(eng: engine.Engine, ref: str) -> dict:
    return eng.inspect(ref)["OCIv1"]["config"]


def root_build_args(ctx: RootBuild) -> dict[str, str]:
    """The --build-args of `docker build .` on the stand-ins, with build-image's host-side label values."""
    return {
        "BASE_IMAGE": ctx.base,
        "TOOL_IMAGE": ctx.tool,
        "VLLM_SITE_PACKAGES": ctx.site,
        **index_build_args(),
        # The labels build-image computes from the host (its git revision and remote, the base's digest).
        "OVERLAY_REVISION": ctx.labels.get("org.opencontainers.image.revision", ""),
        "OVERLAY_SOURCE": ctx.labels.get("org.opencontainers.image.source", ""),
        "OVERLAY_BASE_DIGEST": ctx.labels.get("org.opencontainers.image.base.digest", ""),
    }


def root_build_checks(
    proj: project.Project, eng: engine.Engine, ctx: RootBuild, failures: list[str], figures: list[str]
) -> None:
    """Check 5: the project's Dockerfile built as `docker build .` builds it, against build-image's image."""
    build_args = root_build_args(ctx)
    output.info(f"      index for the first stage: {build_args.get('PIP_INDEX_URL', 'pip default of the tool image')}")
    started = time.monotonic()
    # No layer cache: a layer cached from build-image's build would make the digests agree by construction.
    if eng.build(proj.root, [ROOT_TAG], build_args, ctx.epoch, no_cache=True) != 0:
        failures.append("the project's Dockerfile did not build (see the build output above)")
        return
    seconds = time.monotonic() - started
    added = eng.diff_ids(ROOT_TAG)[len(eng.diff_ids(ctx.base)) :]
    if added == ctx.layers:
        figures.append(
            f"root Dockerfile: built in {seconds:.0f} s (tool stage included); its {len(added)} added layer "
            "digests equal build-image's"
        )
    else:
        pairs = [
            f"{i}: {a[:19]} vs {b[:19]}" for i, (a, b) in enumerate(zip(added, ctx.layers, strict=False)) if a != b
        ]
        failures.append(
            f"root Dockerfile: {len(added)} added layers vs build-image's {len(ctx.layers)}; differ at "
            + ("; ".join(pairs) or "the count")
        )
    labels = eng.labels(ROOT_TAG)
    differing = sorted(k for k in set(labels) | set(ctx.labels) if labels.get(k) != ctx.labels.get(k))
    if differing:
        failures.append(
            "root Dockerfile: labels differ from build-image's: "
            + "; ".join(f"{k}: {labels.get(k)!r} vs {ctx.labels.get(k)!r}" for k in differing)
        )
    else:
        figures.append(f"root Dockerfile: the {len(labels)} labels equal build-image's")


def nonroot_checks(eng: engine.Engine, ref: str, failures: list[str], figures: list[str]) -> None:
    """Check 6 on an image built over the non-root stand-in with IMAGE_USER=vllm."""
    config = _config(eng, ref)
    wanted = {"User": NONROOT_USER, "WorkingDir": NONROOT_HOME, "Entrypoint": [NONROOT_ENTRYPOINT]}
    got = {key: config.get(key) for key in wanted}
    if got != wanted:
        failures.append(f"non-root base: the image's config is {got}, the base's was {wanted}")
    else:
        figures.append(f"non-root base: user {NONROOT_USER}, workdir and vLLM's entrypoint wrapper kept")
    code, text = eng.run(ref, [NONROOT_ENTRYPOINT, "--model", "stand-in"])
    if code != 0 or f"user {NONROOT_USER} uid 2000" not in text or "verified:" not in text:
        failures.append(f"non-root base: the entrypoint wrapper run gave (exit {code}): {text.strip()[-400:]}")
    else:
        figures.append("non-root base: the entrypoint wrapper, run as vllm (uid 2000), reached a passing verify")
    plugin = ["python3", "-c", "from vllm_overlay_status.plugin import register; register()"]
    code, text = eng.run(ref, plugin)
    if code != 0:
        failures.append(f"non-root base: the plugin fails as {NONROOT_USER}: {text.strip()[-300:]}")


@dataclass
class RootBuild:
    """What check 5 compares against: build-image's image on the stand-in."""

    base: str
    tool: str
    site: str
    epoch: int
    layers: list[str]
    labels: dict[str, str]


@dataclass
class Options:
    python: str | None = None  # interpreter whose installed vllm is the pristine source
    storage_driver: str = "overlay"
    suite: str = "bookworm"
    tool_suite: str = "trixie"  # the first stage's stand-in (check 5)
    mirror: str | None = None  # None: the machine's own apt sources
    rebuild_base: bool = False
    root_build: bool = False  # checks 5 and 6: the project's Dockerfile, and a non-root base


# build(base, site, *extra build-image arguments, tag=TAG) -> exit code of scripts/build-image
Build = Callable[..., int]


def run_checks(proj: project.Project, options: Options, build: Build) -> int:
    """Every check in order; ``build`` runs scripts/build-image on the stand-in."""
    args = options
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
            tar = _rootfs_tar(store.root, args.suite, args.mirror or apt_mirror())
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
        if build(ref, site, "--no-cache") != 0:
            failures.append("the build or its in-image verify failed")
            raise engine.EngineError("stopping: the image did not build")
        base_layers = len(eng.diff_ids(ref))
        first = eng.diff_ids(TAG)[base_layers:]

        output.info("== 2. rebuild without cache: same layer digests")
        if build(ref, site, "--no-cache") != 0:
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
        code, text = eng.run(TAG, ["python3", "-m", "vllm_overlay_status", "sbom"])
        sbom_problems = [f"exit {code}"] if code != 0 else sbom.problems(text, [p.name for p in patches])
        if sbom_problems:
            failures.append("the image's SBOM: " + "; ".join(sbom_problems))
        else:
            figures.append(f"SBOM: valid CycloneDX {sbom.SCHEMA.to_version()}, pedigree = the {len(patches)} patches")
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

        if args.root_build:
            output.info("== 5. the project's Dockerfile, as `docker build .` builds it: same layers, same labels")
            if staging.root_defaults is None:
                raise engine.EngineError("--root-build compares at the series' own epoch: unset SOURCE_DATE_EPOCH")
            tool = TOOL_STANDIN.format(suite=args.tool_suite)
            if args.rebuild_base and eng.image_exists(tool):
                _sh(eng.exe, "rmi", "-f", tool)
            if not eng.image_exists(tool):
                started = time.monotonic()
                rootfs = _rootfs_tar(store.root, args.tool_suite, args.mirror or apt_mirror(), TOOL_PACKAGES)
                make_tool_standin(eng, tool, rootfs, machine_ca_bundle())
                figures.append(f"tool stand-in {tool} created in {time.monotonic() - started:.0f} s")
            context = RootBuild(ref, tool, site, staging.source_date_epoch, second, eng.labels(TAG))
            root_build_checks(proj, eng, context, failures, figures)

            output.info("== 6. over a non-root base (vLLM's vllm-openai-nonroot target) with IMAGE_USER=vllm")
            nonroot = f"{ref}-nonroot"
            make_nonroot_standin(eng, ref, nonroot, nonroot_entrypoint(the_lock, store))
            # As the README says to build it: docker build . with BASE_IMAGE and IMAGE_USER (the tool
            # stage comes from check 5's layer cache; check 5 proved what it makes).
            nonroot_args = {**root_build_args(context), "BASE_IMAGE": nonroot, "IMAGE_USER": NONROOT_USER}
            if eng.build(proj.root, [NONROOT_TAG], nonroot_args, staging.source_date_epoch) != 0:
                failures.append("docker build . over the non-root stand-in failed (see the build output above)")
            else:
                nonroot_checks(eng, NONROOT_TAG, failures, figures)
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
