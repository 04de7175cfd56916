"""The strict apply engine: the series onto a fresh upstream checkout, one commit per patch.

Every patch gets exactly one status, decided by git itself before the patch is committed (a 3-way
merge can only be tried for real, so that trial is rolled back):

    clean             every hunk applies at its recorded line
    offset            every hunk applies, some at other lines (refused unless --allow-offset)
    merged-3way       applies only through a 3-way merge (refused unless --3way)
    fuzz              applies only with reduced context and no 3-way merge is possible
                      (refused unless --allow-fuzz)
    conflict          does not apply, not even through a 3-way merge
    already-upstream  the patch reverse-applies: upstream already carries the change
    target-missing    a file the patch modifies does not exist upstream

The work happens in a staging clone beside the output directory. Only when every patch was
accepted does the staging clone replace the output directory, so a failed or interrupted run
never leaves a half-applied tree behind, and the next run starts from a fresh clone.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git

from vllm_overlay import paths
from vllm_overlay.series import PATCH_FILE_TRAILER, Patch
from vllm_overlay.sources import Upstream

CONFIG_UPSTREAM = "vllm-overlay.upstream"
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


@dataclass(frozen=True)
class Options:
    allow_offset: bool = False
    allow_fuzz: bool = False
    three_way: bool = False

    def accepts(self, status: Status) -> bool:
        return status is Status.CLEAN or {
            Status.OFFSET: self.allow_offset,
            Status.FUZZ: self.allow_fuzz,
            Status.MERGED_3WAY: self.three_way,
        }.get(status, False)


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


@dataclass
class Report:
    upstream: Upstream
    output: str
    results: list[PatchResult]
    published: bool

    @property
    def ok(self) -> bool:
        return self.published and all(r.accepted for r in self.results)

    def result_for(self, name: str) -> PatchResult | None:
        return next((r for r in self.results if r.name == name), None)

    def to_json(self) -> dict[str, object]:
        return {
            "upstream": self.upstream.to_json(),
            "output": self.output,
            "published": self.published,
            "ok": self.ok,
            "patches": [r.to_json() for r in self.results],
        }


class ApplyError(RuntimeError):
    """A patch was rejected before any status could be decided (unsafe paths, bad file)."""


def _git_check(repo: git.Repo, patch_file: Path, *flags: str) -> tuple[int, str]:
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
            status, _ = _git_check(repo, single, "--recount")
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


def classify(repo: git.Repo, patch: Patch) -> PatchResult:
    """Decide a patch's status against the repository's current tree without changing it."""
    base = dict(name=patch.name, series=patch.series, subject=patch.subject, accepted=False)
    status, err = _git_check(repo, patch.path)
    if status == 0:
        notes = _notes_from_success(patch, err)
        return PatchResult(status=Status.OFFSET if notes else Status.CLEAN, hunks=notes, **base)
    reverse_status, _ = _git_check(repo, patch.path, "--reverse")
    if reverse_status == 0:
        return PatchResult(
            status=Status.ALREADY_UPSTREAM,
            detail="the patch reverse-applies: upstream already contains this change",
            **base,
        )
    missing = _missing_targets(repo, patch)
    if missing:
        return PatchResult(status=Status.TARGET_MISSING, hunks=missing, detail="a modified file is missing", **base)
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-hunks-") as tmp:
        failing = _failing_hunks(repo, patch, Path(tmp))
    # A 3-way merge is tried before fuzz: it resolves against the exact blobs the patch was made
    # on, where fuzz only drops context lines and hopes. Fuzz remains for patches whose preimage
    # blobs are unknown to the repository.
    if _three_way_succeeds(repo, patch.path):
        return PatchResult(status=Status.MERGED_3WAY, hunks=failing, detail="applies through a 3-way merge", **base)
    fuzz_status, fuzz_err = _git_check(repo, patch.path, f"-C{FUZZ_CONTEXT}")
    if fuzz_status == 0:
        notes = [n for n in _notes_from_success(patch, fuzz_err) if n.note.startswith("fuzz")]
        return PatchResult(
            status=Status.FUZZ, hunks=notes or failing, detail="applies only with reduced context", **base
        )
    return PatchResult(status=Status.CONFLICT, hunks=failing, detail=_first_error(err), **base)


def _first_error(stderr: str) -> str:
    match = FAILED_AT_RE.search(stderr)
    return f"patch failed at {match.group(1)}:{match.group(2)}" if match else stderr.strip().splitlines()[-1:][0]


def commit_patch(repo: git.Repo, patch: Patch, status: Status) -> str:
    """Apply an accepted patch with ``git am`` and record which file it came from."""
    flags = ["--quiet", "--keep-cr"]
    if status is Status.FUZZ:
        flags.append(f"-C{FUZZ_CONTEXT}")
    if status is Status.MERGED_3WAY:
        flags.append("--3way")
    env = _committer_env(repo, patch)
    with repo.git.custom_environment(**env):
        repo.git.am(*flags, str(patch.path))
        repo.git.commit(
            "--amend", "--quiet", "--no-edit", "--no-verify", f"--trailer={PATCH_FILE_TRAILER}: {patch.name}"
        )
    return repo.head.commit.hexsha


def _committer_env(repo: git.Repo, patch: Patch) -> dict[str, str]:
    """Committer = author, at the author's date: the same series gives the same commit ids."""
    author = repo.git.execute(["git", "mailinfo", "/dev/null", "/dev/null"], istream=open(patch.path, "rb"))
    fields = dict(line.split(": ", 1) for line in author.splitlines() if ": " in line)
    return {
        "GIT_COMMITTER_NAME": fields.get("Author", "vllm-overlay"),
        "GIT_COMMITTER_EMAIL": fields.get("Email", "vllm-overlay@invalid"),
        "GIT_COMMITTER_DATE": fields.get("Date", "2000-01-01T00:00:00+0000"),
    }


