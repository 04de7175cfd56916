"""Static checks of patches/: everything that can be wrong before anything is applied."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from vllm_overlay import lock, paths
from vllm_overlay.audit import dependencies
from vllm_overlay.series import (
    ONE_OF_FIELDS,
    REQUIRED_FIELDS,
    SERIES_FILE,
    SERIES_NAME_RE,
    SeriesError,
    load_patch,
    read_series,
    tests_path_problems,
)

# vLLM's pre-commit requires both lines at the top of every Python file; the patch regression
# tests are written to be sent upstream with their patches, so they carry them too.
SPDX_LINES = (
    "# SPDX-License-Identifier: Apache-2.0",
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
)


def spdx_problems(repo_root: Path) -> list[str]:
    """Python files under tests/patches/ that lack one of vLLM's two SPDX header lines."""
    problems = []
    root = repo_root / "tests" / "patches"
    for path in sorted(root.rglob("*.py")) if root.is_dir() else []:
        if "__pycache__" in path.parts:
            continue
        head = path.read_text(encoding="utf-8", errors="replace").splitlines()[:5]
        missing = [line for line in SPDX_LINES if line not in head]
        if missing:
            rel = path.relative_to(repo_root).as_posix()
            problems.append(f"{rel}: lacks the SPDX header line {missing[0]!r} (vLLM's pre-commit requires both)")
    return problems


def lint(repo_root: Path, patches_dir: Path, tree: Path | None = None) -> list[str]:
    """Every problem found, as ``patches/NAME: message`` lines (empty list: all good)."""
    problems: list[str] = []
    try:
        entries = read_series(patches_dir)
    except SeriesError as exc:
        return [str(exc)]
    if not entries:
        problems.append(f"patches/{SERIES_FILE}: series is empty: it lists no patch")
    try:
        pins: dict[str, str] | None = lock.load(repo_root / lock.LOCK_NAME).pins
    except lock.LockError:
        pins = None  # no lock to check Dependency-Targets distributions against
    counts = Counter(entry.path for entry in entries)
    for name, count in counts.items():
        if count > 1:
            problems.append(f"patches/{name}: listed {count} times in series")
    on_disk = {p.relative_to(patches_dir).as_posix() for p in patches_dir.rglob("*.patch")}
    for name in sorted(on_disk - set(counts)):
        problems.append(f"patches/{name}: not listed in {SERIES_FILE}")
    for name in counts:
        try:
            patch = load_patch(patches_dir, name)
        except (SeriesError, UnicodeDecodeError) as exc:
            problems.append(f"patches/{name}: {exc}")
            continue
        where = f"patches/{name}"
        present = {key.lower() for key, _ in patch.trailers}
        for required in REQUIRED_FIELDS:
            if required.lower() not in present:
                problems.append(f"{where}: missing header '{required}:'")
        for group in ONE_OF_FIELDS:
            if not any(key.lower() in present for key in group):
                problems.append(f"{where}: needs one of the headers {', '.join(k + ':' for k in group)}")
        if patch.subject.startswith("["):
            problems.append(f"{where}: subject starts with '[...]', which git am strips; use 'component: subject'")
        series = patch.series
        directory = name.split("/", 1)[0] if "/" in name else ""
        if series and not SERIES_NAME_RE.match(series):
            problems.append(f"{where}: Series {series!r} is not a lowercase-dashed name")
        if series and directory != series:
            problems.append(f"{where}: Series: {series} but the file is in patches/{directory or '.'}/")
        outside = tests_path_problems(patch, repo_root) if series else []
        problems.extend(f"{where}: {problem}" for problem in outside)
        for test in patch.tests if not outside else []:
            test_file = test.split("::", 1)[0]
            if not (repo_root / test_file).is_file():
                problems.append(f"{where}: Tests names {test_file}, which does not exist")
        for target in patch.targets:
            module, sep, qualname = target.partition(":")
            if not sep or not module or not qualname:
                problems.append(f"{where}: Targets {target!r} is not MODULE:QUALNAME")
        problems.extend(f"{where}: {problem}" for problem in dependencies.lint_problems(patch, pins))
        problems.extend(f"{where}: {problem}" for problem in paths.problems(patch, tree))
    problems.extend(spdx_problems(repo_root))
    return problems
