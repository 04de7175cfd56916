"""The patched repository's contract, in one place: what build/patched holds and how it is read.

apply-patches writes it (and every staging clone it builds the tree in), bump and the CPU carry
make repositories of the same shape, and export, the image, test-patches, lint, recarry and
with-patched-vllm read it. The contract:

* the upstream commit the series goes onto, recorded in the repository's git config under
  ``vllm-overlay.upstream`` (``CONFIG_UPSTREAM``); the clone also carries the store's tag
  ``upstream/<label>`` on it (``upstream_tag``), among the store's other upstream tags;
* ``vllm-overlay.partial = true`` (``CONFIG_PARTIAL``) when it holds a selection of the series;
* one commit per patch on top of it, in series order, each naming the patch file it came from in
  a ``Patch-File: SERIES/FILE.patch`` trailer (``PATCH_FILE_TRAILER``; export removes it again).

Everything git answers is read with git's own parsers (``%(trailers:...)``, ``interpret-trailers
--parse``, ``diff-tree -z``); the few plain git calls go through the door, ``vllm_overlay.git``.
"""

from __future__ import annotations

import codecs
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import git as gitcmd
from vllm_overlay.errors import InputError

if TYPE_CHECKING:  # GitPython and unidiff are imported where used: a re-apply on the spare needs neither
    import git as gitpython
    import unidiff

    from vllm_overlay.series import Patch

CONFIG_UPSTREAM = "vllm-overlay.upstream"
CONFIG_PARTIAL = "vllm-overlay.partial"
TAG_PREFIX = "upstream/"
# Upstream tags of hand-made clones (no config): the base with-patched-vllm falls back to.
HAND_TAG_PREFIX = "upstream-"
# Added on apply (and bump) so export knows which file a commit came from; never written to a patch file.
PATCH_FILE_TRAILER = "Patch-File"
ZERO_BLOB = "0" * 40


class NoUpstream(InputError, RuntimeError):
    """The repository records no upstream base: not made by apply-patches, and no upstream tag below HEAD."""


def date_ahead(index_file: Path) -> None:
    """Date a private index a minute ahead of now.

    git takes an entry whose file is as new as the index (to its timestamp) for one that may have
    changed unseen ("racily clean"), and hashes that file again whenever it reads or writes the
    index: right after a checkout, most of the tree. Only for an index whose files nothing but git
    wrote since it recorded them (a copy made just now, a checkout's own), read by this run alone.
    """
    later = time.time() + 60
    os.utime(index_file, (later, later))


def _dir(repo: gitpython.Repo | Path | str) -> Path:
    if isinstance(repo, (Path, str)):
        return Path(repo)
    return Path(repo.working_tree_dir or repo.git_dir)


# --- the upstream base ----------------------------------------------------------------------------


def head_commit(repo: gitpython.Repo) -> str:
    """HEAD's commit id, read from the refs by GitPython: no git process (a full apply asks once per patch)."""
    import git as gitpython

    return gitpython.SymbolicReference.dereference_recursive(repo, "HEAD")


def upstream_tag(label: str) -> str:
    """The store's tag of an upstream (``upstream/0.33.0``); apply's clone carries it on its base."""
    return TAG_PREFIX + label


def record_upstream(repo: gitpython.Repo | Path, commit: str, *, partial: bool = False) -> None:
    """Record ``commit`` as the repository's upstream base (and mark a selection of the series)."""
    gitcmd.git(_dir(repo), "config", CONFIG_UPSTREAM, commit)
    if partial:
        gitcmd.git(_dir(repo), "config", CONFIG_PARTIAL, "true")


def recorded_upstream(repo: gitpython.Repo | Path | str) -> str | None:
    """The upstream commit in the repository's config, as apply and bump wrote it (None: none)."""
    try:
        return gitcmd.git(_dir(repo), "config", "--get", CONFIG_UPSTREAM).strip() or None
    except gitcmd.GitError:
        return None


