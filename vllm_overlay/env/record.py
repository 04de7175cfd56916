"""Prove an installed distribution is what its wheel installed, file by file, from the wheel's RECORD.

A wheel's ``*.dist-info/RECORD`` lists every file it installs with its sha256 and size. The
installed copy of that RECORD is one of the files under check, so it is never the expectation:
the caller passes the RECORD text from a source the build verified (the locked wheel, checked
against upstream.lock's sha256, or the copy whose sha256 the image's manifest states). The
installed RECORD must then exist and agree with it row for row (installers add only their own
rows: INSTALLER, REQUESTED, direct_url.json, bytecode caches, scripts outside site-packages).
Every recorded file is checked with lstat (a symlink is reported, never followed) and read
without following links; every file, directory and symlink under the distribution's package
directories and its dist-info is accounted for. ``replaced`` (path -> sha256 of the files an
overlay deliberately replaced or added) proves that exactly those files, and no others, differ.

STANDARD LIBRARY ONLY, and nothing else from this package: a copy of this file ships inside the
container image and runs there as
``python3 record.py SITE_PACKAGES --expected-record WHEEL_RECORD [--dist vllm] [--replaced F]``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import hashlib
import importlib.metadata
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

BLOCK = 1 << 20
# Files an installer writes into the dist-info beside what the wheel holds (PEP 376 / 610, uv's cache key).
INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"})
BYTECODE_DIR = "__pycache__"

Rows = dict[str, tuple[str | None, int | None]]


@dataclass(frozen=True)
class Problem:
    path: str  # relative to site-packages, POSIX separators
    # modified | missing | size | symlink | not-a-file | unrecorded | replaced-mismatch | replaced-missing
    # | no-dist | record-missing | record-altered | no-expectation
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}" + (f" ({self.detail})" if self.detail else "")


def _open_nofollow(path: Path | str) -> int:
    """A descriptor of ``path`` itself: opening a symlink fails instead of reading its target."""
    return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))


def file_sha256(path: Path | str) -> str:
    """Hex sha256 of a file's bytes (a symlink is not followed: OSError)."""
    digest = hashlib.sha256()
    with os.fdopen(_open_nofollow(path), "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes (how a RECORD's digest is stated in the manifest)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_hash(hex_digest: str) -> str:
    """The RECORD spelling of a sha256: ``sha256=<urlsafe base64 without padding>``."""
    return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(hex_digest)).rstrip(b"=").decode("ascii")


def to_hex(value: str) -> str:
    """Accept a hex digest, ``sha256=<b64>`` (RECORD) or ``sha256:<hex>``; return lowercase hex."""
    value = value.strip()
    if value.startswith("sha256="):
        raw = value[len("sha256=") :]
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    if value.startswith("sha256:"):
        value = value[len("sha256:") :]
    if len(value) != 64 or any(c not in "0123456789abcdefABCDEF" for c in value):
        raise ValueError(f"not a sha256 digest: {value!r}")
    return value.lower()