def seed_preimages(repo: git.Repo, base_commit: str, patches: list[Patch]) -> int:
    """Write into the object store every blob the series creates on ``base_commit``.

    A 3-way merge needs the exact blob a patch was made against (its ``index`` line). For the
    first patch touching a file that is the upstream blob, but for later ones it is the file as
    an earlier patch left it, which no upstream contains. Replaying the series with
    ``git apply --cached`` on a private index recreates those blobs without touching any tree.
    Returns how many patches replayed.
    """
    replayed = 0
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-seed-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        with repo.git.custom_environment(**env):
            repo.git.read_tree(base_commit)
            for patch in patches:
                status, _out, _err = repo.git.apply(
                    "--cached", str(patch.path), with_extended_output=True, with_exceptions=False
                )
                replayed += status == 0
    return replayed


def staging_dir(output: Path) -> Path:
    return output.parent / f".{output.name}.staging-{os.getpid()}"


def remove_stale_staging(output: Path) -> None:
    """Delete staging clones left behind by interrupted runs."""
    for stale in output.parent.glob(f".{output.name}.staging-*"):
        shutil.rmtree(stale, ignore_errors=True)


def publish(staging: Path, output: Path) -> None:
    """Replace ``output`` with ``staging`` in two renames; the old tree is gone only afterwards."""
    retired = output.parent / f".{output.name}.retired-{os.getpid()}"
    if output.exists():
        os.replace(output, retired)
    os.replace(staging, output)
    shutil.rmtree(retired, ignore_errors=True)


def apply_series(
    patches: list[Patch],
    upstream: Upstream,
    checkout: Callable[[Path], git.Repo],
    output: Path,
    options: Options,
    progress: Callable[[int, int, str], None] | None = None,
    publish_partial: bool = False,
    seed_base: Callable[[], str | None] | None = None,
) -> Report:
    """Apply ``patches`` onto ``upstream`` into ``output``.

    The result is published only if every patch was accepted, unless ``publish_partial`` (used
    by the audit, which wants the accepted part for a range-diff) is set. ``seed_base`` returns
    the upstream commit the series was written for; it is called only when a patch does not
    apply cleanly, and the blobs a 3-way merge needs are then recreated (``seed_preimages``).
    """
    output = output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(output)
    staging = staging_dir(output)
    results: list[PatchResult] = []
    try:
        repo = checkout(staging)
        repo.git.config(CONFIG_UPSTREAM, upstream.commit)
        seeded = False
        tree_root = Path(repo.working_tree_dir or staging)
        for index, patch in enumerate(patches, start=1):
            if progress:
                progress(index, len(patches), patch.name)
            problems = paths.problems(patch, tree_root)
            if problems:
                raise ApplyError(f"{patch.name}: refused: " + "; ".join(problems))
            if not seeded and seed_base is not None and _git_check(repo, patch.path)[0] != 0:
                seeded = True
                base_commit = seed_base()
                if base_commit and base_commit != upstream.commit:
                    # The base may have been imported into the store after this clone was made.
                    repo.git.fetch("--quiet", "origin", "+refs/tags/*:refs/tags/*")
                    seed_preimages(repo, base_commit, patches)
            result = classify(repo, patch)
            result.accepted = options.accepts(result.status)
            if result.accepted:
                result.commit = commit_patch(repo, patch, result.status)
            results.append(result)
        published = publish_partial or all(r.accepted for r in results)
        if published:
            publish(staging, output)
        return Report(upstream=upstream, output=str(output), results=results, published=published)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
