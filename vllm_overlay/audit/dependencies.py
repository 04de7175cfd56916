"""Dependency-API drift: did a dependency symbol a patch relies on change between two pins?

A patch can apply cleanly to a new vLLM release and still be wrong there, because that release
pins another version of a dependency whose API the patched code calls (a keyword argument the
older wrapper does not take). A patch declares such symbols in its ``Dependency-Targets``
trailer, one ``DISTRIBUTION:MODULE:QUALNAME`` per entry::

    Dependency-Targets: flashinfer-python:flashinfer.fused_moe:B12xMoEWrapper.__init__

The distribution is one the release pins (upstream.lock [pins]); the module is the import path
the patch uses (re-exports are followed to the defining module). The audit reads both releases'
pins from their own metadata, obtains each pinned version's sources from the configured package
index (sha256 from the index, cached in the store like sdists, only the Python files kept) and
compares the symbols by AST, naming the parameters that appeared or went away.
"""

from __future__ import annotations

import ast
import email.parser
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vllm_overlay import output
from vllm_overlay.audit import targets
from vllm_overlay.series import Patch
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees

TRAILER = "Dependency-Targets"
DISTRIBUTION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_REEXPORT_HOPS = 5


def normalize(name: str) -> str:
    """PEP 503 name normalization (``flashinfer_python`` == ``flashinfer-python``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class DependencyTarget:
    distribution: str
    module: str
    qualname: str

    @classmethod
    def parse(cls, text: str) -> DependencyTarget:
        parts = text.split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{text!r} is not DISTRIBUTION:MODULE:QUALNAME")
        distribution, module, qualname = parts
        if not DISTRIBUTION_RE.match(distribution):
            raise ValueError(f"{text!r}: {distribution!r} is not a distribution name")
        if not MODULE_RE.match(module) or not MODULE_RE.match(qualname):
            raise ValueError(f"{text!r}: module and qualname must be dotted Python names")
        return cls(normalize(distribution), module, qualname)

    @property
    def symbol(self) -> str:
        return f"{self.module}:{self.qualname}"

    def __str__(self) -> str:
        return f"{self.distribution}:{self.symbol}"


def entries(patch: Patch) -> list[str]:
    """The raw Dependency-Targets entries (comma or whitespace separated, several trailers allowed)."""
    return [item for value in patch.values(TRAILER) for item in re.split(r"[,\s]+", value) if item]


def declared(patch: Patch) -> list[DependencyTarget]:
    """The patch's dependency targets; malformed entries are lint's business and skipped here."""
    found = []
    for item in entries(patch):
        try:
            found.append(DependencyTarget.parse(item))
        except ValueError:
            continue
    return found


def lint_problems(patch: Patch, pins: Mapping[str, str] | None) -> list[str]:
    """What is wrong with a patch's Dependency-Targets (``pins``: the lock's, to check the names)."""
    problems = []
    pinned = {normalize(name) for name in pins} if pins is not None else None
    for item in entries(patch):
        try:
            target = DependencyTarget.parse(item)
        except ValueError as exc:
            problems.append(f"{TRAILER} {exc}")
            continue
        if pinned is not None and target.distribution not in pinned:
            problems.append(
                f"{TRAILER} {item!r}: upstream.lock pins no {target.distribution} "
                f"(pinned: {', '.join(sorted(pinned)) or 'nothing'})"
            )
    return problems


def exact_pins(pkg_info: str) -> dict[str, str]:
    """Every exact pin (``name==version``, not behind an extra) a release's PKG-INFO states."""
    message = email.parser.Parser().parsestr(pkg_info)
    pins: dict[str, str] = {}
    for requirement in message.get_all("Requires-Dist") or []:
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)\s*(;.*)?$", requirement)
        if match and "extra ==" not in (match.group(3) or ""):
            pins[normalize(match.group(1))] = match.group(2)
    return pins


def release_pins(read: targets.FileReader, fallback: Mapping[str, str] | None = None) -> dict[str, str]:
    """A release's own pins (its PKG-INFO); ``fallback`` (the lock's) when it has no metadata."""
    pkg_info = read("PKG-INFO")
    if pkg_info is None:
        return {normalize(k): v for k, v in (fallback or {}).items()}
    return exact_pins(pkg_info)


# --- obtaining a pinned version's sources ------------------------------------------------------


