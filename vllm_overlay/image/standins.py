"""The stand-in images the image check builds on: no registry is reachable on CI machines.

- the vllm-openai stand-in: a minimal Debian root filesystem with python3 (debootstrap, cached in
  the tool's store) holding the pristine vllm .py files and dist-info of the locked release (the
  files the checks read; its RECORD trimmed to them), copied from an interpreter that has them
  installed (checked against RECORD first) into the system site-packages
  (/usr/local/lib/python3.X/dist-packages: the same scheme as the vllm-openai image, whose Python
  may differ; the Dockerfile is told the path and proves it);
- the tool stand-in, for the first stage of the project's Dockerfile: Debian with python3, venv,
  git and this machine's CA bundle;
- the non-root stand-in: the vllm-openai stand-in made the way vLLM's vllm-openai-nonroot target is.

The Debian root filesystems come from the machine's own apt sources (/etc/apt/sources.list,
sources.list.d/*.list and *.sources; ``apt_mirror``) unless a mirror is named.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

import git

from vllm_overlay import output
from vllm_overlay.audit.targets import commit_reader
from vllm_overlay.env import record, shadow, wheel_record
from vllm_overlay.image import engine
from vllm_overlay.store import Store
from vllm_overlay.upstream import indexes, lock
from vllm_overlay.upstream import trees as upstream_trees

STANDIN = "localhost/vllm-openai-standin:v{version}-py"  # -py: carries the .py files only (see carry_files)
CARRIED_SUFFIXES = (".py",)
# The Dockerfile's VLLM_RECORD_SCOPE for a build on the stand-in: the in-image verify checks the cut of
# the wheel's RECORD the stand-in carries (record.scoped_rows), and says so in every verdict.
STANDIN_SCOPE = ",".join(CARRIED_SUFFIXES)
# The first stage of the project's Dockerfile needs python3 (3.11+, with venv), git and CA certificates:
# Debian bookworm's (3.11.2, without tarfile's data filter: safetar's own checks). README command 1
# runs on the same stand-in (readme_ci).
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


def sh(*argv: str, env: dict | None = None) -> str:
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


def rootfs_tar(
    ci: Path, suite: str, mirror: str, packages: tuple[str, ...] = ("python3",), name: str | None = None
) -> Path:
    """The minbase root filesystem of ``suite`` with ``packages`` (debootstrap once), as a tar kept in
    ``ci``, the cache's CI folder (``Store.ci``)."""
    name = name or ("python3" if packages == ("python3",) else "tool")
    tar = ci / f"debian-{suite}-{name}.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        raise engine.EngineError("debootstrap is not installed (Debian: apt-get install debootstrap)")
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tar.parent) as work:
        root = Path(work) / "rootfs"
        output.info(f"      debootstrap {suite} (minbase + {', '.join(packages)}) from {mirror}; once, then cached")
        sh("debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(root), mirror)
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        (root / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        partial = tar.with_suffix(".partial")
        sh("tar", "--sort=name", "--numeric-owner", "-C", str(root), "-cf", str(partial), ".")
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
    expected = wheel_record.locked(the_lock, Store()).text  # the lock's wheel, never the installed RECORD
    problems = record.verify_distribution(site, "vllm", expected=expected)
    if problems:
        raise engine.EngineError(f"{site}: vllm is not pristine ({len(problems)} problem(s), first: {problems[0]})")
    container = sh(eng.exe, "from", "scratch").splitlines()[-1]
    try:
        mount = Path(sh(eng.exe, "mount", container))
        sh("tar", "-C", str(mount), "-xf", str(tar))
        purelib = sh(
            eng.exe, "run", container, "--", "python3", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"
        ).splitlines()[-1]
        target = mount / purelib.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        files, size = carry_files(site, Path(dist._path), target)  # type: ignore[attr-defined]
        output.info(
            f"      stand-in carries {files:,} files of vllm ({size / 1e6:.0f} MB): the .py files and dist-info"
        )
        sh(
            eng.exe,
            "config",
            "--label",
            "vllm-overlay.stand-in=true",
            "--env",
            "VLLM_STANDIN_SITE=" + purelib,
            container,
        )
        sh(eng.exe, "commit", "-q", container, ref)
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
    container = sh(eng.exe, "from", "scratch").splitlines()[-1]
    try:
        mount = Path(sh(eng.exe, "mount", container))
        sh("tar", "-C", str(mount), "-xf", str(tar))
        config = ["--label", "vllm-overlay.stand-in=tool"]
        if ca_bundle is not None:
            target = mount / "etc" / "ssl" / "certs" / "ca-certificates.crt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copyfile(ca_bundle, target)
            config += ["--env", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]
            output.info(f"      tool stand-in trusts this machine's CA bundle ({ca_bundle})")
        sh(eng.exe, "config", *config, container)
        sh(eng.exe, "commit", "-q", container, ref)
    finally:
        subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)


def nonroot_entrypoint(the_lock: lock.Lock, store: Store) -> str:
    """vLLM's own non-root entrypoint wrapper, read from the locked release in the upstream cache."""
    upstream = upstream_trees.obtain(None, the_lock, store)
    text = commit_reader(git.Repo(store.upstreams_git), upstream.commit)(NONROOT_ENTRYPOINT_SOURCE)
    if text is None:
        raise engine.EngineError(f"vllm {the_lock.version} has no {NONROOT_ENTRYPOINT_SOURCE}")
    return text + "\n"


def make_nonroot_standin(eng: engine.Engine, base: str, ref: str, wrapper: str) -> None:
    """``base`` made like vLLM's vllm-openai-nonroot target (its docker/Dockerfile, 0.33.0).

    The user is created as vLLM's vllm-base stage does (uid 2000, gid 0, group-0 writable home,
    /etc/passwd group-writable for the wrapper); then USER, WORKDIR and ENTRYPOINT as the target sets them.
    """
    container = sh(eng.exe, "from", "--pull=never", base).splitlines()[-1]
    try:
        mount = Path(sh(eng.exe, "mount", container))
        script = (
            f"useradd --uid 2000 --gid 0 --create-home --home-dir {NONROOT_HOME} --shell /bin/bash {NONROOT_USER}"
            f" && chmod -R g+rwX {NONROOT_HOME} && chgrp 0 /etc/passwd /etc/group && chmod g=u /etc/passwd /etc/group"
        )
        sh(eng.exe, "run", container, "--", "sh", "-c", script)
        for rel, text in ((NONROOT_ENTRYPOINT, wrapper), ("/usr/local/bin/vllm", VLLM_STUB)):
            path = mount / rel.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755)
        sh(
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
        sh(eng.exe, "commit", "-q", container, ref)
    finally:
        subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)
