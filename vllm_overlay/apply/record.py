"""What an apply published, recorded in the tree itself, so an unchanged re-apply answers at once.

Every tree apply-patches publishes carries ``.git/vllm-overlay-applied.json``: the inputs it was
built from (the lock file's sha256, the upstream's import commit and sdist sha256, each patch's
name and the sha256 of the exact mail git read, the accepted statuses, the sources of the apply
engine itself) and what came out (each patch's status and commit, HEAD, HEAD's tree id, the
branch). It is written into the staging clone before the one-step publish, so it is published
with the tree or not at all.

A later run with the same inputs may skip the rebuild only when the output is still exactly what
was published: HEAD, its tree and the branch as recorded, the published marker's head unchanged,
and ``git status`` showing nothing (no staged, unstaged or untracked change; ignored files, such
as ``__pycache__/``, are not the tree's). Anything else, a hand edit included, rebuilds as before.
A record that differs in any input also tells how many leading patches are still the same
(``same_prefix``): the incremental re-apply reuses their commits.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import atomicfile
from vllm_overlay import git as gitcmd
from vllm_overlay.apply import staging
from vllm_overlay.apply.classify import HunkNote, PatchResult, Status
from vllm_overlay.series import Patch, as_git_am_reads
from vllm_overlay.upstream import lock as lockfile

if TYPE_CHECKING:
    from vllm_overlay.upstream.lock import Lock
    from vllm_overlay.upstream.trees import Upstream

RECORD_FILE = "vllm-overlay-applied.json"
FORMAT = 1
BRANCH = "patched"
# The modules whose code decides what a tree holds: a record made by other code is not reused.
_ENGINE_MODULES = (
    *("apply/engine.py", "apply/record.py", "apply/classify.py", "apply/patched_repo.py"),
    *("apply/paths.py", "series.py", "apply/staging.py", "upstream/trees.py"),
)


def engine_digest() -> str:
    """sha256 over the sources of the apply engine (a changed tool never trusts an old record)."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parents[1]
    for name in _ENGINE_MODULES:
        digest.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return digest.hexdigest()


def mail_digest(patch: Patch | bytes) -> str:
    """sha256 of the patch's mail exactly as git reads it (``series.as_git_am_reads``); a patch or its file's bytes."""
    return hashlib.sha256(as_git_am_reads(patch if isinstance(patch, bytes) else patch.raw)).hexdigest()


@dataclass(frozen=True)
class Inputs:
    """Everything besides the patches that decides the tree an apply builds."""

    lock_sha256: str
    upstream: dict[str, object]  # Upstream.to_json(): kind, label, import commit, sdist sha256, ...
    options: tuple[bool, bool, bool]  # allow_offset, allow_fuzz, three_way
    partial: bool

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "engine": engine_digest(),
            "lock_sha256": self.lock_sha256,
            "upstream": self.upstream,
            "options": list(self.options),
            "partial": self.partial,
        }


def inputs_for(the_lock: Lock, upstream: Upstream, options: tuple[bool, bool, bool], partial: bool) -> Inputs:
    """The inputs of a run: the lock as the tool read it (its canonical text), the verified upstream."""
    return Inputs(lock_digest(the_lock), upstream.to_json(), options, partial)


def lock_digest(the_lock: Lock) -> str:
    """sha256 of the lock's canonical text (comments and spacing of the file do not count)."""
    return hashlib.sha256(lockfile.render(the_lock).encode()).hexdigest()


