"""A patch's status against a tree, decided by git itself before anything is committed.

    clean             every hunk applies at its recorded line
    offset            every hunk applies, some at other lines
    merged-3way       applies only through a 3-way merge
    fuzz              applies only with reduced context and no 3-way merge is possible
    conflict          does not apply, not even through a 3-way merge
    already-upstream  the patch reverse-applies: upstream already carries the change
    target-missing    a file the patch modifies does not exist upstream

A 3-way merge can only be tried for real, so that trial is rolled back. Every git step reads the
patch from ``mail`` (the bytes ``series.as_git_am_reads`` gives), the same file the commit reads.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay.series import Patch

if TYPE_CHECKING:  # the functions only call repo.git: GitPython is imported by whoever made the repo
    import git

HUNK_OK_RE = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: \(offset (-?\d+) lines?\))?\.", re.M)
CONTEXT_REDUCED_RE = re.compile(r"^Context reduced to \((\d+)/(\d+)\) to apply fragment at (\d+)", re.M)
CHECKING_RE = re.compile(r"^Checking patch (.+)\.\.\.$", re.M)
FAILED_AT_RE = re.compile(r"^error: patch failed: (.+):(\d+)$", re.M)
FUZZ_CONTEXT = 1


class Status(enum.StrEnum):
    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    MERGED_3WAY = "merged-3way"
    CONFLICT = "conflict"
    ALREADY_UPSTREAM = "already-upstream"
    TARGET_MISSING = "target-missing"


@dataclass
class HunkNote:
    file: str
    hunk: int  # 1-based index within the file
    recorded_line: int  # where the patch says the hunk starts (old side)
    note: str  # "offset +4", "fuzz (context 2/3)", "does not apply", "missing file", ...

    def __str__(self) -> str:
        return f"{self.file} hunk #{self.hunk} (line {self.recorded_line}): {self.note}"


@dataclass
class PatchResult:
    name: str
    series: str
    subject: str
    status: Status
    accepted: bool
    hunks: list[HunkNote] = field(default_factory=list)
    detail: str = ""
    commit: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["status"] = str(self.status)
        return data


def apply_check(repo: git.Repo, patch_file: Path, *flags: str) -> tuple[int, str]:
    status, _out, err = repo.git.apply(
        "--check", "--verbose", *flags, str(patch_file), with_extended_output=True, with_exceptions=False
    )
    return status, err


def _recorded_starts(patch: Patch) -> dict[tuple[str, int], int]:
    starts: dict[tuple[str, int], int] = {}
    for patched in patch.diff:
        for index, hunk in enumerate(patched, start=1):
            starts[(patched.path, index)] = hunk.source_start
    return starts


def _notes_from_success(patch: Patch, stderr: str) -> list[HunkNote]:
    """Hunk notes from git's verbose output: offsets, and fuzz ("Context reduced") per hunk.

    git prints "Hunk #N succeeded at L (offset K lines)." and, when it had to drop context,
    "Context reduced to (a/b) ..." right after it; with reduced context the offset git prints is
    relative to the trimmed hunk, so for such a hunk only the fuzz note is kept.
    """
    starts = _recorded_starts(patch)
    notes: dict[tuple[str, int], HunkNote] = {}
    current_file = ""
    last: tuple[str, int] | None = None
    for line in stderr.splitlines():
        checking = CHECKING_RE.match(line)
        if checking:
            current_file = checking.group(1)
            continue
        succeeded = HUNK_OK_RE.match(line)
        if succeeded:
            hunk, offset = int(succeeded.group(1)), succeeded.group(3)
            last = (current_file, hunk)
            if offset and int(offset) != 0:
                notes[last] = HunkNote(current_file, hunk, starts.get(last, 0), f"offset {int(offset):+d}")
            continue
        reduced = CONTEXT_REDUCED_RE.match(line)
        if reduced:
            key = last or (current_file, 0)
            notes[key] = HunkNote(
                key[0],
                key[1],
                starts.get(key, 0),
                f"fuzz: context reduced to {reduced.group(1)}/{reduced.group(2)}, applies at line {reduced.group(3)}",
            )
    return list(notes.values())


def _failing_hunks(repo: git.Repo, patch: Patch, scratch: Path) -> list[HunkNote]:
    """Check every hunk on its own (unidiff splits them) to name each one that does not apply."""
    notes: list[HunkNote] = []
    for patched in patch.diff:
        header = "".join(f"{line}\n" for line in str(patched.patch_info).splitlines())
        header += f"--- {patched.source_file}\n+++ {patched.target_file}\n"
        for index, hunk in enumerate(patched, start=1):
            single = scratch / f"hunk-{index}.patch"
            single.write_text(header + str(hunk), encoding="utf-8")
            status, _ = apply_check(repo, single, "--recount")
            if status != 0:
                notes.append(HunkNote(patched.path, index, hunk.source_start, "does not apply"))
    return notes


def _missing_targets(repo: git.Repo, patch: Patch) -> list[HunkNote]:
    root = Path(repo.working_tree_dir or ".")
    notes = []
    for patched in patch.diff:
        if patched.is_added_file:
            continue
        if not (root / patched.path).exists():
            notes.append(HunkNote(patched.path, 0, 0, "file does not exist upstream"))
    return notes


def _three_way_succeeds(repo: git.Repo, patch_file: Path) -> bool:
    """Try ``git am --3way`` for real, then roll back: git has no dry-run for a 3-way merge."""
    head = repo.head.commit.hexsha
    status, _out, _err = repo.git.am(
        "--3way", "--quiet", str(patch_file), with_extended_output=True, with_exceptions=False
    )
    if status != 0:
        repo.git.am("--abort", with_exceptions=False)
    repo.git.reset("--hard", "--quiet", head)
    repo.git.clean("-fdq")
    return status == 0


def applied_cleanly(patch: Patch, stderr: str) -> PatchResult:
    """The status of a patch that applied (``stderr``: git apply's verbose output for it): clean or
    offset, with its hunk notes. Reads nothing from any repository."""
    notes = _notes_from_success(patch, stderr)
    return PatchResult(
        name=patch.name,
        series=patch.series,
        subject=patch.subject,
        accepted=False,
        status=Status.OFFSET if notes else Status.CLEAN,
        hunks=notes,
    )


def classify(repo: git.Repo, patch: Patch, mail: Path, check: tuple[int, str] | None = None) -> PatchResult:
    """Decide ``patch``'s status (git reads it from ``mail``) against the current tree, changing nothing.

    ``check`` is ``apply_check(repo, mail)`` where the caller already ran it on this tree.
    """
    base = dict(name=patch.name, series=patch.series, subject=patch.subject, accepted=False)
    status, err = check if check is not None else apply_check(repo, mail)
    if status == 0:
        return applied_cleanly(patch, err)
    reverse_status, _ = apply_check(repo, mail, "--reverse")
    if reverse_status == 0:
        return PatchResult(
            status=Status.ALREADY_UPSTREAM,
            detail="the patch reverse-applies: upstream already contains this change",
            **base,
        )
    missing = _missing_targets(repo, patch)
    if missing:
        return PatchResult(status=Status.TARGET_MISSING, hunks=missing, detail="a modified file is missing", **base)
    import tempfile  # here: only a patch that does not apply cleanly needs it

    with tempfile.TemporaryDirectory(prefix="vllm-overlay-hunks-") as tmp:
        failing = _failing_hunks(repo, patch, Path(tmp))
    # A 3-way merge is tried before fuzz: it resolves against the exact blobs the patch was made
    # on, where fuzz only drops context lines and hopes. Fuzz remains for patches whose preimage
    # blobs are unknown to the repository.
    if _three_way_succeeds(repo, mail):
        return PatchResult(status=Status.MERGED_3WAY, hunks=failing, detail="applies through a 3-way merge", **base)
    fuzz_status, fuzz_err = apply_check(repo, mail, f"-C{FUZZ_CONTEXT}")
    if fuzz_status == 0:
        notes = [n for n in _notes_from_success(patch, fuzz_err) if n.note.startswith("fuzz")]
        return PatchResult(
            status=Status.FUZZ, hunks=notes or failing, detail="applies only with reduced context", **base
        )
    return PatchResult(status=Status.CONFLICT, hunks=failing, detail=_first_error(err), **base)


def _first_error(stderr: str) -> str:
    match = FAILED_AT_RE.search(stderr)
    return f"patch failed at {match.group(1)}:{match.group(2)}" if match else stderr.strip().splitlines()[-1:][0]
