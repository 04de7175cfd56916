"""The cached test environment: a virtual environment holding the locked vLLM and the test tools.

Keyed by a hash of upstream.lock's bytes, the requirement pins installed and the interpreter's
version, so it is reused while none of them changes and rebuilt when one does. A fresh machine
needs nothing but a Python interpreter: the first run builds it (``pip install vllm==<locked>``
takes about 3 minutes and 9.5 GB).

Publication is atomic: the environment is built in a hidden directory of its own, and only when
pip has finished and the installed vllm has been proven pristine against its wheel's RECORD is
``envs/<key>`` (a symlink) pointed at it. That RECORD is the locked wheel's, downloaded and checked
against upstream.lock's sha256 (vllm_overlay.env.wheel_record), never the installed copy, which is
checked against it like every other file. A crash mid-build never leaves a half environment under
the published name. Every later use verifies again; a managed environment that is not
pristine is rebuilt, an environment given with ``--env`` / ``$VLLM_OVERLAY_ENV`` is refused (the
tool never deletes what it did not create).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from vllm_overlay import output
from vllm_overlay.env import proof as envproof
from vllm_overlay.env import record, wheel_record
from vllm_overlay.errors import InputError
from vllm_overlay.store import Store
from vllm_overlay.upstream import indexes
from vllm_overlay.upstream.lock import Lock

ENV_VAR = "VLLM_OVERLAY_ENV"
MARKER = ".vllm-overlay-env"
# What the runner itself needs inside the environment, beside vllm and the tool's own dependencies:
# the test tools at the versions vLLM 0.33.0 pins for its own CPU test runs
# (requirements/test/cpu.txt in its sdist), so upstream tests run as upstream runs them.
TEST_REQUIREMENTS = (
    "pytest==9.1.0",
    "pytest-asyncio==1.4.0",
    "pytest-timeout==2.3.1",
    "pytest-mock==3.14.0",
    "tblib==3.1.0",
    "hypothesis==6.131.0",
)
# Modules that must import in an environment given with --env.
REQUIRED_MODULES = ("pytest", "pytest_timeout", "tblib")
TOOL_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
TOOL_DISTRIBUTION = "vllm-overlay"


class EnvError(InputError, RuntimeError):
    """The test environment cannot be built or used."""


@dataclass(frozen=True)
class Env:
    path: Path
    python: Path
    site_packages: Path
    key: str | None  # None for an environment given from outside
    managed: bool

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "python": str(self.python),
            "site_packages": str(self.site_packages),
            "key": self.key,
            "managed": self.managed,
        }


def tool_requirements() -> list[str]:
    """The tool's own dependencies: its pyproject.toml in a checkout, else the installed distribution's.

    An installed tool (``pip install .``, as the Dockerfile's first stage does) has no pyproject.toml
    beside it; its Requires-Dist says the same, extras left out.
    """
    try:
        data = tomllib.loads(TOOL_PYPROJECT.read_text(encoding="utf-8"))
        return list(data["project"]["dependencies"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        declared = importlib.metadata.requires(TOOL_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise EnvError(
            f"no {TOOL_PYPROJECT} and no installed {TOOL_DISTRIBUTION} distribution to read the "
            "tool's dependencies from"
        ) from exc
    return [text for text in declared if (marker := Requirement(text).marker) is None or marker.evaluate({"extra": ""})]


def requirements(lock: Lock) -> list[str]:
    return [f"{lock.project}=={lock.version}", *TEST_REQUIREMENTS, *tool_requirements()]


def env_key(lock: Lock, reqs: list[str], python_version: str | None = None) -> str:
    """Hash of the lock's bytes, the requirement pins and the interpreter's major.minor."""
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    digest = hashlib.sha256()
    digest.update(lock.path.read_bytes() if lock.path else lock.version.encode())
    digest.update(b"\0" + "\n".join(reqs).encode() + b"\0" + version.encode())
    return digest.hexdigest()[:24]


def describe(path: Path, key: str | None, managed: bool) -> Env:
    python = path / "bin" / "python"
    if not python.exists():
        raise EnvError(f"{path}: not a virtual environment (no bin/python)")
    try:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise EnvError(f"{python} does not run: {exc}") from exc
    return Env(path=path, python=python, site_packages=Path(site), key=key, managed=managed)


def missing_modules(python: Path, modules: tuple[str, ...] | list[str]) -> list[str]:
    code = "import importlib.util, sys\nprint(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    out = subprocess.run([str(python), "-c", code, *modules], capture_output=True, text=True, check=False)
    return out.stdout.split()


def verify(env: Env, dist: str, expected: str) -> list[record.Problem]:
    """``dist`` in ``env`` against the wheel's RECORD ``expected`` (from the lock, never the installed one)."""
    return record.verify_distribution(env.site_packages, dist, expected=expected)


def verify_proven(env: Env, dist: str, proof: Path, expected: str) -> tuple[list[record.Problem], str]:
    """``verify``, reading again only the files changed since the last clean check (``envproof``);
    also says how long it took and how many files it read."""
    started = time.monotonic()
    problems, hashed = envproof.verify(env.site_packages, dist, proof, expected)
    return problems, f"checked in {time.monotonic() - started:.1f}s, {hashed} file(s) hashed"


def proof_file(store: Store, env: Path, key: str | None) -> Path:
    """Where the stat proof of ``env``'s verification is kept: in the cache, never in the environment."""
    name = key or "given-" + hashlib.sha256(os.path.realpath(env).encode()).hexdigest()[:16]
    return store.envs / f"{name}.proof.json"


def _summarise(problems: list[record.Problem], limit: int = 5) -> str:
    shown = "; ".join(str(p) for p in problems[:limit])
    return shown + (f"; ... {len(problems) - limit} more" if len(problems) > limit else "")


def ensure(lock: Lock, store: Store, override: Path | None = None) -> Env:
    """The environment to test with: the given one (verified) or the cached one (built if needed)."""
    override = override or (Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else None)
    if override is not None:
        return _use_given(override.expanduser().resolve(), lock, store)
    reqs = requirements(lock)
    key = env_key(lock, reqs)
    link = store.envs / key
    with store.exclusive():
        expected = wheel_record.locked(lock, store).text
        store.envs.mkdir(parents=True, exist_ok=True)
        if (link / MARKER).is_file() and (link / MARKER).read_text(encoding="utf-8").split("\n", 1)[0] == key:
            env = describe(link, key, managed=True)
            problems, checked = verify_proven(env, lock.project, proof_file(store, link, key), expected)
            if not problems:
                output.info(f"test environment {link} (vllm {lock.version} pristine per RECORD, {checked})")
                return env
            output.warn(f"test environment {link} is not pristine ({_summarise(problems)}); rebuilding it")
        return _build(store, lock, key, reqs, link, expected)


def _use_given(path: Path, lock: Lock, store: Store) -> Env:
    env = describe(path, key=None, managed=False)
    missing = missing_modules(env.python, REQUIRED_MODULES)
    if missing:
        raise EnvError(f"{path}: lacks {', '.join(missing)}; install them with {env.python} -m pip install ...")
    expected = wheel_record.locked(lock, store).text  # cached once read; written atomically, so no lock is waited on
    problems, checked = verify_proven(env, lock.project, proof_file(store, path, None), expected)
    if problems:
        raise EnvError(
            f"{path}: the installed {lock.project} is not pristine per its RECORD ({_summarise(problems)}); "
            "this environment was given from outside, so it is not rebuilt: reinstall it or drop --env"
        )
    version = subprocess.run(
        [str(env.python), "-c", f"import importlib.metadata as m; print(m.version({lock.project!r}))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if version != lock.version:
        raise EnvError(f"{path}: has {lock.project} {version or '(none)'}, upstream.lock says {lock.version}")
    output.info(f"test environment {path} (given; vllm {version} pristine per RECORD, {checked})")
    return env


def _remove_stale(store: Store, key: str, keep: set[Path]) -> None:
    for stale in store.envs.glob(f".{key}.*"):
        if stale.resolve() not in keep:
            shutil.rmtree(stale, ignore_errors=True)


def _build(store: Store, lock: Lock, key: str, reqs: list[str], link: Path, expected: str) -> Env:
    """Build a fresh test environment beside the published one, verify it, then publish it atomically."""
    return build_published(
        store,
        key,
        link,
        [["--upgrade", "pip"], reqs],
        dist=lock.project,
        expected=expected,
        marker_lines=reqs,
        label="the test environment",
        size_hint="~3 min, ~10 GB",
    )


def build_published(
    store: Store,
    key: str,
    link: Path,
    installs: list[list[str]],
    *,
    dist: str,
    expected: str,
    marker_lines: list[str],
    label: str,
    size_hint: str,
    nice: int = 0,
) -> Env:
    """Build a venv under ``store.envs``, run ``pip install <each of installs>`` in it, prove ``dist``
    pristine per its wheel's RECORD ``expected``, then publish it as ``link`` (a symlink) atomically.

    Shared by the test environment and the CPU runtime (vllm_overlay.cpu.runtime): both are
    published only when complete and verified, and a failed build leaves nothing behind.
    ``nice`` lowers the priority of the pip processes (a shared machine keeps its other work).
    """
    previous = link.resolve() if link.is_symlink() else None
    _remove_stale(store, key, {previous} if previous else set())
    real = store.envs / f".{key}.{os.getpid()}-{int(time.time())}"
    log = store.envs / f"{key}.build.log"
    output.info(f"building {label} in {real} ({size_hint})")
    output.info(f"  build log: {log}")
    started = time.monotonic()
    prefix = ["nice", "-n", str(nice)] if nice else []
    try:
        with open(log, "w", encoding="utf-8") as handle:
            pip = [str(real / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
            pip += indexes.pip_arguments()
            commands = [[sys.executable, "-m", "venv", str(real)], *([*prefix, *pip, *args] for args in installs)]
            for command in commands:
                handle.write("$ " + " ".join(command) + "\n")
                handle.flush()
                status = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT)
                if status != 0:
                    tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-15:])
                    raise EnvError(
                        f"building {label} failed ({' '.join(command[len(prefix) : len(prefix) + 4])}...):\n{tail}"
                    )
        env = describe(real, key, managed=True)
        problems = verify(env, dist, expected)
        if problems:
            raise EnvError(f"the freshly installed {dist} does not match its RECORD: {_summarise(problems)}")
        (real / MARKER).write_text(key + "\n" + "\n".join(marker_lines) + "\n", encoding="utf-8")
        temp_link = store.envs / f".{key}.link-{os.getpid()}"
        temp_link.unlink(missing_ok=True)
        temp_link.symlink_to(real.name)
        if link.exists() and not link.is_symlink():
            shutil.rmtree(link)
        os.replace(temp_link, link)
    except BaseException:
        shutil.rmtree(real, ignore_errors=True)
        raise
    if previous and previous != real.resolve():
        shutil.rmtree(previous, ignore_errors=True)
    output.info(f"{label} ready in {time.monotonic() - started:.0f}s: {link}")
    return describe(link, key, managed=True)
