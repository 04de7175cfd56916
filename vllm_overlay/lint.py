"""Static checks of patches/: everything that can be wrong before anything is applied."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from vllm_overlay import maintainers, patch_index
from vllm_overlay.apply import paths
from vllm_overlay.audit import dependencies
from vllm_overlay.series import (
    FORWARDED_NOT_RE,
    FORWARDED_URL_RE,
    MESSAGE_HEADINGS,
    ONE_OF_FIELDS,
    REQUIRED_FIELDS,
    SERIES_FILE,
    SERIES_NAME_RE,
    Patch,
    SeriesEntry,
    SeriesError,
    as_git_am_reads,
    load_patch,
    name_problem,
    parse_all_trailers,
    read_series,
    same_files,
    shown,
    tests_path_problems,
)
from vllm_overlay.upstream import lock

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


# The message must fit one screen for its reader (a reviewer, a pull request's body): from the
# subject through the last line of text before the trailer block, blank lines counted, and each line
# within git's 72 columns. Long evidence goes to docs/patches/<series>/<name>.md, linked from it: a
# line that is one path or URL alone may be wider (it cannot be wrapped and still be copied).
MESSAGE_MAX_LINES = 60
MESSAGE_MAX_WIDTH = 72
SIGNOFF = "Signed-off-by"


def prose_lines(patch: Patch) -> list[str]:
    """The message's prose: its subject line through its last line of text before the trailer block."""
    lines = patch.message.rstrip("\n").split("\n")
    blanks = [index for index, line in enumerate(lines) if not line.strip()]
    if patch.trailers and blanks:
        lines = lines[: blanks[-1]]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _file_line_numbers(patch: Patch) -> list[int]:
    """The line of the patch file each message line is written on (1-based; the subject's header for line 1).

    The message is the Subject header's value, a blank line, then the body as the file holds it
    from its first non-empty line (``series.parse_mail``).
    """
    lines = as_git_am_reads(patch.raw).decode("utf-8").split("\n")
    header_end = next((index for index, line in enumerate(lines) if not line), len(lines))
    subject = next((index for index, line in enumerate(lines[:header_end]) if line.lower().startswith("subject:")), 0)
    body = next((index for index in range(header_end + 1, len(lines)) if lines[index]), header_end + 1)
    count = len(patch.message.split("\n"))
    return [subject + 1, header_end + 1, *range(body + 1, body + 1 + count)]


def _one_reference(line: str) -> bool:
    """A line that is a single path or URL and nothing else: wrapping it would break it."""
    token = line.strip()
    return bool(token) and not any(char.isspace() for char in token) and ("/" in token)


def length_problems(patch: Patch, series: str) -> list[str]:
    """Why the message does not fit one screen: too many lines, or a line wider than 72 (empty: it fits)."""
    prose = prose_lines(patch)
    problems = []
    if len(prose) > MESSAGE_MAX_LINES:
        stem = Path(patch.name).stem
        problems.append(
            f"the message is {len(prose)} lines from its subject to the trailer block, blank lines counted "
            f"(at most {MESSAGE_MAX_LINES}): move long evidence to docs/patches/{series}/{stem}.md and link it "
            "from the message on one line"
        )
    for number, line in enumerate(prose):
        if len(line) > MESSAGE_MAX_WIDTH and (number == 0 or not _one_reference(line)):
            what = "the subject" if number == 0 else f"message line {number + 1}"
            problems.append(
                f"{what} (line {_file_line_numbers(patch)[number]} of the file) is {len(line)} characters wide "
                f"(at most {MESSAGE_MAX_WIDTH}): {'shorten' if number == 0 else 'wrap'} it"
            )
    return problems


