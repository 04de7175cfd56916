"""Carry patches/ onto the CPU runtime's release again: bump's 3-way apply, reviewed resolutions reused.

The carry (cpu/patches) is made with the bump machinery: the locked series goes onto the runtime's
release with ``git am --3way`` in a bump repository, from a scratch copy of the project so that
patches/ and upstream.lock stay the locked ones. Where a person resolved a patch once, that review
is data the next carry reuses, under one strict rule:

    a patch of patches/ whose file is byte for byte the one the carry was made from (its sha256 is
    in cpu/carried-from), met on the same tree as its carried commit's parent, gets that carried
    commit (its tree and message: the resolution and the note a person reviewed).

Both conditions together make the result the reviewed one, not a guess. Any other patch is bump's:
a clean 3-way goes in, a conflict stops for a person (``--continue`` afterwards). When every patch
is in, the carry is exported into cpu/patches (a reused patch keeps its file, note included),
cpu/upstream.lock is the lock bump wrote for the release and cpu/carried-from records the digests
of the patches/ it was carried from. Nothing under cpu/ is written before that.

Working directories (build/carry-cpu): ``project`` (the scratch copy), ``bump`` (the bump
repository; recorded resolutions in ``bump-rr-cache`` beside it), ``previous`` (the carry being
replaced, applied), ``source.json`` (the digests of patches/ when the carry started). A carry is in
progress while ``source.json`` is there beside a bump repository: it goes once cpu/ is written, so a
finished carry leaves nothing in progress (the bump repository stays to look at; the next carry
replaces it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import git
import unidiff

from vllm_overlay import atomicfile, bump, series
from vllm_overlay.apply import export, patched_repo
from vllm_overlay.cpu import carry
from vllm_overlay.errors import WorkFailure
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

WORK_DIR = "carry-cpu"
PREVIOUS_REF = "refs/vllm-overlay/previous-carry"


class RecarryError(WorkFailure, RuntimeError):
    """The carry cannot start, continue or finish (with the reason and what to do): exit 1."""


class NeedsPerson(RecarryError):
    """git am stopped at a patch the earlier carry cannot resolve: a person resolves it."""


@dataclass
class Paths:
    root: Path

    @property
    def work(self) -> Path:
        return self.root / "build" / WORK_DIR

    @property
    def scratch(self) -> Path:
        return self.work / "project"

    @property
    def repo(self) -> Path:
        return self.work / "bump"

    @property
    def previous(self) -> Path:
        return self.work / "previous"

    @property
    def source(self) -> Path:
        return self.work / "source.json"


@dataclass
class Outcome:
    reused: list[str] = field(default_factory=list)  # carried commits taken from the earlier carry
    written: list[str] = field(default_factory=list)  # cpu/ files that changed
    anew: list[str] = field(default_factory=list)  # patches carried anew: their message needs the 0.32.0 note


def file_digests(patches_dir: Path) -> dict[str, str]:
    """sha256 of each patch file the series lists, by its name in the series."""
    return {p.name: hashlib.sha256(p.path.read_bytes()).hexdigest() for p in series.load_series(patches_dir)}


def render_carried_from(patches_dir: Path, where: str) -> str:
    """cpu/carried-from: the series digest first (what serve-e2e compares), then one line per patch file."""
    lines = [f"{carry.series_digest(patches_dir)}  patches/ {where} (image.series_sha256)"]
    lines += [f"{digest}  {name}" for name, digest in file_digests(patches_dir).items()]
    return "\n".join(lines) + "\n"


def recorded_digests(root: Path) -> dict[str, str]:
    """The per-patch digests cpu/carried-from records (none for a carry that did not record them)."""
    path = root / carry.CARRY_DIR / carry.CARRIED_FROM
    if not path.is_file():
        return {}
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name.endswith(".patch"):
            found[name] = digest
    return found


def previous_commits(previous: git.Repo) -> dict[str, git.Commit]:
    """The earlier carry's commits by the patch file they were applied from (the oldest, if two)."""
    found: dict[str, git.Commit] = {}
    for each in patched_repo.patch_commits(previous):
        if each.patch_file:
            found.setdefault(each.patch_file, previous.commit(each.commit))
    return found


def source_files(repo: git.Repo) -> set[str]:
    """The files the mail git am stopped at touches (both sides of each diff), read with unidiff."""
    text = (Path(repo.git_dir) / "rebase-apply" / "patch").read_text(encoding="utf-8", errors="replace")
    files = set()
    for patched in unidiff.PatchSet(text):
        for side in (patched.source_file, patched.target_file):
            if side != "/dev/null":
                files.add(side.split("/", 1)[1])
    return files


def changed_files(commit: git.Commit) -> set[str]:
    return {change.path for change in patched_repo.commit_changes(commit.repo, commit.hexsha)}


def _blob(tree: git.Tree, path: str) -> str | None:
    try:
        return tree[path].hexsha
    except KeyError:
        return None


