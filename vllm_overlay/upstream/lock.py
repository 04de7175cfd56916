"""upstream.lock: the single statement of what "upstream" is.

Parsed with tomllib into frozen dataclasses so the rest of the tool never handles raw dicts.
Rewriting the lock (on a bump) regenerates the whole file from a template so its layout and
comments never drift.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay import atomicfile
from vllm_overlay.errors import InputError

LOCK_NAME = "upstream.lock"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_RE = re.compile(r"^(sha256:[0-9a-f]{64})?$")


class LockError(InputError, ValueError):
    """upstream.lock is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class Artifact:
    filename: str
    sha256: str


@dataclass(frozen=True)
class Lock:
    project: str
    version: str
    commit: str
    sdist: Artifact
    wheels: dict[str, Artifact]
    base_image: str
    base_digest: str
    pins: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    @property
    def content_hash(self) -> str:
        """sha256 of the lock file's bytes: keys caches that must follow the lock."""
        if self.path is None:
            raise LockError("lock has no file")
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


# The distributions the tool knows how to overlay: their sdists lay out a ``vllm/`` package.
SUPPORTED_PROJECTS = ("vllm",)


def _require(table: dict, key: str, where: str) -> object:
    if key not in table:
        raise LockError(f"{LOCK_NAME}: missing '{key}' in [{where}]")
    return table[key]


def _table(table: dict, key: str, where: str) -> dict:
    """A required sub-table: a string or list where a table belongs is named, not a traceback later."""
    value = _require(table, key, where)
    if not isinstance(value, dict):
        shown = f"[{key}]" if where == "top level" else f"[{where}.{key}]"
        raise LockError(f"{LOCK_NAME}: {shown} must be a table, not {_kind(value)}")
    return value


def _string(table: dict, key: str, where: str) -> str:
    value = _require(table, key, where)
    if not isinstance(value, str):
        raise LockError(f"{LOCK_NAME}: '{key}' in [{where}] must be a string, not {_kind(value)}")
    return value


def _kind(value: object) -> str:
    """How TOML calls what was given instead (the user wrote TOML, not Python)."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a date or time"


def _artifact(table: dict, where: str) -> Artifact:
    filename = _string(table, "filename", where)
    sha256 = _string(table, "sha256", where)
    if not SHA256_RE.match(sha256):
        raise LockError(f"{LOCK_NAME}: [{where}] sha256 is not 64 lowercase hex digits: {sha256!r}")
    return Artifact(filename, sha256)


def _project(value: str) -> str:
    """The project names a file in the cache: only a supported distribution's plain name may."""
    if value not in SUPPORTED_PROJECTS:
        raise LockError(
            f"{LOCK_NAME}: [upstream] project {value!r} is not a supported distribution "
            f"(supported: {', '.join(SUPPORTED_PROJECTS)})"
        )
    return value


# PEP 440's canonical form (what ``str(packaging.version.Version(v))`` gives): no leading zeros, no
# "v", no separators but its own, lowercase. A regular expression, not packaging: a run that
# changes nothing parses the lock and must not import packaging for it.
CANONICAL_VERSION_RE = re.compile(
    r"^(?:[1-9]\d*!)?(?:0|[1-9]\d*)(?:\.(?:0|[1-9]\d*))*(?:(?:a|b|rc)(?:0|[1-9]\d*))?"
    r"(?:\.post(?:0|[1-9]\d*))?(?:\.dev(?:0|[1-9]\d*))?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?$"
)


def _version(value: str) -> str:
    """The version names a cache file and a git tag: it must be exactly its canonical form."""
    if CANONICAL_VERSION_RE.match(value):
        return value
    from packaging.version import InvalidVersion, Version  # only to say what to write instead

    try:
        canonical: str | None = str(Version(value))
    except InvalidVersion:
        canonical = None
    hint = f" (write {canonical!r})" if canonical and canonical != value else ""
    raise LockError(f"{LOCK_NAME}: [upstream] version {value!r} is not a canonical version number{hint}")


# A wheel's file name: NAME-VERSION(-BUILD)?-PYTHON-ABI-PLATFORM.whl, each part without a separator.
WHEEL_TAIL_RE = re.compile(r"^(?:[0-9][A-Za-z0-9_.]*-)?[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$")


def _wheel(arch: str, artifact: Artifact, project: str, version: str) -> Artifact:
    """A wheel's filename must be one wheel of the locked release, nothing that reads as a path."""
    where = f"[artifacts.wheel-{arch}]"
    name = artifact.filename
    prefix = f"{project.replace('-', '_')}-{version}-"
    plain = name.endswith(".whl") and not any(c in name for c in "/\\\0")
    if not plain or (name.startswith(prefix) and not WHEEL_TAIL_RE.match(name.removeprefix(prefix))):
        raise LockError(f"{LOCK_NAME}: {where} filename {name!r} is not a wheel's file name")
    if not name.startswith(prefix):
        raise LockError(f"{LOCK_NAME}: {where} {name} is not a wheel of {project} {version}")
    return artifact