def check_file(path: Path | str, expected: str) -> bool:
    """True if ``path`` is a regular file (not a symlink) whose sha256 equals ``expected``."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode) and file_sha256(path) == to_hex(expected)
    except OSError:
        return False


def find_distribution(site_packages: Path, dist: str) -> importlib.metadata.Distribution | None:
    """The distribution named ``dist`` installed in exactly this directory (no sys.path search)."""
    # ``name`` narrows the search to that distribution's metadata directories (matched by their
    # normalized names) instead of parsing every installed distribution's METADATA.
    for candidate in importlib.metadata.distributions(path=[str(site_packages)], name=dist):
        name = (candidate.metadata["Name"] or "").replace("_", "-").lower()
        if name == dist.replace("_", "-").lower():
            return candidate
    return None


_DATA_SCHEME = re.compile(r"^[^/]+\.data/(purelib|platlib)/(.+)$")


def parse_record(text: str) -> Rows:
    """A RECORD's rows as ``{path relative to site-packages: (hex sha256 or None, size or None)}``.

    Rows outside site-packages (``../../../bin/x`` scripts) are left out; a wheel's
    ``<name>.data/purelib/X`` and ``platlib/X`` rows are where an installer puts them (``X``),
    its other ``.data`` schemes go outside site-packages and are left out too.
    """
    rows: Rows = {}
    for row in csv.reader(text.splitlines()):
        if not row or not row[0]:
            continue
        name, recorded_hash, size = [*row, "", ""][:3]
        rel = PurePosixPath(name).as_posix()
        if rel.startswith(("../", "/")) or ".." in PurePosixPath(rel).parts:
            continue
        first = rel.split("/", 1)[0]
        if first.endswith(".data"):
            data = _DATA_SCHEME.match(rel)
            if data is None:
                continue
            rel = data.group(2)
        rows[rel] = (_digest(recorded_hash), int(size) if size.isdigit() else None)
    return rows


def _digest(recorded_hash: str) -> str | None:
    """A RECORD hash field as hex; one that is not a readable sha256 stays as written (it matches no file)."""
    if not recorded_hash:
        return None
    mode, _, value = recorded_hash.partition("=")
    try:
        return to_hex("sha256=" + value) if mode == "sha256" else None if not value else f"unreadable {recorded_hash}"
    except (ValueError, binascii.Error):
        return f"unreadable {recorded_hash}"


def dist_info_of(rows: Rows) -> str | None:
    """The dist-info directory a RECORD belongs to: the one holding its ``RECORD`` row."""
    found = {rel.split("/", 1)[0] for rel in rows if rel.endswith(".dist-info/RECORD") and rel.count("/") == 1}
    return found.pop() if len(found) == 1 else None


def scoped_rows(rows: Rows, suffixes: tuple[str, ...]) -> Rows:
    """The rows a reduced install keeps: its dist-info and the package files ending in ``suffixes``.

    A stand-in base carries vLLM's .py files only; this is the one rule both its RECORD and the
    expectation it is checked against are cut by (empty ``suffixes``: every row).
    """
    if not suffixes:
        return dict(rows)
    dist_info = dist_info_of(rows)
    return {rel: row for rel, row in rows.items() if rel.split("/", 1)[0] == dist_info or rel.endswith(suffixes)}


def _installer_row(rel: str, dist_info: str) -> bool:
    """A row an installer adds to RECORD that the wheel's RECORD does not hold."""
    parts = rel.split("/")
    if len(parts) >= 2 and parts[-2] == BYTECODE_DIR and parts[-1].endswith(".pyc"):
        return True
    return len(parts) == 2 and parts[0] == dist_info and parts[1] in INSTALLER_FILES


def installed_record_problems(site_packages: Path, dist_info: str, expected: Rows) -> list[Problem]:
    """The installed RECORD against the expected one: missing, empty, a symlink, or any row altered."""
    rel = f"{dist_info}/RECORD"
    path = site_packages / rel
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return [Problem(rel, "record-missing", "the installed RECORD is gone")]
    if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
        return [Problem(rel, "record-altered", "not a regular file")]
    with os.fdopen(_open_nofollow(path), "r", encoding="utf-8", errors="replace", newline="") as handle:
        installed = parse_record(handle.read())
    if not installed:
        return [Problem(rel, "record-missing", "the installed RECORD is empty")]
    problems = []
    for name, row in sorted(expected.items()):
        if name not in installed:
            problems.append(Problem(rel, "record-altered", f"row {name} is missing"))
        elif installed[name] != row and name != rel:
            problems.append(Problem(rel, "record-altered", f"row {name} differs from the wheel's"))
    for name in sorted(set(installed) - set(expected)):
        if not _installer_row(name, dist_info):
            problems.append(Problem(rel, "record-altered", f"row {name} is not in the wheel's RECORD"))
    return problems


def _check_recorded(site_packages: Path, rel: str, digest: str | None, size: int | None) -> Problem | None:
    """One recorded file: there, a regular file (lstat), of the recorded size and sha256."""
    path = site_packages / rel
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Problem(rel, "missing")
    if stat.S_ISLNK(st.st_mode):
        return Problem(rel, "symlink", f"-> {os.readlink(path)}")
    if not stat.S_ISREG(st.st_mode):
        return Problem(rel, "not-a-file")
    if digest is None:  # RECORD itself, or bytecode recorded without a hash: presence is all RECORD states
        return None
    if size is not None and st.st_size != size:
        return Problem(rel, "size", f"{st.st_size} bytes, RECORD says {size}")
    try:
        actual = file_sha256(path)
    except OSError as exc:
        return Problem(rel, "modified", f"cannot be read: {exc.strerror}")
    return None if actual == digest else Problem(rel, "modified")