def why_not_reusable(
    repo: git.Repo, name: str, digest: str, recorded: dict[str, str], carried: dict[str, git.Commit]
) -> str | None:
    """Why patch ``name`` cannot take the earlier carry's commit at this point (None: it can).

    A 3-way apply decides each file from that file alone (its content and the patch's hunks for
    it): so the earlier result holds when the patch is the same and every file it or its carried
    commit touches is, before it, what it was before the carried commit.
    """
    old = carried.get(name)
    if old is None:
        return "the earlier carry has no commit of it (a new patch)"
    if recorded.get(name) != digest:
        if name in recorded:
            return "its file changed since the earlier carry was made"
        return "the earlier carry does not record which file it was made from"
    if len(old.parents) != 1:
        return "its carried commit is a merge"
    before, head = old.parents[0].tree, repo.head.commit.tree
    differ = sorted(f for f in source_files(repo) | changed_files(old) if _blob(before, f) != _blob(head, f))
    if differ:
        return f"files it touches differ from the earlier carry's before it (an earlier patch changed): {differ[:3]}"
    return None


def current_patch(repo: git.Repo) -> str | None:
    """The patch file of the mail git am stopped at (its Patch-File trailer, which bump adds)."""
    final = Path(repo.git_dir) / "rebase-apply" / "final-commit"
    if not final.is_file():
        return None
    return patched_repo.message_patch_file(repo, final.read_text(encoding="utf-8"))


def fetch_previous(repo: git.Repo, previous: Path) -> None:
    """Bring the earlier carry's objects into the bump repository (take_previous checks files out of them)."""
    repo.git.fetch("-q", str(previous), f"+HEAD:{PREVIOUS_REF}")


def take_previous(repo: git.Repo, old: git.Commit) -> None:
    """Resolve the stopped patch with the earlier carry's commit: its files and its message.

    Every file the patch touches gets its content in the carried commit (or goes, where the carried
    commit has none); the rest stays as HEAD has it.
    """
    files = sorted(source_files(repo) | changed_files(old))
    present = [f for f in files if _blob(old.tree, f) is not None]
    absent = [f for f in files if _blob(old.tree, f) is None]
    if present:
        repo.git.checkout(old.hexsha, "--", *present)
    if absent:
        repo.git.rm("-q", "-f", "--ignore-unmatch", "--", *absent)
    (Path(repo.git_dir) / "rebase-apply" / "final-commit").write_text(str(old.message), encoding="utf-8")


def _drive(paths: Paths, outcome: Outcome, resolved: bool = False) -> None:
    """Go on with git am, resolving every stop the earlier carry resolves; a person for any other.

    ``resolved``: a person has resolved the patch git am stopped at (``--continue``).
    """
    repo = git.Repo(paths.repo)
    source = json.loads(paths.source.read_text(encoding="utf-8"))
    carried: dict[str, git.Commit] = {}
    if paths.previous.is_dir():
        fetch_previous(repo, paths.previous)
        carried = previous_commits(git.Repo(paths.previous))
    while bump.am_in_progress(repo):
        name = current_patch(repo)
        reason = (
            "git am stopped at a mail without a Patch-File trailer"
            if name is None
            else why_not_reusable(repo, name, source["digests"].get(name, ""), source["recorded"], carried)
        )
        if reason is None and name is not None:
            take_previous(repo, carried[name])
            outcome.reused.append(name)
        elif not resolved:
            raise NeedsPerson(f"{name}: not reusable from the earlier carry: {reason}\n{bump.conflict_help(repo)}")
        resolved = False
        try:
            bump.resume(paths.repo)
        except bump.BumpError as exc:
            if "conflict markers" in str(exc) or "not marked resolved" in str(exc):
                raise NeedsPerson(str(exc)) from None
            continue  # the next stop: the loop looks at it


def start(root: Path, store: Store) -> Outcome:
    """Set up the scratch project and the earlier carry, start bump's git am, resolve what it can."""
    paths = Paths(root)
    proj = carry.CarryProject(root)
    if in_progress(paths):
        raise RecarryError(f"a carry is in progress in {paths.repo}: --continue it, or --abort")
    cpu_lock = lock.load(proj.lock_file)
    for stale in (paths.scratch, paths.previous):
        shutil.rmtree(stale, ignore_errors=True)
    paths.scratch.mkdir(parents=True)
    shutil.copytree(root / "patches", paths.scratch / "patches")
    shutil.copy2(root / lock.LOCK_NAME, paths.scratch / lock.LOCK_NAME)
    carry.build_tree(proj, cpu_lock, store, paths.previous)
    source = {
        "series_sha256": carry.series_digest(root / "patches"),
        "digests": file_digests(root / "patches"),
        "recorded": recorded_digests(root),
    }
    atomicfile.write_bytes(paths.source, json.dumps(source, indent=1, sort_keys=True).encode("utf-8"))
    the_lock = lock.load(paths.scratch / lock.LOCK_NAME)
    upstream = upstream_trees.obtain(cpu_lock.version, the_lock, store)
    bump.check_direction(the_lock.version, upstream.version or cpu_lock.version, allow_downgrade=True)
    locked = upstream_trees.obtain(None, the_lock, store)
    outcome = Outcome()
    try:
        bump.start(series.load_series(paths.scratch / "patches"), upstream, store, paths.repo, cpu_lock.version,
                   seed_base=locked.commit)  # fmt: skip
    except bump.BumpError:
        pass  # stopped at a conflict: _drive looks at it
    _drive(paths, outcome)
    return finish(root, store, outcome)


