"""Prove an environment's installed distribution pristine once, then keep the proof by file stat.

Hashing every file of vLLM's RECORD (about 9,000) costs seconds on each test-patches run. After a
verification that found nothing, the proof file records each recorded file's stat as it was
before it was hashed: size, mtime and ctime in nanoseconds, inode, device and mode. The next check
re-hashes only the files whose stat differs (or that the proof does not list); the others are
what was hashed. Writing a file changes its ctime, which user space cannot set back, so an edit is
always re-hashed, whatever mtime it was given. The proof is bound to the site-packages
directory, the distribution, the expected RECORD's sha256 (the locked wheel's: vllm_overlay.env.wheel_record)
and the installed RECORD's (a changed RECORD is a full check again),
and is kept in the cache (never inside the environment, which may be the user's). Files RECORD
does not list are looked for on every check, as before. A check that finds a problem removes it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from vllm_overlay import atomicfile
from vllm_overlay.env import record

FORMAT = 2  # 2: bound to the expected (wheel) RECORD too


def _stat(path: Path) -> list[int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode]


def _identity(site_packages: Path, dist: str, expected: str) -> dict[str, object] | None:
    distribution = record.find_distribution(site_packages, dist)
    if distribution is None:
        return None
    text = distribution.read_text("RECORD") or ""
    return {
        "format": FORMAT,
        "site_packages": os.path.realpath(site_packages),
        "dist": dist,
        "record_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "expected_record_sha256": record.text_sha256(expected),
    }


def _load(proof_file: Path, identity: dict[str, object] | None) -> dict[str, list[int]]:
    try:
        data = json.loads(proof_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if identity is None or not isinstance(data, dict) or data.get("identity") != identity:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def verify(site_packages: Path, dist: str, proof_file: Path, expected: str) -> tuple[list[record.Problem], int]:
    """``record.verify_distribution`` of ``dist`` against the wheel's RECORD ``expected``, reading only
    the files changed since the last clean check (``proof_file``); returns the problems and how many
    files were hashed."""
    identity = _identity(site_packages, dist, expected)
    proven_stats = _load(proof_file, identity)
    seen: dict[str, list[int] | None] = {}
    hashed: list[str] = []  # appended from the verifier's threads

    def proven(rel: str) -> bool:
        # Before any hashing: a later write shows as a changed stat (lstat: a symlink has its own).
        now = _stat(site_packages / rel)
        seen[rel] = now
        if now is not None and proven_stats.get(rel) == now:
            return True
        hashed.append(rel)
        return False

    problems = record.verify_distribution(site_packages, dist, expected=expected, proven=proven)
    if problems or identity is None:
        proof_file.unlink(missing_ok=True)
    else:
        files = {rel: stat for rel, stat in sorted(seen.items()) if stat is not None}
        proof_file.parent.mkdir(parents=True, exist_ok=True)
        atomicfile.write_bytes(proof_file, json.dumps({"identity": identity, "files": files}).encode())
    return problems, len(hashed)