# Every key the lock may hold; anything else is a typo that would otherwise be silently ignored.
_TOP_LEVEL = {"upstream", "artifacts", "base-image", "pins"}
_TABLE_KEYS = {"upstream": {"project", "version", "commit"}, "base-image": {"name", "digest"}}
_ARTIFACT_KEYS = {"filename", "sha256"}


def _refuse_unknown_keys(data: dict) -> None:
    unknown = [f"'{key}' at the top level" for key in data if key not in _TOP_LEVEL]
    for table, keys in _TABLE_KEYS.items():
        if isinstance(data.get(table), dict):
            unknown += [f"'{key}' in [{table}]" for key in data[table] if key not in keys]
    artifacts = data.get("artifacts")
    if isinstance(artifacts, dict):
        for name, table in artifacts.items():
            if name != "sdist" and not name.startswith("wheel-"):
                unknown.append(f"'{name}' in [artifacts] (expected sdist or wheel-<arch>)")
            elif isinstance(table, dict):
                unknown += [f"'{key}' in [artifacts.{name}]" for key in table if key not in _ARTIFACT_KEYS]
    if unknown:
        raise LockError(f"{LOCK_NAME}: unknown key " + ", ".join(unknown) + " (misspelt?)")


def _pins(data: dict) -> dict[str, str]:
    pins = data.get("pins", {})
    if not isinstance(pins, dict):
        raise LockError(f"{LOCK_NAME}: [pins] must be a table, not {_kind(pins)}")
    for name, value in pins.items():
        if not isinstance(value, str):
            raise LockError(f"{LOCK_NAME}: pin '{name}' in [pins] must be a version string, not {_kind(value)}")
    return dict(pins)


def parse(text: str, path: Path | None = None) -> Lock:
    """Parse and validate the lock's TOML text: every key's type, and every value that names a file."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockError(f"{LOCK_NAME}: not valid TOML: {exc}") from exc
    upstream = _table(data, "upstream", "top level")
    artifacts = _table(data, "artifacts", "top level")
    base = _table(data, "base-image", "top level")
    _refuse_unknown_keys(data)
    project = _project(_string(upstream, "project", "upstream"))
    version = _version(_string(upstream, "version", "upstream"))
    commit = _string(upstream, "commit", "upstream")
    sdist = _artifact(_table(artifacts, "sdist", "artifacts"), "artifacts.sdist")
    if sdist.filename != f"{project}-{version}.tar.gz":
        raise LockError(f"{LOCK_NAME}: sdist {sdist.filename} does not match version {version}")
    wheels = {
        name.removeprefix("wheel-"): _wheel(
            name.removeprefix("wheel-"),
            _artifact(_table(artifacts, name, "artifacts"), f"artifacts.{name}"),
            project,
            version,
        )
        for name in sorted(artifacts)
        if name.startswith("wheel-")
    }
    digest = _string(base, "digest", "base-image") if "digest" in base else ""
    if not DIGEST_RE.match(digest):
        raise LockError(f"{LOCK_NAME}: [base-image] digest must be empty or sha256:<64 hex>: {digest!r}")
    return Lock(
        project=project,
        version=version,
        commit=commit,
        sdist=sdist,
        wheels=wheels,
        base_image=_string(base, "name", "base-image"),
        base_digest=digest,
        pins=_pins(data),
        path=path,
    )


def load(path: Path) -> Lock:
    """Read upstream.lock from disk."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise LockError(f"{path}: not found") from exc
    return parse(text, path)


def render(lock: Lock) -> str:
    """The lock's canonical text (what `bump` writes)."""
    lines = [
        '# What "upstream" means for this overlay. Read by vllm_overlay.upstream.lock (tomllib).',
        "# Every value is taken from the release itself: the sdist's vllm/_version.py, the package index's",
        "# published sha256s, and the release's own requirement pins. Nothing here is guessed.",
        "",
        "[upstream]",
        f'project = "{lock.project}"',
        f'version = "{lock.version}"',
        "# Commit id as the release records it (vllm/_version.py: __commit_id__).",
        f'commit = "{lock.commit}"',
        "",
        "[artifacts.sdist]",
        f'filename = "{lock.sdist.filename}"',
        f'sha256 = "{lock.sdist.sha256}"',
    ]
    for arch, wheel in lock.wheels.items():
        lines += ["", f"[artifacts.wheel-{arch}]", f'filename = "{wheel.filename}"', f'sha256 = "{wheel.sha256}"']
    lines += [
        "",
        "[base-image]",
        f'name = "{lock.base_image}"',
        "# Empty until a command resolves the tag against a registry. Never write an invented digest.",
        f'digest = "{lock.base_digest}"',
        "",
        "[pins]",
        f"# What vLLM {lock.version} itself pins (its Requires-Dist).",
    ]
    lines += [f'{name} = "{version}"' for name, version in lock.pins.items()]
    return "\n".join(lines) + "\n"


def write(lock: Lock, path: Path) -> None:
    """Write the lock atomically: a crash never leaves half a lock behind."""
    text = render(lock)
    parse(text)  # never write something we could not read back
    atomicfile.write_bytes(path, text.encode("utf-8"))
