"""Prove an installed distribution is what its wheel installed, file by file, from its RECORD.

A wheel's ``*.dist-info/RECORD`` lists every installed file with its sha256 and size. Comparing
the files on disk with it proves an installation pristine; passing ``replaced`` (path -> sha256 of
the files an overlay deliberately replaced or added) proves that exactly those files, and no
others, differ from the wheel.

STANDARD LIBRARY ONLY, and nothing else from this package: a copy of this file ships inside the
container image and runs there as ``python3 record.py SITE_PACKAGES [--dist vllm] [--replaced F]``.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

BLOCK = 1 << 20


@dataclass(frozen=True)
class Problem:
    path: str  # relative to site-packages, POSIX separators
    kind: str  # modified | missing | size | unrecorded | replaced-mismatch | replaced-missing | no-dist
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}" + (f" ({self.detail})" if self.detail else "")


def file_sha256(path: Path | str) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """True if the file exists and its sha256 equals ``expected`` (any spelling :func:`to_hex` takes)."""
    try:
        return file_sha256(path) == to_hex(expected)
    except FileNotFoundError:
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


def recorded_files(site_packages: Path, dist: str) -> dict[str, tuple[str | None, int | None]]:
    """RECORD of ``dist`` as ``{relative path: (hex sha256 or None, size or None)}``.

    Only entries inside ``site_packages`` are kept (``../../../bin/x`` entry-point scripts are not
    part of the package). RECORD is read as it is, not through ``Distribution.files``, which from
    Python 3.12 leaves out the files missing on disk: a deleted file would go unreported.
    """
    distribution = find_distribution(site_packages, dist)
    if distribution is None:
        raise LookupError(f"no distribution {dist!r} in {site_packages}")
    result: dict[str, tuple[str | None, int | None]] = {}
    for row in csv.reader((distribution.read_text("RECORD") or "").splitlines()):
        if not row or not row[0]:
            continue
        name, recorded_hash, size = [*row, "", ""][:3]
        rel = PurePosixPath(name).as_posix()
        if rel.startswith("../") or rel.startswith("/"):
            continue
        mode, _, value = recorded_hash.partition("=")
        digest = to_hex("sha256=" + value) if mode == "sha256" and value else None
        result[rel] = (digest, int(size) if size else None)
    return result


def _top_level_dirs(site_packages: Path, recorded: dict[str, tuple[str | None, int | None]]) -> set[str]:
    """Package directories the distribution owns (``vllm``), not its dist-info."""
    firsts = {rel.split("/", 1)[0] for rel in recorded if "/" in rel}
    owned = {first for first in firsts if not first.endswith((".dist-info", ".data"))}
    return {first for first in owned if (site_packages / first).is_dir()}


def verify_distribution(
    site_packages: Path | str,
    dist: str = "vllm",
    replaced: dict[str, str] | None = None,
    *,
    check_unrecorded: bool = True,
    workers: int = 8,
    proven: Callable[[str], bool] | None = None,
) -> list[Problem]:
    """Every way the installed ``dist`` differs from its RECORD (empty list: pristine).

    ``replaced`` maps paths relative to ``site_packages`` (``vllm/x/y.py``) to the sha256 they must
    have instead of the recorded one (an overlay's replaced or added files). With
    ``check_unrecorded``, files inside the package directories that RECORD does not list (other than
    ``__pycache__``) are problems too: an added module changes what ``import`` finds.
    ``proven(rel)`` True says a recorded file was hashed against RECORD before and has not changed
    since (the caller keeps that proof, e.g. by the file's stat): it is not read again.
    """
    site_packages = Path(site_packages)
    replaced = {k: to_hex(v) for k, v in (replaced or {}).items()}
    try:
        recorded = recorded_files(site_packages, dist)
    except LookupError as exc:
        return [Problem(dist, "no-dist", str(exc))]

    def check(item: tuple[str, tuple[str | None, int | None]]) -> Problem | None:
        rel, (digest, size) = item
        path = site_packages / rel
        if rel in replaced:
            if not path.is_file():
                return Problem(rel, "replaced-missing")
            actual = file_sha256(path)
            return None if actual == replaced[rel] else Problem(rel, "replaced-mismatch", f"sha256 {actual}")
        if digest is None:  # RECORD itself, or .pyc files pip recorded without a hash
            return None
        if not path.is_file():
            return Problem(rel, "missing")
        if size is not None and path.stat().st_size != size:
            return Problem(rel, "size", f"{path.stat().st_size} bytes, RECORD says {size}")
        return None if file_sha256(path) == digest else Problem(rel, "modified")

    items = sorted(recorded.items())
    if proven is not None:  # what an earlier check hashed and nothing changed since is not read again
        items = [item for item in items if item[0] in replaced or item[1][0] is None or not proven(item[0])]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems = [p for p in pool.map(check, items) if p is not None]
    problems += _added_problems(site_packages, recorded, replaced)
    if check_unrecorded:
        problems += _unrecorded(site_packages, recorded, replaced)
    return problems


def _added_problems(
    site_packages: Path, recorded: dict[str, tuple[str | None, int | None]], replaced: dict[str, str]
) -> list[Problem]:
    """The files an overlay added (in ``replaced``, not in RECORD) that are missing or differ."""
    problems: list[Problem] = []
    for rel in sorted(set(replaced) - set(recorded)):  # files an overlay added
        path = site_packages / rel
        if not path.is_file():
            problems.append(Problem(rel, "replaced-missing"))
        elif file_sha256(path) != replaced[rel]:
            problems.append(Problem(rel, "replaced-mismatch"))
    return problems


def _unrecorded(
    site_packages: Path, recorded: dict[str, tuple[str | None, int | None]], replaced: dict[str, str]
) -> list[Problem]:
    """Files in the package directories that neither RECORD nor ``replaced`` lists (``__pycache__`` aside)."""
    problems: list[Problem] = []
    known = set(recorded) | set(replaced)
    for top in sorted(_top_level_dirs(site_packages, recorded)):
        for dirpath, dirnames, filenames in os.walk(site_packages / top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel_dir = Path(dirpath).relative_to(site_packages).as_posix()
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}"
                if rel not in known:
                    problems.append(Problem(rel, "unrecorded"))
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
    parser.add_argument("--dist", default="vllm", help="distribution name (default: vllm)")
    parser.add_argument("--replaced", type=Path, default=None, help="JSON manifest of replaced files")
    parser.add_argument("--allow-unrecorded", action="store_true", help="do not report files RECORD lacks")
    args = parser.parse_args(argv)
    replaced = load_manifest(args.replaced) if args.replaced else None
    problems = verify_distribution(args.site_packages, args.dist, replaced, check_unrecorded=not args.allow_unrecorded)
    for problem in problems:
        print(problem, file=sys.stderr)
    what = "pristine" if not replaced else f"pristine apart from {len(replaced)} replaced file(s), which match"
    print(f"{args.dist} in {args.site_packages}: " + (what if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