def upstream_base(repo: gitpython.Repo | Path | str) -> str:
    """The upstream commit the repository's patch commits go onto: the one answer for every reader.

    The config key is the answer wherever it is set: apply and bump write it when they check the
    upstream out, and it names exactly that commit. Tags are only the fallback, for a hand-made
    clone without the key (the newest ``upstream/*`` or ``upstream-*`` tag that HEAD descends
    from, by commit date): apply's clone carries every upstream tag of the store, and a tag is a
    name, not a record of what the tree was built on. So when the key is set, a tag that
    disagrees (none on the commit, or an ``upstream/*`` tag below HEAD on another commit) changes
    nothing; export's and the image's check that the base is the locked release
    (``export.is_on_release``) then looks at the tags on the recorded commit. NoUpstream when
    there is neither.
    """
    recorded = recorded_upstream(repo)
    if recorded is not None:
        return recorded
    import git as gitpython

    r = repo if isinstance(repo, gitpython.Repo) else gitpython.Repo(repo)
    try:
        head = r.head.commit
    except ValueError:  # no commit at all
        head = None
    tags = []
    if head is not None:
        tags = [t for t in r.tags if t.name.startswith((TAG_PREFIX, HAND_TAG_PREFIX)) and r.is_ancestor(t.commit, head)]
    if not tags:
        raise NoUpstream(
            f"{_dir(repo)}: not made by apply-patches (no {CONFIG_UPSTREAM} in its git config, "
            f"no {TAG_PREFIX}* or {HAND_TAG_PREFIX}* tag below HEAD)"
        )
    return max(tags, key=lambda t: t.commit.committed_date).commit.hexsha


def base_name(repo: gitpython.Repo | Path | str, commit: str) -> str:
    """A name for ``commit`` to show: its ``upstream/*`` (else ``upstream-*``) tag, else the commit id."""
    names = gitcmd.git(_dir(repo), "tag", "--points-at", commit).split()
    for prefix in (TAG_PREFIX, HAND_TAG_PREFIX):
        tagged = sorted(n for n in names if n.startswith(prefix))
        if tagged:
            return tagged[-1]
    return commit


def is_partial(repo: gitpython.Repo | Path | str) -> bool:
    """True for a tree apply-patches --only made: it holds a selection of the series, not all of it."""
    try:
        return gitcmd.git(_dir(repo), "config", "--get", "--type=bool", CONFIG_PARTIAL).strip() == "true"
    except gitcmd.GitError:
        return False


# --- commits and their patch files ----------------------------------------------------------------


def patch_file_trailer(patch_name: str) -> str:
    """The trailer line apply and bump put into a patch's commit message."""
    return f"{PATCH_FILE_TRAILER}: {patch_name}"


def trailer_value(repo: gitpython.Repo | Path | str, commit: str, key: str) -> str | None:
    """The last ``key:`` trailer of ``commit``'s message, as git parses trailers (None: none)."""
    out = gitcmd.git(_dir(repo), "log", "-1", f"--format=%(trailers:key={key},valueonly,unfold)", commit)
    values = [line.strip() for line in out.splitlines() if line.strip()]
    return values[-1] if values else None


def message_patch_file(repo: gitpython.Repo | Path | str, message: str) -> str | None:
    """The ``Patch-File`` trailer of a commit message that is no commit yet (git am's final-commit)."""
    out = gitcmd.git(_dir(repo), "interpret-trailers", "--parse", "--unfold", stdin=message.encode("utf-8"))
    values = []
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == PATCH_FILE_TRAILER.lower():
            values.append(value.strip())
    return values[-1] if values else None


@dataclass(frozen=True)
class PatchCommit:
    commit: str
    patch_file: str | None  # its Patch-File trailer (None: the commit has none)


def patch_commits(
    repo: gitpython.Repo | Path | str, base: str | None = None, *, first_parent: bool = False
) -> list[PatchCommit]:
    """The commits after the upstream base (``base``, default :func:`upstream_base`) to HEAD, oldest
    first, each with the patch file its trailer names. ``first_parent``: the first-parent line only
    (what the image ships); otherwise every commit, in topological order (what export refuses or writes).
    """
    where = _dir(repo)
    base = base if base is not None else upstream_base(repo)
    order = "--first-parent" if first_parent else "--topo-order"
    out = gitcmd.git(
        where,
        "log",
        "-z",
        "--reverse",
        order,
        f"--format=%H %(trailers:key={PATCH_FILE_TRAILER},valueonly,unfold,separator=%x0a)",
        f"{base}..HEAD",
    )
    found = []
    for record in out.split("\0"):
        if not record.strip():
            continue
        commit, _, names = record.strip("\n").partition(" ")
        values = [v.strip() for v in names.splitlines() if v.strip()]
        found.append(PatchCommit(commit, values[-1] if values else None))
    return found


