"""The verdict store: every result kept under a key made of what decided it (content-addressed).

A key is the digest of: the runner's own version, the test environment's key, the git tree id of
the tested tree, the test specs, the content of every file the run can import from the project's
tests (the spec's directory, the ``*.py`` files of each directory above it: conftests and shared
helpers, and every module of the test directory those files import by name, transitively), the
pytest configuration, and the per-test timeout. Never a time or a branch
name: the same inputs give the same verdict, so a stored key reuses it without starting pytest
(the idea of git-test, which skips trees already tested; Bazel's action cache keys on input
digests the same way).

What the machine adds is in the key too: the environment variables a test run can read that
change outcomes (``MACHINE_VARIABLES``) and the distributions installed in the interpreter that
runs the tests (``installed_digest``: a tool installed or not, editable or not, a package added
to a given environment), so a failure the machine caused is never served to another machine state.

Entries live in ``<cache>/verdicts/<environment key>-r<runner version>/``; a new environment or
runner version starts an empty scope, and ``scripts/cache --prune`` removes the other scopes.
They are kept, signed and checked as every verdict of the cache is (vllm_overlay.signed_verdicts:
atomic writes under the cache's lock, an HMAC with the cache's own secret): a file under another
key's name, or one the store did not write (copied in, edited, forged), is ignored with a warning
that says which, and its tests run again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tomllib
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay.signed_verdicts import SignedVerdicts
from vllm_overlay.store import Store
from vllm_overlay.testrun.verdicts import Result, spec_file

RUNNER_VERSION = 3  # bump when a change alters what a stored result means (3: signed entries)
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
# Tool tests read the library, the scripts, the overlay and the project's own data; not the
# patch regression tests, the benchmarks or the prose.
TOOL_EXCLUDED = ("tests/patches/", "tests/upstream/", "benchmarks/", "build/")
CACHEABLE_EXITS = (0, 1, 4, 5)
# Variables a test run inherits that change what tests do (the rest, such as PATH or TERM, name
# where things are, not what they decide).
MACHINE_PREFIXES = ("VLLM_", "PYTEST", "PYTHON", "HF_", "TRANSFORMERS_", "TORCH", "CUDA_", "GIT_", "LC_")
MACHINE_VARIABLES = ("LANG", "LANGUAGE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "HOME", "XDG_CACHE_HOME")


def machine_digest(python: Path, environ: dict[str, str] | None = None) -> str:
    """What the machine adds to a run's outcome: the relevant variables and what ``python`` has installed."""
    environ = dict(os.environ if environ is None else environ)
    chosen = {k: v for k, v in environ.items() if k.startswith(MACHINE_PREFIXES) or k in MACHINE_VARIABLES}
    return hashlib.sha256(json.dumps([sorted(chosen.items()), installed_digest(python)]).encode()).hexdigest()


def installed_digest(python: Path) -> str:
    """The distributions installed beside ``python``: their dist-info names, direct_url.json and .pth files.

    Read from the directories (no process started): an editable install, a tool installed or not,
    a package added or upgraded all change it.
    """
    prefix = Path(python).parent.parent
    digest = hashlib.sha256(str(Path(python)).encode())
    for site in sorted([*prefix.glob("lib/python*/site-packages"), *prefix.glob("lib64/python*/site-packages")]):
        try:
            names = sorted(os.listdir(site))
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info", ".egg-link", ".pth")):
                digest.update(name.encode() + b"\0")
            if name.endswith(".pth") or name.endswith(".egg-link"):
                digest.update(_read(site / name))
            elif name.endswith(".dist-info"):
                digest.update(_read(site / name / "direct_url.json"))
    return digest.hexdigest()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b"<absent>"


def scope_name(env_key: str | None, env_python: Path) -> str:
    if env_key:
        base = env_key
    else:  # an environment given from outside: keyed by its interpreter's path
        base = "given-" + hashlib.sha256(str(env_python).encode()).hexdigest()[:16]
    return f"{base}-r{RUNNER_VERSION}"