def write(tree: Path, inputs: Inputs, patches: list[Patch], results: list[PatchResult]) -> str:
    """Record, in ``tree``'s git directory, what it was built from and holds (call before publishing);
    the HEAD commit recorded."""
    head, tree_id = gitcmd.git(tree, "rev-parse", "HEAD", "HEAD^{tree}").split()
    data = {
        **inputs.to_json(),
        "patches": [{"name": p.name, "mail_sha256": mail_digest(p)} for p in patches],
        "results": [r.to_json() for r in results],
        "head": head,
        "tree": tree_id,
        "branch": BRANCH,
    }
    atomicfile.write_bytes(tree / ".git" / RECORD_FILE, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    return head


def load(tree: Path) -> dict | None:
    """The record of ``tree`` (None: none, or one this version cannot read)."""
    try:
        data = json.loads((tree / ".git" / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def same_inputs(record: dict, inputs: Inputs) -> bool:
    return {k: record.get(k) for k in ("format", "engine", "lock_sha256", "upstream", "options", "partial")} == (
        inputs.to_json()
    )


def same_prefix(record: dict, patches: list[Patch] | list[tuple[str, bytes]]) -> int:
    """How many leading patches are byte for byte (name and mail) the ones the record's tree holds.

    ``patches``: parsed patches, or (name, file bytes) as ``series.read_series_bytes`` reads them.
    """
    count = 0
    for recorded, patch in zip(record.get("patches", []), patches, strict=False):
        name, raw = (patch.name, patch.raw) if isinstance(patch, Patch) else patch
        if recorded != {"name": name, "mail_sha256": mail_digest(raw)}:
            break
        count += 1
    return count


def results_of(record: dict) -> list[PatchResult]:
    """The recorded results, as the apply that published the tree reported them."""
    results = []
    for item in record["results"]:
        results.append(
            PatchResult(
                name=item["name"],
                series=item["series"],
                subject=item["subject"],
                status=Status(item["status"]),
                accepted=bool(item["accepted"]),
                hunks=[HunkNote(**note) for note in item.get("hunks", [])],
                detail=item.get("detail", ""),
                commit=item.get("commit"),
                warnings=list(item.get("warnings", [])),
            )
        )
    return results


def unchanged_results(
    tree: Path,
    lock_sha256: str,
    upstream: dict[str, object],
    options: tuple[bool, bool, bool],
    mails: list[tuple[str, bytes]],
) -> tuple[dict[str, object], list[PatchResult]] | None:
    """What ``tree`` recorded (its upstream, its results) when it already holds this whole build, else None.

    The build of the whole series (no ``--only``) from the lock with digest ``lock_sha256``, the
    upstream ``upstream_trees.imported_locked`` describes, ``options`` and the patch files ``mails``
    (name, bytes), by this engine; and ``tree`` untouched since it was published. Nothing is parsed
    and no upstream object read: every input is compared byte for byte with the record.
    """
    record = load(tree)
    if record is None or not isinstance(record.get("upstream"), dict):
        return None
    recorded_upstream = dict(record["upstream"])
    recorded_upstream.pop("release_commit", None)
    inputs = Inputs(lock_sha256, record["upstream"], options, False)
    if recorded_upstream != upstream or not same_inputs(record, inputs):
        return None
    if not (same_prefix(record, mails) == len(mails) == len(record.get("patches", []))):
        return None
    results = results_of(record)
    if not all(r.accepted and r.commit for r in results) or not untouched(tree, record, staging.published_head(tree)):
        return None
    return record["upstream"], results


def upstream_if_imported(
    record: dict | None, lock_sha256: str, imported: dict[str, object]
) -> dict[str, object] | None:
    """The upstream ``record`` (a tree's, ``load``) names (``Upstream.to_json()``), when the tree was
    built from the lock with digest ``lock_sha256`` and the import ``upstream_trees.imported_locked``
    describes; else None.

    A hint read without the output's lock, for a re-apply that may need no upstream file: the run
    decides again under the lock (``same_inputs``) whether the tree can be used.
    """
    if record is None or record.get("lock_sha256") != lock_sha256 or not isinstance(record.get("upstream"), dict):
        return None
    recorded = dict(record["upstream"])
    recorded.pop("release_commit", None)
    return dict(record["upstream"]) if recorded == imported else None


def untouched(tree: Path, record: dict, published_head: str | None) -> bool:
    """True when ``tree`` is exactly what was published with ``record``: nothing committed, staged,
    edited or added since.

    One ``git status``, whose ``--branch`` header names HEAD's branch and commit. HEAD's tree needs
    no look-up of its own: a commit id covers its tree id, so the recorded HEAD has the recorded tree.
    """
    if not on_branch(tree, record):
        return False
    if published_head != record.get("head"):
        return False
    try:
        status = gitcmd.git(tree, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "--no-renames")
    except gitcmd.GitError:
        return False
    lines = status.splitlines()
    headers = [line for line in lines if line.startswith("# ")]
    expected = {f"# branch.oid {record.get('head')}", f"# branch.head {record.get('branch')}"}
    return expected <= set(headers) and len(headers) == len(lines)


def on_branch(tree: Path, record: dict) -> bool:
    """True when ``tree``'s HEAD is the branch ``record`` names (read from ``.git/HEAD``, no git process)."""
    try:
        head = (tree / ".git" / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return head == f"ref: refs/heads/{record.get('branch')}"