def _pick_archive(files: list[upstream_trees.IndexFile], distribution: str, version: str) -> upstream_trees.IndexFile:
    """A pure-Python wheel (random access) if the index has one, else the sdist."""
    stem = re.sub(r"[-_.]+", "_", distribution)
    usable = [f for f in files if re.fullmatch(r"[0-9a-f]{64}", f.sha256 or "")]
    wheels = [f for f in usable if f.filename.startswith(f"{stem}-{version}-") and f.filename.endswith("-none-any.whl")]
    sdists = [f for f in usable if f.filename in (f"{stem}-{version}.tar.gz", f"{distribution}-{version}.tar.gz")]
    chosen = (wheels or sdists)[:1]
    if not chosen:
        raise upstream_trees.SourceError(
            f"the package index has no pure-Python wheel or sdist (with a sha256) of {distribution} {version}"
        )
    return chosen[0]


def _python_members(names: list[str], strip_top: bool) -> dict[str, str]:
    """Archive member -> path relative to the import root, for every .py file."""
    mapping = {}
    for name in names:
        if not name.endswith(".py"):
            continue
        parts = PurePosixPath(name).parts
        if strip_top:
            parts = parts[1:]
        if not parts or parts[0].startswith("/") or ".." in parts:
            continue
        mapping[name] = PurePosixPath(*parts).as_posix()
    return mapping


def _extract_python(archive: Path, dest: Path) -> int:
    """Write the archive's .py files under ``dest``, laid out by import path; returns the count."""
    count = 0
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            for member, rel in _python_members(wheel.namelist(), strip_top=False).items():
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(member))
                count += 1
        return count
    with tarfile.open(archive, "r:*") as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        for member, rel in _python_members(list(members), strip_top=True).items():
            handle = tar.extractfile(members[member])
            if handle is None:
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(handle.read())
            count += 1
    return count