def _digest_files(root: Path, rels: list[str]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(set(rels)):
        try:
            data = (root / rel).read_bytes()
        except OSError:
            data = b"<absent>"
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _walk(root: Path, directory: Path) -> list[str]:
    found = []
    for path in directory.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and not SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
            found.append(rel.as_posix())
    return found


def _imported_names(path: Path) -> set[str]:
    """The top-level names ``path`` imports (``import a.b`` and ``from a.b import c``: ``a``)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".", 1)[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".", 1)[0])
    return names


def _module_files(root: Path, directories: list[Path], name: str) -> list[str]:
    """The project files that would be imported as ``name`` from any of ``directories``."""
    found: list[str] = []
    for directory in directories:
        module, package = directory / f"{name}.py", directory / name
        if module.is_file():
            found.append(module.relative_to(root).as_posix())
        elif (package / "__init__.py").is_file():
            found.extend(_walk(root, package))
    return found


def test_inputs(project_root: Path, spec: str) -> list[str]:
    """The project files a run of ``spec`` can import: its directory, ``*.py`` above it, and what they import.

    A test may import a helper from a sibling folder (a shared harness next to another series'
    tests, reached through sys.path): every module a collected file imports by name is looked for
    in every folder of the spec's top-level test directory, transitively, so changing such a
    helper changes the key.
    """
    file = project_root / spec_file(spec)
    found = _walk(project_root, file.parent) if file.parent.is_dir() else [spec_file(spec)]
    directory = file.parent.parent
    while True:
        if directory.is_dir():
            found.extend(p.relative_to(project_root).as_posix() for p in directory.glob("*.py"))
        if directory == project_root or project_root not in directory.parents:
            break
        directory = directory.parent
    parts = Path(spec_file(spec)).parts
    top = project_root / parts[0] if len(parts) > 1 else project_root
    folders = [top, *(d for d in sorted(top.rglob("*")) if d.is_dir() and not SKIP_PARTS.intersection(d.parts))]
    pending, seen = [r for r in found if r.endswith(".py")], set(found)
    while pending:
        for name in _imported_names(project_root / pending.pop()):
            for rel in _module_files(project_root, folders, name):
                if rel not in seen:
                    seen.add(rel)
                    if rel.endswith(".py"):
                        pending.append(rel)
    return sorted(seen)


def pytest_config(project_root: Path) -> str:
    """The pytest settings of the project (pyproject.toml [tool.pytest*], pytest.ini, setup.cfg)."""
    parts = []
    try:
        data = tomllib.loads((project_root / "pyproject.toml").read_text(encoding="utf-8"))
        parts.append(json.dumps(data.get("tool", {}).get("pytest", {}), sort_keys=True))
    except (OSError, tomllib.TOMLDecodeError):
        parts.append("")
    for name in ("pytest.ini", "tox.ini", "setup.cfg"):
        path = project_root / name
        parts.append(path.read_text(encoding="utf-8", errors="replace") if path.is_file() else "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def tests_digest(project_root: Path, specs: list[str]) -> str:
    rels: list[str] = []
    for spec in specs:
        rels.extend(test_inputs(project_root, spec))
    return _digest_files(project_root, rels) + ":" + pytest_config(project_root)


def tool_digest(project_root: Path) -> str:
    """What the tool tests read: every project file but the patch tests, benchmarks and prose."""
    listed = gitcmd.process(
        "-C", str(project_root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", capture_output=True
    )
    if listed.returncode == 0:
        rels = [r for r in listed.stdout.decode().split("\0") if r]
    else:
        rels = _walk(project_root, project_root)
    rels = [r for r in rels if not r.startswith(TOOL_EXCLUDED) and not r.endswith(".md")]
    return _digest_files(project_root, [r for r in rels if (project_root / r).is_file()])


class VerdictStore(SignedVerdicts):
    """test-patches' scope of the cache's verdict store: Results under keys made of what decided them."""

    def __init__(self, store: Store, scope: str, enabled: bool = True) -> None:
        super().__init__(store, scope, again="its tests run again")
        self.enabled = enabled  # False (--no-cache): never read, still written

    @staticmethod
    def key(*parts: object) -> str:
        return hashlib.sha256(json.dumps([RUNNER_VERSION, *parts], sort_keys=True).encode()).hexdigest()

    def load(self, key: str) -> Result | None:
        """The stored result for ``key``, or None: absent, or refused (a warning says why: its tests run again)."""
        if not self.enabled:
            return None
        entry = self.load_entry(key)
        if entry is None:
            return None
        try:
            return Result.from_json(entry["result"])
        except (KeyError, TypeError, ValueError) as exc:
            self.warn(self.path(key), f"its result cannot be read ({exc})")
            return None

    def save(self, key: str, result: Result, what: dict[str, object]) -> bool:
        """Keep ``result`` under ``key`` if it is a finished run (not a crash or a time limit)."""
        if result.timed_out or result.exit_code not in CACHEABLE_EXITS:
            return False
        self.save_entry(key, what, result.to_json())
        return True