def _check_replaced(site_packages: Path, rel: str, digest: str) -> Problem | None:
    """A file an overlay replaced or added: a regular file with the manifest's sha256."""
    path = site_packages / rel
    try:
        st = os.lstat(path)
    except OSError:
        return Problem(rel, "replaced-missing")
    if stat.S_ISLNK(st.st_mode):
        return Problem(rel, "symlink", f"-> {os.readlink(path)}")
    if not stat.S_ISREG(st.st_mode):
        return Problem(rel, "replaced-missing", "not a regular file")
    actual = file_sha256(path)
    return None if actual == digest else Problem(rel, "replaced-mismatch", f"sha256 {actual}")


def verify_distribution(
    site_packages: Path | str,
    dist: str = "vllm",
    replaced: dict[str, str] | None = None,
    *,
    expected: str,
    suffixes: tuple[str, ...] = (),
    check_unrecorded: bool = True,
    workers: int = 8,
    proven: Callable[[str], bool] | None = None,
) -> list[Problem]:
    """Every way the installed ``dist`` differs from the wheel's RECORD ``expected`` (empty list: pristine).

    ``expected`` is the wheel's RECORD text from a source the caller verified, never the installed
    copy. ``replaced`` maps paths relative to ``site_packages`` (``vllm/x/y.py``) to the sha256 they
    must have instead of the recorded one (an overlay's replaced or added files). ``suffixes`` cuts
    the expectation as a reduced install was cut (:func:`scoped_rows`). With ``check_unrecorded``,
    every entry under the package directories and the dist-info that neither lists is a problem
    (an added module, a symlinked directory, an empty directory: each changes what ``import``
    finds; ``__pycache__`` holds bytecode, checked elsewhere, and only its symlinks are reported).
    ``proven(rel)`` True says a recorded file was hashed before and has not changed since (the
    caller keeps that proof, e.g. by the file's stat): it is not read again.
    """
    site_packages = Path(site_packages)
    replaced = {k: to_hex(v) for k, v in (replaced or {}).items()}
    rows = scoped_rows(parse_record(expected), suffixes)
    dist_info = dist_info_of(rows)
    if dist_info is None:
        return [Problem(dist, "no-expectation", "the expected RECORD is empty or names no dist-info RECORD")]
    if find_distribution(site_packages, dist) is None or not (site_packages / dist_info).is_dir():
        return [Problem(dist, "no-dist", f"no {dist_info} in {site_packages}")]
    problems = installed_record_problems(site_packages, dist_info, rows)

    def check(item: tuple[str, tuple[str | None, int | None]]) -> Problem | None:
        rel, (digest, size) = item
        if rel == f"{dist_info}/RECORD":
            return None  # the installed RECORD: checked row by row above
        if rel in replaced:
            return _check_replaced(site_packages, rel, replaced[rel])
        return _check_recorded(site_packages, rel, digest, size)

    items = sorted(rows.items())
    if proven is not None:  # what an earlier check hashed and nothing changed since is not read again
        items = [item for item in items if item[0] in replaced or item[1][0] is None or not proven(item[0])]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems += [p for p in pool.map(check, items) if p is not None]
    problems += [
        p for rel in sorted(set(replaced) - set(rows)) if (p := _check_replaced(site_packages, rel, replaced[rel]))
    ]
    if check_unrecorded:
        problems += _unaccounted(site_packages, rows, replaced, dist_info, dist)
    return problems


def _owned_tops(rows: Rows, replaced: dict[str, str], dist_info: str) -> list[str]:
    """The directories the distribution owns: its packages (``vllm``) and its dist-info."""
    firsts = {rel.split("/", 1)[0] for rel in [*rows, *replaced] if "/" in rel}
    return sorted(first for first in firsts if not first.endswith(".data")) or [dist_info]


