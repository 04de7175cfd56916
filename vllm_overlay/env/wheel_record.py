"""The locked wheel's RECORD: what every check of installed vLLM files is held to.

An installed ``*.dist-info/RECORD`` is one of the files a check must check, so it can never say
what the files should be: an edited module with its RECORD row rewritten, or RECORD deleted, would
prove itself. The expectation comes from the wheel instead, downloaded and checked against the
sha256 its lock pins (upstream.lock's ``[artifacts.wheel-<arch>]``; cpu/runtime.lock's wheel for
the CPU runtime), the RECORD read out of the archive. Only that RECORD is kept in the cache
(``downloads/<wheel>.RECORD``, beside a line naming the wheel's and the RECORD's sha256): the
wheel itself (about 340 MB for vLLM 0.33.0) is deleted once read unless a caller installs from it.
"""

from __future__ import annotations

import platform
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import atomicfile, output
from vllm_overlay.env import record
from vllm_overlay.errors import InputError
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees
from vllm_overlay.upstream.lock import Lock

SUFFIX = ".RECORD"
_RECORD_MEMBER = re.compile(r"^[^/]+\.dist-info/RECORD$")


class WheelRecordError(InputError, RuntimeError):
    """The locked wheel, or its RECORD, cannot be had or is not what the lock pins."""


@dataclass(frozen=True)
class WheelRecord:
    """A wheel's RECORD text and where it came from."""

    wheel: str  # the wheel's file name
    wheel_sha256: str  # as its lock pins it (the download was checked against it)
    text: str

    @property
    def sha256(self) -> str:
        """sha256 of the RECORD's UTF-8 text: what the image's manifest states."""
        return record.text_sha256(self.text)

    def to_json(self) -> dict[str, str]:
        return {"wheel": self.wheel, "wheel_sha256": self.wheel_sha256, "sha256": self.sha256}


def read_from_wheel(wheel: Path) -> str:
    """The RECORD inside a wheel archive (its one top-level ``*.dist-info/RECORD``)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [name for name in archive.namelist() if _RECORD_MEMBER.match(name)]
            if len(members) != 1:
                raise WheelRecordError(f"{wheel.name}: {len(members)} dist-info RECORD files, expected exactly one")
            text = archive.read(members[0]).decode("utf-8")
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise WheelRecordError(f"{wheel.name}: cannot read its RECORD ({exc})") from exc
    if not record.parse_record(text):
        raise WheelRecordError(f"{wheel.name}: its RECORD is empty")
    return text


def wheel_for(lock: Lock, arch: str | None = None) -> tuple[str, str]:
    """(file name, sha256) of the locked wheel for ``arch`` (default: this machine's)."""
    arch = arch or platform.machine()
    artifact = lock.wheels.get(arch)
    if artifact is None:
        raise WheelRecordError(
            f"upstream.lock pins no {lock.project} wheel for {arch} "
            f"(it has: {', '.join(sorted(lock.wheels)) or 'none'}); "
            "the installed files are checked against the locked wheel's RECORD"
        )
    return artifact.filename, artifact.sha256


def locked(lock: Lock, store: Store, arch: str | None = None) -> WheelRecord:
    """The RECORD of upstream.lock's wheel for ``arch``: from the cache, else downloaded and checked."""
    filename, sha256 = wheel_for(lock, arch)
    return fetched(store, lock.project, lock.version, filename, sha256)


def _cached(store: Store, filename: str, sha256: str) -> WheelRecord | None:
    text_path = store.downloads / (filename + SUFFIX)
    try:
        wheel_sha, record_sha = (text_path.parent / (text_path.name + ".sha256")).read_text().split()
        text = text_path.read_text(encoding="utf-8")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if wheel_sha != sha256 or record.text_sha256(text) != record_sha:
        return None
    return WheelRecord(filename, sha256, text)


def from_wheel(store: Store, wheel: Path, sha256: str) -> WheelRecord:
    """The RECORD of a wheel the caller checked against ``sha256`` already; kept in the cache."""
    text = read_from_wheel(wheel)
    found = WheelRecord(wheel.name, sha256, text)
    store.downloads.mkdir(parents=True, exist_ok=True)
    atomicfile.write_bytes(store.downloads / (wheel.name + SUFFIX), text.encode("utf-8"))
    atomicfile.write_bytes(
        store.downloads / (wheel.name + SUFFIX + ".sha256"), f"{sha256} {found.sha256}\n".encode("ascii")
    )
    return found


def fetched(store: Store, project: str, version: str, filename: str, sha256: str) -> WheelRecord:
    """The RECORD of the wheel ``filename``, which must have ``sha256``: cached, or the wheel
    downloaded from the configured index (the download is refused unless its sha256 matches) and
    deleted once read (a wheel that was in the cache already stays)."""
    cached = _cached(store, filename, sha256)
    if cached is not None:
        return cached
    wheel = store.downloads / filename
    downloaded = False
    if not (wheel.is_file() and upstream_trees.sha256_file(wheel) == sha256):
        entries = [e for e in upstream_trees.release_files(project, version) if e.filename == filename]
        if not entries:
            raise WheelRecordError(
                f"the package index lists no {filename}: its RECORD is what installs are checked against"
            )
        if entries[0].sha256 and entries[0].sha256 != sha256:
            raise WheelRecordError(
                f"the index states sha256 {entries[0].sha256} for {filename}; the lock pins {sha256}"
            )
        output.info(f"downloading {filename} once for its RECORD (what installed files are checked against)")
        upstream_trees.download(entries[0].url, wheel, sha256, entries[0].size)
        downloaded = True
    try:
        return from_wheel(store, wheel, sha256)
    finally:
        if downloaded:
            wheel.unlink(missing_ok=True)