def authorship_problems(patch: Patch, maintainer: str, series: str) -> list[str]:
    """Why the patch is not authored and signed off by its series' maintainer (empty: it is)."""
    whose = f"its series' maintainer ({series} in {maintainers.MAINTAINERS_FILE})"
    problems = []
    author = patch.author
    if author != maintainer:
        problems.append(
            f"From: {author} is not {whose}, {maintainer}: commit it with "
            f"--author='{maintainer}' (git commit --amend in build/patched, then export-patches), or name "
            f"{author} for {series} in {maintainers.MAINTAINERS_FILE}"
        )
    signoffs = patch.values(SIGNOFF)
    if not signoffs:
        problems.append(
            f"no '{SIGNOFF}: {maintainer}' in its trailer block ({whose}): end the block with that line "
            "(git commit -s under that identity writes it)"
        )
    for other in dict.fromkeys(value for value in signoffs if value != maintainer):
        problems.append(
            f"signed off by {other}, not by {whose}, {maintainer}: make that line "
            f"'{SIGNOFF}: {maintainer}', or name {other} for {series} in {maintainers.MAINTAINERS_FILE}"
        )
    if signoffs.count(maintainer) > 1:
        problems.append(
            f"signed off by {maintainer} {signoffs.count(maintainer)} times: keep one '{SIGNOFF}:' line "
            "(git commit --amend -s adds a second after the Patch-File trailer; amend without -s)"
        )
    return problems


def _project_series(repo_root: Path, patches_dir: Path, entries: list[SeriesEntry]) -> set[str] | None:
    """The series patches/series lists, which maintainers.toml may name (None: patches/series unreadable).

    A carried series (cpu/patches) is carried from patches/: its maintainers are patches/' ones.
    """
    if patches_dir.resolve() != (repo_root / "patches").resolve():
        try:
            entries = read_series(repo_root / "patches")
        except SeriesError:
            return None
    return {entry.series for entry in entries if entry.series}


def _paragraphs(patch: Patch) -> list[str]:
    """The message body's paragraphs: no subject line, and no trailer block where git found one."""
    paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", patch.message)[1:] if p.strip()]
    return paragraphs[:-1] if paragraphs and patch.trailers else paragraphs


def _near_heading(paragraph: str) -> str | None:
    """The heading a paragraph's first line seems meant as ('## Tests', 'Why:', 'how'), or None."""
    first = paragraph.split("\n", 1)[0].strip().lstrip("#").strip().rstrip(":").strip().lower()
    return next((heading for heading in MESSAGE_HEADINGS if heading.lower() == first), None)


def heading_problems(patch: Patch) -> list[str]:
    """Why the body is not the five headings, once each, in order, each with text under it (empty: it is)."""
    paragraphs = _paragraphs(patch)
    found = [(index, text) for index, text in enumerate(paragraphs) if text in MESSAGE_HEADINGS]
    form = f"each alone on its line between blank lines, in the order {', '.join(MESSAGE_HEADINGS)}"
    problems = []
    for heading in MESSAGE_HEADINGS:
        count = sum(1 for _, text in found if text == heading)
        if count > 1:
            problems.append(f"the message has the heading {heading!r} {count} times (once each: {form})")
        elif not count:
            near = [p for p in paragraphs if p != heading and _near_heading(p) == heading]
            first = near[0].splitlines()[0].strip() if near else ""
            hint = f"; write {first!r} as {heading!r}" if first != heading else f"; {heading!r} is not alone"
            hint = hint if near else ""
            problems.append(f"the message lacks the heading {heading!r} ({form}){hint}")
    order = [text for _, text in found]
    if sorted(order, key=MESSAGE_HEADINGS.index) != order:
        problems.append(f"the message's headings are out of order: {', '.join(order)} ({form})")
    if paragraphs and paragraphs[0] not in MESSAGE_HEADINGS and found:
        problems.append(f"the message body has text before its first heading {found[0][1]!r} (it starts with 'Why')")
    for position, (index, heading) in enumerate(found):
        following = found[position + 1][0] if position + 1 < len(found) else len(paragraphs)
        if following == index + 1:
            problems.append(f"the heading {heading!r} has no text under it")
    return problems