def in_progress(paths: Paths) -> bool:
    """A carry was started and has not finished (nor been aborted)."""
    return paths.source.is_file() and bump.made_by_bump(paths.repo)


def resume(root: Path, store: Store) -> Outcome:
    """After a person resolved the stopped patch (``git add``): go on, then finish."""
    paths = Paths(root)
    if not in_progress(paths):
        raise RecarryError(f"{paths.repo}: no carry in progress (start one with scripts/carry-cpu)")
    outcome = Outcome()
    _drive(paths, outcome, resolved=True)
    return finish(root, store, outcome)


def abort(root: Path) -> list[str]:
    """Give up: the bump repository goes; cpu/ was never written before the end."""
    paths = Paths(root)
    said = bump.abort(paths.repo)
    paths.source.unlink(missing_ok=True)
    return [*said, "cpu/ unchanged"]


def finish(root: Path, store: Store, outcome: Outcome) -> Outcome:
    """Every patch is in: export into cpu/patches, write cpu/upstream.lock and cpu/carried-from."""
    paths = Paths(root)
    proj = carry.CarryProject(root)
    source = json.loads(paths.source.read_text(encoding="utf-8"))
    if file_digests(root / "patches") != source["digests"]:
        raise RecarryError("patches/ changed while it was carried: --abort and start again")
    state = bump.BumpState.load(paths.repo)
    relocked = bump.new_lock(
        lock.load(paths.scratch / lock.LOCK_NAME), upstream_trees.Upstream(**state.upstream), store
    )  # type: ignore[arg-type]
    undefined = undefined_names(paths.repo, state.upstream["commit"])
    if undefined:
        raise RecarryError(
            "the carried tree uses names its release does not define (a 3-way took code that needs the "
            "locked release's):\n  " + "\n  ".join(undefined) + "\nfix them in the bump repository "
            f"({paths.repo}: amend the commit that brought each), then scripts/carry-cpu --continue"
        )
    wanted = export.rendered(export.export_commits(paths.repo))
    for name in wanted:
        if name == series.SERIES_FILE:
            continue
        kept = proj.patches / name
        unchanged = source["recorded"].get(name) == source["digests"].get(name)
        # The same diff, index lines included (the blobs before and after), from the same patch: the
        # reviewed file holds, its note on the runtime's release included.
        if unchanged and kept.is_file() and _diff_part(kept.read_bytes()) == _diff_part(wanted[name]):
            wanted[name] = kept.read_bytes()
            if name not in outcome.reused:
                outcome.reused.append(name)
        elif not kept.is_file() or kept.read_bytes() != wanted[name]:
            outcome.anew.append(name)
    outcome.written = [f"{carry.CARRY_DIR}/patches/{n}" for n in export.write(proj.patches, wanted)]
    old_lock = proj.lock_file.read_bytes()
    lock.write(relocked, proj.lock_file)
    if proj.lock_file.read_bytes() != old_lock:
        outcome.written.append(f"{carry.CARRY_DIR}/{lock.LOCK_NAME}")
    where = root / carry.CARRY_DIR / carry.CARRIED_FROM
    text = render_carried_from(root / "patches", "as of this carry")
    if not where.is_file() or where.read_text(encoding="utf-8") != text:
        atomicfile.write_bytes(where, text.encode("utf-8"))
        outcome.written.append(f"{carry.CARRY_DIR}/{carry.CARRIED_FROM}")
    paths.source.unlink()  # finished: nothing is in progress now (in_progress)
    return outcome


def undefined_names(repo_dir: Path, base: str) -> list[str]:
    """Undefined names (pyflakes' F821, via ruff) in the .py files the carried series changes.

    A 3-way merge can take a patch's line that calls a helper only the locked release has; the
    carried tree then fails only when that line runs. ruff's own defaults are ignored
    (``--isolated``): only F821 is asked for, which pristine vLLM files do not raise.
    """
    import sys

    changed = git.Repo(repo_dir).git.diff("--name-only", "--diff-filter=AM", base, "HEAD").split()
    files = [name for name in changed if name.endswith(".py")]
    if not files:
        return []
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", "--output-format", "concise",
         "--no-cache", *files],
        cwd=repo_dir, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return [line for line in done.stdout.splitlines() if ": F821 " in line]


def _diff_part(text: bytes) -> bytes:
    return text.partition(b"\n---\n")[2]
