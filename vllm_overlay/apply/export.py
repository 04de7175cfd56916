"""From the patched repository back to patches/ and series, byte-stable.

Each commit after the upstream commit becomes one file, written by ``git format-patch`` with
options that make the bytes a function of the commit alone: zero commit hash, no version
signature, full index lines, fixed diffstat width, and user/system git config ignored. The
``Patch-File`` trailer that apply adds is removed again, so apply + export is the identity.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from vllm_overlay import atomicfile, faults, interrupts
from vllm_overlay import git as gitcmd
from vllm_overlay.apply import patched_repo
from vllm_overlay.apply.patched_repo import PATCH_FILE_TRAILER
from vllm_overlay.errors import InputError
from vllm_overlay.series import (
    SERIES_FILE,
    SERIES_NAME_RE,
    message_problem,
    read_series,
    render_series,
)
from vllm_overlay.upstream import trees as upstream_trees

FORMAT_PATCH_OPTIONS = (
    "--zero-commit",
    "--no-signature",
    "--full-index",
    "--no-numbered",
    "--no-renames",
    "--no-notes",
    "--no-color",
    "--stat=80",
    "--diff-algorithm=myers",
    "--encoding=UTF-8",
)
# Ignore the user's and the system's git configuration: export must not depend on who runs it.
ISOLATED_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
# format-patch's environment: isolated, and git's messages untranslated (the diffstat's summary line).
FORMAT_PATCH_ENV = {**ISOLATED_ENV, "LANGUAGE": "C", "LC_ALL": "C"}


class ExportError(InputError, RuntimeError):
    """The repository cannot be exported (no upstream base, a commit without a Series trailer...)."""


@dataclass(frozen=True)
class ExportedPatch:
    name: str  # path relative to patches/
    content: bytes


def slugify(subject: str, limit: int = 60) -> str:
    """File name stem from a subject: lowercase words joined by '-', cut at a word boundary."""
    words = re.sub(r"[^A-Za-z0-9]+", " ", subject).lower().split()
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > limit and slug:
            break
        slug = candidate
    return slug[:limit] or "patch"


def _drop_patch_file_trailer(text: str) -> str:
    head, sep, rest = text.partition("\n---\n")
    head = re.sub(rf"^{PATCH_FILE_TRAILER}: .*\n?", "", head + "\n", flags=re.M).rstrip("\n")
    return head + sep + rest


def _upstream_base(repo: git.Repo) -> str:
    """patched_repo.upstream_base, refused as an ExportError (what export's callers catch)."""
    try:
        return patched_repo.upstream_base(repo)
    except patched_repo.NoUpstream as exc:
        raise ExportError(str(exc)) from None


# What git leaves in the git directory while an operation is stopped half-way.
IN_PROGRESS = {
    "rebase-merge": "a rebase",
    "rebase-apply": "a rebase or git am",
    "MERGE_HEAD": "a merge",
    "CHERRY_PICK_HEAD": "a cherry-pick",
    "REVERT_HEAD": "a revert",
    "BISECT_LOG": "a bisect",
}


def operation_in_progress(repo: git.Repo) -> str | None:
    """The git operation stopped half-way in ``repo``, if any.

    Mid-rebase, HEAD is only part of the series: exporting then would delete the patches
    after it from patches/.
    """
    names = list(IN_PROGRESS)
    # One git process for every name (``--git-path`` follows worktrees and $GIT_DIR as git does).
    found = repo.git.rev_parse(*(arg for name in names for arg in ("--git-path", name))).splitlines()
    for name, path in zip(names, found, strict=True):
        if Path(repo.working_tree_dir, path).exists():
            return IN_PROGRESS[name]
    return None


def _confined_patch_file(name: str, series: str | None, sha: str) -> str:
    """``name`` if it is ``SERIES/FILE.patch`` inside patches/ (trailers are data from a repository)."""
    parts = name.split("/")
    problem = None
    if name.startswith("/") or "\\" in name or len(parts) != 2:
        problem = "is not SERIES/FILE.patch inside patches/"
    elif not SERIES_NAME_RE.match(parts[0]) or parts[1] in ("", ".", "..") or not parts[1].endswith(".patch"):
        problem = "is not SERIES/FILE.patch inside patches/"
    elif series is not None and parts[0] != series:
        problem = f"names the folder {parts[0]}/, but the commit's Series: is {series}"
    if problem:
        raise ExportError(
            f"commit {sha[:12]}: its {PATCH_FILE_TRAILER}: trailer {name!r} {problem}; "
            f"fix or remove the trailer (git commit --amend), nothing was written"
        )
    return name


def base_release(repo_dir: Path) -> tuple[str, list[str], str | None]:
    """The tree's upstream commit, the release tags on it, and the version its vllm/_version.py records."""
    repo = git.Repo(repo_dir)
    base = _upstream_base(repo)
    tags = repo.git.tag("--points-at", base).split()
    file_version = upstream_trees.version_field(
        upstream_trees.version_file_of_commit(repo_dir, base), upstream_trees.VERSION_RE_IN_FILE
    )
    return base, tags, file_version


def is_on_release(tags: list[str], file_version: str | None, version: str) -> bool:
    """The one rule (export and the image): tagged ``upstream/<version>``, or that version's tree."""
    return patched_repo.upstream_tag(version) in tags or file_version == version


def check_locked_upstream(repo_dir: Path, version: str) -> None:
    """Refuse a patched repository that is not built on the locked release.

    patches/ is the series for the lock: exported from a tree applied onto another upstream
    (``apply-patches --upstream 0.32.0``), every patch would carry that upstream's context and
    index lines, and the next strict apply onto the locked release would refuse them.
    """
    base, tags, file_version = base_release(repo_dir)
    if not is_on_release(tags, file_version, version):
        raise ExportError(
            f"{repo_dir} is built on upstream {file_version or base[:12]}, not on the locked {version} "
            f"(upstream/{version}): exporting it would write patches for another upstream. Run "
            "scripts/apply-patches (onto the lock) and redo the change there, or move the lock with scripts/bump"
        )


@dataclass(frozen=True)
class RangeCommit:
    """One commit after the upstream base, as one ``git log`` over the range reads it."""

    sha: str
    parents: list[str]
    patch_file: str | None  # its last Patch-File trailer (None: none)
    series: str | None  # its last Series trailer (None: none)
    message: str  # the raw message (%B)

    @property
    def summary(self) -> str:
        return self.message.split("\n", 1)[0]


def _last_trailer(values: str) -> str | None:
    found = [line.strip() for line in values.splitlines() if line.strip()]
    return found[-1] if found else None


def range_commits(repo_dir: Path, base: str) -> list[RangeCommit]:
    """Every commit from ``base`` (excluded) to HEAD, oldest first, in topological order: one process.

    Fields and commits are NUL-separated (no message or trailer holds a NUL); trailers are read
    by git's own parser, as ``patched_repo.patch_commits`` and ``trailer_value`` read them.
    """
    fields = (
        "%H",
        "%P",
        f"%(trailers:key={PATCH_FILE_TRAILER},valueonly,unfold,separator=%x0a)",
        "%(trailers:key=Series,valueonly,unfold,separator=%x0a)",
        "%B",
    )
    out = gitcmd.git(
        repo_dir, "log", "-z", "--reverse", "--topo-order", f"--format={'%x00'.join(fields)}", f"{base}..HEAD"
    )
    values = out.split("\0")[:-1]  # every record ends in a NUL
    commits = []
    for at in range(0, len(values), len(fields)):
        sha, parents, patch_file, series, message = values[at : at + len(fields)]
        commits.append(RangeCommit(sha, parents.split(), _last_trailer(patch_file), _last_trailer(series), message))
    return commits


def touched_paths(repo_dir: Path, commits: list[RangeCommit]) -> dict[str, list[str]]:
    """The paths each (single-parent) commit changes against its parent: one ``git diff-tree --stdin``.

    Raw output (``-z``): a commit id, then per change a ``:MODES IDS STATUS`` field and its path,
    so a path never reads as a commit id. Merge and root commits list nothing (export refuses merges).
    """
    touched: dict[str, list[str]] = {commit.sha: [] for commit in commits}
    if not commits:
        return touched
    listed = "".join(f"{commit.sha}\n" for commit in commits).encode()
    out = gitcmd.git(repo_dir, "diff-tree", "--stdin", "-r", "-z", "--no-renames", stdin=listed)
    current = None
    fields = iter(out.split("\0"))
    for field in fields:
        if field.startswith(":"):
            touched[current].append(next(fields))  # type: ignore[index]
        elif field:
            current = field
    return touched


def _unexportable(commit: RangeCommit, touched: list[str]) -> str | None:
    """Why ``commit`` (changing ``touched`` against its parent) cannot become one patch of the series."""
    if len(commit.parents) > 1:
        return "is a merge commit; a series is a straight line of commits (git rebase it onto upstream)"
    if commit.parents and not touched:  # no path differs: its tree is its parent's
        return "changes nothing (an empty commit); drop it (git rebase -i) or give it its change"
    attributes = [name for name in touched if name == ".gitattributes" or name.endswith("/.gitattributes")]
    if attributes:
        return (
            f"changes {attributes[0]}, which changes how git diffs files (binary patches, filters); "
            "the series may not carry git attributes"
        )
    return None


def formatted_patches(repo_dir: Path, base: str, count: int) -> list[str]:
    """``git format-patch`` of every commit from ``base`` to HEAD, one text per commit, oldest first.

    One process for the range, each patch in a file of its own (``--numbered-files``), the bytes
    those of ``git format-patch -1`` of each commit: no cover letter or threading headers, which a
    range could get from the repository's config.
    """
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-export-") as folder:
        listed = gitcmd.git(
            repo_dir,
            "format-patch",
            *FORMAT_PATCH_OPTIONS,
            "--no-cover-letter",
            "--no-thread",
            "--numbered-files",
            "-o",
            folder,
            f"{base}..HEAD",
            env=FORMAT_PATCH_ENV,
        ).splitlines()
        if len(listed) != count:
            raise ExportError(f"{repo_dir}: git format-patch wrote {len(listed)} patches for {count} commits")
        return [Path(folder, name).read_bytes().decode("utf-8", "surrogateescape") for name in listed]


def _uncommitted(repo: git.Repo) -> bool:
    """Whether a tracked file holds a change not committed, staged or not (untracked files aside).

    One ``git status``, not a ``git diff`` of the index and one of the tree: a tree apply-patches
    has just published may hold files git takes for racily clean (written in the second its index
    was, docs/speed.md), which every ``git diff`` hashes again; ``git status`` hashes them and,
    where it can take the index's lock, writes the index back, which settles them once the
    second has passed.
    """
    return bool(repo.git.status("--porcelain", "--untracked-files=no", "--no-renames"))


def export_commits(repo_dir: Path) -> list[ExportedPatch]:
    """Format every commit between the upstream base and HEAD."""
    repo = git.Repo(repo_dir)
    operation = operation_in_progress(repo)
    if operation:
        raise ExportError(f"{repo_dir}: {operation} is in progress; finish or abort it first")
    if _uncommitted(repo):
        raise ExportError(f"{repo_dir}: uncommitted changes; commit (or amend) them first")
    base = _upstream_base(repo)
    commits = range_commits(repo_dir, base)
    touched = touched_paths(repo_dir, commits)
    names: list[str] = []
    used: set[str] = set()
    for commit in commits:
        sha = commit.sha
        problem = _unexportable(commit, touched[sha])
        if problem:
            raise ExportError(f"commit {sha[:12]} ({commit.summary}) {problem}; nothing was written")
        message = commit.message
        problem = message_problem(message.split("\n", 1)[1] if "\n" in message else "")
        if problem:
            raise ExportError(f"commit {sha[:12]} ({commit.summary}): {problem}; nothing was written")
        name = commit.patch_file
        series = commit.series
        if name is not None:
            name = _confined_patch_file(name, series, sha)
        else:
            if not series or not SERIES_NAME_RE.match(series):
                raise ExportError(f"commit {sha[:12]} has no valid 'Series:' trailer; add one to its message")
            name = f"{series}/{slugify(message.splitlines()[0])}.patch"
        if name in used:
            raise ExportError(f"two commits export to {name}; give one a different subject")
        used.add(name)
        names.append(name)
    texts = formatted_patches(repo_dir, base, len(commits)) if commits else []
    exported = [
        ExportedPatch(name, _drop_patch_file_trailer(text).encode("utf-8", "surrogateescape"))
        for name, text in zip(names, texts, strict=True)
    ]
    return exported


def rendered(exported: list[ExportedPatch]) -> dict[str, bytes]:
    """The full content patches/ should have: every patch file plus the series file."""
    files = {p.name: p.content for p in exported}
    files[SERIES_FILE] = render_series([p.name for p in exported]).encode("utf-8")
    return files


def rendered_partial(exported: list[ExportedPatch], patches_dir: Path) -> dict[str, bytes]:
    """What patches/ should hold after exporting a tree that holds only part of the series (``--only``).

    The patches the tree holds are written; every other listed patch stays as it is (the tree
    cannot say anything about them), and the series keeps its order, a new patch going after the
    last one of its series.
    """
    listed = [entry.path for entry in read_series(patches_dir)]
    order = list(listed)
    for patch in exported:
        if patch.name in order:
            continue
        folder = patch.name.split("/", 1)[0] + "/"
        same = [i for i, name in enumerate(order) if name.startswith(folder)]
        order.insert(same[-1] + 1 if same else len(order), patch.name)
    files = {p.name: p.content for p in exported}
    files[SERIES_FILE] = render_series(order).encode("utf-8")
    return files


def is_partial(repo_dir: Path) -> bool:
    """True for a tree apply-patches --only made: it holds a selection of the series, not all of it."""
    return patched_repo.is_partial(repo_dir)


def stale_files(patches_dir: Path, wanted: dict[str, bytes]) -> list[str]:
    """Patch files listed in the current series that the export no longer produces."""
    try:
        listed = [entry.path for entry in read_series(patches_dir)]
    except ValueError:
        listed = []
    series_text = wanted.get(SERIES_FILE, b"").decode("utf-8", "replace")
    still_listed = {line.split("#", 1)[0].strip() for line in series_text.splitlines()}
    return [name for name in listed if name not in wanted and name not in still_listed]


def differences(patches_dir: Path, wanted: dict[str, bytes]) -> list[str]:
    """Unified diffs between patches/ and what an export would write (empty when up to date)."""
    report: list[str] = []
    for name, content in sorted(wanted.items()):
        path = patches_dir / name
        current = path.read_bytes() if path.exists() else b""
        if current != content:
            report.extend(
                difflib.unified_diff(
                    current.decode("utf-8", "replace").splitlines(keepends=True),
                    content.decode("utf-8", "replace").splitlines(keepends=True),
                    fromfile=f"patches/{name}",
                    tofile=f"patches/{name} (exported)",
                )
            )
    for name in stale_files(patches_dir, wanted):
        report.append(f"patches/{name}: would be removed (no longer in the repository)\n")
    return report


def write(patches_dir: Path, wanted: dict[str, bytes]) -> list[str]:
    """Write the export; returns the names that changed.

    Each file is replaced atomically, and SIGINT/SIGTERM wait until every file is written (they
    arrive after it): patches/ is the old series or the new one, never half of each. Call it inside
    ``interrupts.deferred()`` to hold signals over what the caller writes with it (the Dockerfile).
    """
    changed: list[str] = []
    with interrupts.deferred():
        for name in stale_files(patches_dir, wanted):
            (patches_dir / name).unlink(missing_ok=True)
            changed.append(name)
            faults.phase("export-wrote-one")
        for name, content in sorted(wanted.items()):
            path = patches_dir / name
            if path.exists() and path.read_bytes() == content:
                continue
            atomicfile.write_bytes(path, content)
            changed.append(name)
            faults.phase("export-wrote-one")
    return changed


def unexported_work(tree: Path, patches_dir: Path, published_head: str | None) -> list[str]:
    """What replacing the patched repository ``tree`` would throw away (empty: nothing).

    Uncommitted changes, an operation stopped half-way, and commits made after apply-patches
    published the tree (``published_head``) that patches/ does not hold yet. Commits are compared
    by what they export to, so a tree whose work was exported, or that is exactly what
    apply-patches left, is never reported; a tree of an older version (no recorded head) counts
    as exported when it exports to what patches/ holds.
    """
    try:
        repo = git.Repo(tree)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return []
    lost: list[str] = []
    operation = operation_in_progress(repo)
    if operation:
        lost.append(f"{operation} is in progress")
    # One ``git status`` for staged, unstaged and untracked paths alike (NUL-separated: any file name).
    status = repo.git.status(
        "--porcelain", "-z", "--untracked-files=all", "--no-renames", strip_newline_in_stdout=False
    )
    names = sorted({entry[3:] for entry in status.split("\0") if len(entry) > 3})
    if names:
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        lost.append(f"uncommitted changes: {', '.join(names[:5])}{more}")
    if lost or repo.git.rev_parse("HEAD") == published_head:
        return lost
    try:
        wanted = rendered(export_commits(tree))
    except ExportError as exc:
        return [f"commits that cannot be exported as they are ({exc})"]
    if differences(patches_dir, wanted):
        base = _upstream_base(repo)
        commits = repo.git.log("--format=%h %s", f"{base}..HEAD").splitlines()
        lost.append(f"commits not exported to patches/ ({len(commits)} after upstream; newest: {commits[0]})")
    return lost