def forwarded_problems(patch: Patch) -> list[str]:
    """Why a Forwarded value is neither a URL nor a reason with a drop condition (empty: every one is)."""
    problems = []
    for value in patch.values("Forwarded"):
        if FORWARDED_URL_RE.match(value):
            continue
        match = FORWARDED_NOT_RE.match(value)
        if not match or not match["reason"].strip() or not match["drop"].strip():
            problems.append(
                f"Forwarded: {value!r} is neither the upstream issue's or PR's URL nor "
                "'no (reason: WHY; drop when: CONDITION)'"
            )
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
    try:
        carriers: maintainers.Maintainers | None = maintainers.load(
            repo_root / maintainers.MAINTAINERS_FILE, _project_series(repo_root, patches_dir, entries)
        )
    except maintainers.MaintainersError as exc:
        problems.append(str(exc))
        carriers = None  # each patch's author and sign-off cannot be checked against it
    counts = Counter(entry.path for entry in entries)
    for name, count in counts.items():
        if count > 1:
            problems.append(f"patches/{shown(name)}: listed {count} times in series")
    problems.extend(f"patches/{line}" for line in same_files(patches_dir, list(counts)))
    on_disk = {p.relative_to(patches_dir).as_posix() for p in patches_dir.rglob("*.patch")}
    for name in sorted(on_disk - set(counts)):
        problems.append(f"patches/{shown(name)}: not listed in {SERIES_FILE}")
        unclear = name_problem(name)
        if unclear:
            problems.append(f"patches/{unclear}")
    loaded: dict[str, Patch | str] = {}
    for name in counts:
        try:
            loaded[name] = load_patch(patches_dir, name)
        except (SeriesError, UnicodeDecodeError) as exc:
            loaded[name] = str(exc)
    parse_all_trailers([patch for patch in loaded.values() if isinstance(patch, Patch)])  # one git process
    for name, patch in loaded.items():
        if not isinstance(patch, Patch):
            problems.append(f"patches/{name}: {patch}")
            continue
        where = f"patches/{name}"
        present = {key.lower() for key, _ in patch.trailers}
        for required in REQUIRED_FIELDS:
            if required.lower() not in present:
                problems.append(f"{where}: missing header '{required}:'")
        for group in ONE_OF_FIELDS:
            if not any(key.lower() in present for key in group):
                problems.append(f"{where}: needs one of the headers {', '.join(k + ':' for k in group)}")
        problems.extend(f"{where}: {problem}" for problem in heading_problems(patch))
        problems.extend(f"{where}: {problem}" for problem in forwarded_problems(patch))
        series = patch.series
        directory = name.split("/", 1)[0] if "/" in name else ""
        carried_by = series or directory
        if carriers is not None:
            problems.extend(
                f"{where}: {problem}" for problem in authorship_problems(patch, carriers.of(carried_by), carried_by)
            )
        problems.extend(f"{where}: {problem}" for problem in length_problems(patch, carried_by))
        if patch.subject.startswith("["):
            problems.append(f"{where}: subject starts with '[...]', which git am strips; use 'component: subject'")
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
        problems.extend(
            f"{where}: writes {name}, which steers how git converts, diffs and merges files; "
            "the series may not carry git attributes"
            for name in paths.attribute_files(patch)
        )
    problems.extend(spdx_problems(repo_root))
    # README indexes the project's own series, not a carried one (cpu/patches), and only a series
    # whose every patch loaded: a broken patch is reported above, not as a stale row.
    patches = [patch for patch in loaded.values() if isinstance(patch, Patch)]
    if patches_dir.resolve() == (repo_root / "patches").resolve() and len(patches) == len(loaded):
        problems.extend(patch_index.problems(repo_root / patch_index.README_NAME, patches))
    return problems