def tree_id(repo: gitpython.Repo | Path | str, commit: str) -> str:
    """git's content address of ``commit``'s tree (what test-patches keys verdicts on)."""
    return gitcmd.git(_dir(repo), "rev-parse", f"{commit}^{{tree}}").strip()


# --- what a commit changes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    path: str
    status: str  # A, M, D (no rename detection)
    new_blob: str
    new_mode: str


def commit_changes(repo: gitpython.Repo | Path | str, commit: str) -> list[Change]:
    """What ``commit`` changes against its parent, path by path (``git diff-tree -z``, no renames)."""
    raw = gitcmd.git(
        _dir(repo), "diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", "--root", f"{commit}^", commit
    )
    fields = raw.split("\0")
    changes = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if not meta.startswith(":"):
            continue
        _old_mode, new_mode, _old_blob, new_blob, status = meta[1:].split(" ")
        changes.append(Change(path, status[0], new_blob, new_mode))
    return changes


def changed_between(
    repo: gitpython.Repo | Path | str, base: str, commit: str, *pathspec: str
) -> tuple[list[str], list[str]]:
    """(present, deleted) paths that differ between ``base`` and ``commit`` (under ``pathspec``)."""
    if base == commit:
        return [], []
    text = gitcmd.git(_dir(repo), "diff", "--name-status", "--no-renames", "-z", base, commit, "--", *pathspec)
    fields = [f for f in text.split("\0") if f]
    present, deleted = [], []
    for status, path in zip(fields[0::2], fields[1::2], strict=True):
        (deleted if status.startswith("D") else present).append(path)
    return sorted(present), sorted(deleted)


# --- does a commit still hold its patch -------------------------------------------------------------


def changed_lines(diff: unidiff.PatchSet) -> dict[str, list[tuple[str, str]]]:
    """Per file, the added and removed lines in order: what a patch does, whatever its context."""
    return {
        f.path: [(line.line_type, line.value) for hunk in f for line in hunk if line.is_added or line.is_removed]
        for f in diff
    }


def git_path(name: str) -> str:
    """A path as git means it: ``"caf\\303\\251.py"`` (git's C-quoting of unusual names) unquoted."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return codecs.escape_decode(name[1:-1].encode("ascii", "backslashreplace"))[0].decode(
            "utf-8", "surrogateescape"
        )
    return name


def patch_post_images(patch: Patch) -> dict[str, str | None]:
    """``{path: blob id}`` the patch file says each touched file has after it (its index lines).

    Read with unidiff, paths unquoted as git quotes them (spaces, non-ASCII letters, newlines). A
    change without an index line (mode only) claims no blob: None.
    """
    import unidiff

    claimed: dict[str, str | None] = {}
    for patched in unidiff.PatchSet(patch.raw.decode("utf-8", errors="replace")):
        index = next((line for line in patched.patch_info if line.startswith("index ")), None)
        claimed[git_path(patched.path)] = index.split()[1].split("..")[1] if index else None
    return claimed


def differs_from_patch(repo: gitpython.Repo | Path | str, patch: Patch, commit: str) -> list[str]:
    """The paths where ``commit`` is not what the patch file says (empty: it holds the patch).

    First the blobs the patch's index lines claim against the commit's; where those agree, the
    added and removed lines of the commit's diff against the patch's.
    """
    claimed = patch_post_images(patch)
    actual = {c.path: (ZERO_BLOB if c.status == "D" else c.new_blob) for c in commit_changes(repo, commit)}
    stale = sorted(
        path
        for path in set(claimed) | set(actual)
        if path not in claimed
        or path not in actual
        or (claimed[path] is not None and not actual[path].startswith(claimed[path]))
    )
    if stale:
        return stale
    import unidiff

    committed = unidiff.PatchSet(gitcmd.git(_dir(repo), "show", "--format=", "--no-renames", "--full-index", commit))
    return sorted(
        path for path, lines in changed_lines(committed).items() if changed_lines(patch.diff).get(path) != lines
    )