def _unaccounted(site_packages: Path, rows: Rows, replaced: dict[str, str], dist_info: str, dist: str) -> list[Problem]:
    """Entries under the owned directories that neither the RECORD nor ``replaced`` accounts for."""
    known = set(rows) | set(replaced)
    known_dirs = {str(PurePosixPath(rel).parent) for rel in known}
    known_dirs |= {str(parent) for rel in known_dirs for parent in PurePosixPath(rel).parents}
    problems: list[Problem] = []
    for top in _owned_tops(rows, replaced, dist_info):
        root = site_packages / top
        try:
            if stat.S_ISLNK(os.lstat(root).st_mode):
                problems.append(Problem(top, "symlink", f"-> {os.readlink(root)}"))
                continue
        except OSError:
            continue  # gone: its recorded files are reported missing
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(site_packages).as_posix()
            in_cache = PurePosixPath(rel_dir).name == BYTECODE_DIR
            descend = []
            for name in sorted(dirnames):
                rel = f"{rel_dir}/{name}"
                if os.path.islink(os.path.join(dirpath, name)):
                    problems.append(Problem(rel, "symlink", f"directory -> {os.readlink(os.path.join(dirpath, name))}"))
                elif (name == BYTECODE_DIR and not in_cache) or rel in known_dirs:
                    descend.append(name)
                else:
                    problems.append(Problem(rel, "unrecorded", "directory"))
            dirnames[:] = descend
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}"
                is_link = os.path.islink(os.path.join(dirpath, name))
                if in_cache:
                    if is_link:
                        problems.append(Problem(rel, "symlink", f"-> {os.readlink(os.path.join(dirpath, name))}"))
                    continue
                if rel in known or (rel_dir == dist_info and (name in INSTALLER_FILES or name == "RECORD")):
                    continue  # recorded files are checked with lstat above; the installer's own files
                if is_link:
                    problems.append(Problem(rel, "symlink", f"-> {os.readlink(os.path.join(dirpath, name))}"))
                else:
                    problems.append(Problem(rel, "unrecorded"))
    problems += _other_dist_infos(site_packages, dist, dist_info)
    return problems


def _other_dist_infos(site_packages: Path, dist: str, dist_info: str) -> list[Problem]:
    """Another metadata directory of the same distribution: ``importlib.metadata`` may read it instead."""
    wanted = re.sub(r"[-_.]+", "_", dist).lower()
    problems = []
    for entry in sorted(os.listdir(site_packages)):
        stem, dot, suffix = entry.rpartition(".")
        if not dot or suffix not in ("dist-info", "egg-info") or entry == dist_info:
            continue
        if re.sub(r"[-_.]+", "_", stem.split("-", 1)[0]).lower() == wanted:
            problems.append(Problem(entry, "unrecorded", f"another metadata directory of {dist}"))
    return problems


def load_manifest(path: Path) -> dict[str, str]:
    """Replaced files from a JSON manifest: ``{path: sha256}`` or ``{"files": {path: sha256}}``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict) and isinstance(data.get("files"), dict):
        data = data["files"]
    if isinstance(data, dict) and isinstance(data.get("files"), list):
        data = {entry["path"]: entry["sha256"] for entry in data["files"]}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object mapping paths to sha256 digests")
    return {str(k): str(v) for k, v in data.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("site_packages", type=Path, help="directory holding the package and its dist-info")
    parser.add_argument(
        "--expected-record", type=Path, required=True, help="the wheel's RECORD, from a source you verified"
    )
    parser.add_argument("--dist", default="vllm", help="distribution name (default: vllm)")
    parser.add_argument("--replaced", type=Path, default=None, help="JSON manifest of replaced files")
    parser.add_argument("--allow-unrecorded", action="store_true", help="do not report files RECORD lacks")
    args = parser.parse_args(argv)
    replaced = load_manifest(args.replaced) if args.replaced else None
    problems = verify_distribution(
        args.site_packages,
        args.dist,
        replaced,
        expected=args.expected_record.read_text(encoding="utf-8"),
        check_unrecorded=not args.allow_unrecorded,
    )
    for problem in problems:
        print(problem, file=sys.stderr)
    what = "pristine" if not replaced else f"pristine apart from {len(replaced)} replaced file(s), which match"
    print(f"{args.dist} in {args.site_packages}: " + (what if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