def source_root(store: Store, distribution: str, version: str) -> Path:
    """The Python sources of ``distribution`` ``version``, from the store or the index (verified)."""
    distribution = normalize(distribution)
    root = store.dependencies / f"{distribution}-{version}"
    marker = root / ".vllm-overlay-complete"
    if marker.is_file():
        return root
    with store.exclusive():
        if marker.is_file():
            return root
        entry = _pick_archive(upstream_trees.release_files(distribution, version), distribution, version)
        archive = store.download(entry.filename)
        if not archive.exists():
            output.info(f"downloading {entry.filename} (dependency-API check)")
        upstream_trees.download(entry.url, archive, entry.sha256, entry.size)
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}."))
        try:
            count = _extract_python(archive, staging)
            (staging / ".vllm-overlay-complete").write_text(f"{entry.filename} {entry.sha256} {count}\n")
            shutil.rmtree(root, ignore_errors=True)
            os.replace(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        # The Python files are all the check reads; the archive need not stay in the cache.
        archive.unlink(missing_ok=True)
    return root


def directory_reader(root: Path) -> targets.FileReader:
    def read(path: str) -> str | None:
        candidate = root / path
        return candidate.read_text(encoding="utf-8", errors="replace") if candidate.is_file() else None

    return read


# --- finding and comparing a symbol ------------------------------------------------------------


def _module_source(read: targets.FileReader, module: str) -> tuple[str, str, bool] | None:
    """(path, source, is_package) of a dotted module."""
    base = module.replace(".", "/")
    for path, package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
        source = read(path)
        if source is not None:
            return path, source, package
    return None


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join([*parts, *([node.module] if node.module else [])])


def _module_level_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """``from X import Y`` at module level, including inside if/try blocks (optional imports)."""
    found: list[ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try):
            pending.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return found


def locate(read: targets.FileReader, module: str, qualname: str) -> tuple[ast.AST | None, str]:
    """The definition of ``module:qualname``, following re-exports; (node or None, where/why)."""
    for _ in range(MAX_REEXPORT_HOPS):
        found = _module_source(read, module)
        if found is None:
            return None, f"no module {module}"
        path, source, is_package = found
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        node = targets.find_symbol(tree, qualname)
        if node is not None:
            return node, path
        head, _, rest = qualname.partition(".")
        origin = None
        for imported in _module_level_imports(tree):
            for alias in imported.names:
                if (alias.asname or alias.name) == head:
                    origin = (_absolute(module, is_package, imported), alias.name)
        if origin is None:
            return None, f"{qualname} not in {path}"
        module, qualname = origin[0], ".".join([origin[1], *([rest] if rest else [])])
    return None, f"{qualname}: too many re-exports"


def _parameters(node: ast.AST) -> list[str] | None:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return names


def _signature(node: ast.AST) -> str | None:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    return ast.dump(node.args, include_attributes=False) + ast.dump(node.returns or ast.Constant(None))


@dataclass(frozen=True)
class DependencyDrift:
    target: DependencyTarget
    old_version: str | None
    new_version: str | None
    drift: targets.Drift
    detail: str = ""

    @property
    def versions(self) -> str:
        return f"{self.target.distribution} {self.old_version or '?'} -> {self.new_version or '?'}"

    def __str__(self) -> str:
        text = f"{self.versions}: {self.target.symbol} {self.drift}"
        return text + (f" ({self.detail})" if self.detail else "")


def compare(
    target: DependencyTarget,
    old_version: str | None,
    new_version: str | None,
    old: targets.FileReader | None,
    new: targets.FileReader | None,
) -> DependencyDrift:
    """Compare one dependency symbol between the two pinned versions' sources."""

    def result(drift: targets.Drift, detail: str = "") -> DependencyDrift:
        return DependencyDrift(target, old_version, new_version, drift, detail)

    if old_version is not None and old_version == new_version:
        return result(targets.Drift.UNCHANGED, "same pin")
    if old is None or new is None:
        return result(targets.Drift.UNPARSABLE, "sources not available")
    try:
        before, where_before = locate(old, target.module, target.qualname)
        after, where_after = locate(new, target.module, target.qualname)
    except ValueError as exc:
        return result(targets.Drift.UNPARSABLE, str(exc))
    if before is None and after is None:
        return result(targets.Drift.ABSENT, f"in neither version: {where_before}")
    if before is None:
        return result(targets.Drift.APPEARED, f"not in the locked pin ({where_before}); now in {where_after}")
    if after is None:
        return result(targets.Drift.REMOVED, where_after)
    if ast.dump(before, include_attributes=False) == ast.dump(after, include_attributes=False):
        return result(targets.Drift.UNCHANGED)
    old_params, new_params = _parameters(before), _parameters(after)
    notes = []
    if old_params is not None and new_params is not None:
        gone = [p for p in old_params if p not in new_params]
        added = [p for p in new_params if p not in old_params]
        if gone:
            notes.append(f"parameters missing there: {', '.join(gone)}")
        if added:
            notes.append(f"parameters only there: {', '.join(added)}")
        if not gone and not added and _signature(before) != _signature(after):
            notes.append("signature changed (defaults, annotations or order)")
    if not notes:
        notes.append("body changed")
    return result(targets.Drift.CHANGED, f"{'; '.join(notes)}; {where_after}")


def drift_by_patch(
    patches: list[Patch],
    old_pins: Mapping[str, str],
    new_pins: Mapping[str, str],
    store: Store,
) -> dict[str, list[DependencyDrift]]:
    """Each patch's Dependency-Targets compared between the two releases' pins (sources cached)."""
    old_pins = {normalize(k): v for k, v in old_pins.items()}
    new_pins = {normalize(k): v for k, v in new_pins.items()}
    readers: dict[tuple[str, str], targets.FileReader | None] = {}
    failures: dict[tuple[str, str], str] = {}

    def reader(distribution: str, version: str | None) -> targets.FileReader | None:
        if version is None:
            return None
        key = (distribution, version)
        if key not in readers:
            try:
                readers[key] = directory_reader(source_root(store, distribution, version))
            except upstream_trees.SourceError as exc:
                readers[key], failures[key] = None, str(exc)
        return readers[key]

    found: dict[str, list[DependencyDrift]] = {}
    for patch in patches:
        rows = []
        for target in declared(patch):
            old_version = old_pins.get(target.distribution)
            new_version = new_pins.get(target.distribution)
            if old_version == new_version and old_version is not None:
                rows.append(compare(target, old_version, new_version, None, None))
                continue
            old_read, new_read = reader(target.distribution, old_version), reader(target.distribution, new_version)
            drift = compare(target, old_version, new_version, old_read, new_read)
            if drift.drift is targets.Drift.UNPARSABLE and (old_read is None or new_read is None):
                why = [failures.get((target.distribution, v or ""), "") for v in (old_version, new_version)]
                missing = [f"no pin of {target.distribution}" for v in (old_version, new_version) if v is None]
                detail = "; ".join(x for x in [*why, *missing] if x) or drift.detail
                drift = DependencyDrift(target, old_version, new_version, drift.drift, f"not checked: {detail}")
            rows.append(drift)
        found[patch.name] = rows
    return found
