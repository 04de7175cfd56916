"""The strict apply engine: the series onto an upstream checkout, one commit per patch.

Every patch gets exactly one status (``classify``), decided by git before the patch is committed;
only the statuses ``Options`` accepts are committed. The engine works in the staging area a run
gives it (``run``: the lock, what is reused, the publishing of the tree in one step).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import faults
from vllm_overlay import git as gitcmd
from vllm_overlay.apply import paths, staging
from vllm_overlay.apply.classify import (
    CHECKING_RE,
    FUZZ_CONTEXT,
    PatchResult,
    Status,
    applied_cleanly,
    apply_check,
    classify,
)
from vllm_overlay.errors import InputError
from vllm_overlay.series import Patch, as_git_am_reads, parse_all_trailers
from vllm_overlay.upstream.trees import Upstream

if TYPE_CHECKING:  # GitPython is imported where a tree is built: an unchanged re-apply never needs it
    import git

    from vllm_overlay.store import Store


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
class Report:
    upstream: Upstream
    output: str
    results: list[PatchResult]
    published: bool
    # True: the output already held exactly this build (same inputs, untouched since it was
    # published), so nothing was rebuilt; ``results`` are the ones recorded when it was built.
    unchanged: bool = False

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
            "unchanged": self.unchanged,
            "ok": self.ok,
            "patches": [r.to_json() for r in self.results],
        }


class ApplyError(InputError, RuntimeError):
    """The run was refused before any status could be decided (unsafe paths, output busy)."""


class WorkWouldBeLost(ApplyError):
    """Replacing the output would throw away work it holds (``before_replace`` refused; exit 2, untouched)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; ``published`` says whether the output was already replaced."""

    def __init__(self, output: Path, published: bool) -> None:
        super().__init__(str(output))
        self.output = output
        self.published = published


def write_mails(patches: list[Patch], directory: Path) -> list[Path]:
    """Each patch's mail as git reads it, one file each: classification and commit read the same bytes.

    The copies also keep the run independent of the patch files being edited while it runs.
    """
    mails = []
    for index, patch in enumerate(patches, start=1):
        mail = directory / f"{index:04d}.patch"
        mail.write_bytes(as_git_am_reads(patch.raw))
        mails.append(mail)
    return mails


def commit_patch(repo: git.Repo, patch: Patch, mail: Path, status: Status) -> str:
    """Apply an accepted patch (read from ``mail``) with ``git am`` and record which file it came from.

    The ``Patch-File`` trailer goes into a copy of the mail before ``git am`` when the message
    already ends in a trailer block (every linted patch: its DEP-3 fields): git's own
    ``interpret-trailers`` adds it there exactly as ``git commit --amend --trailer`` would (same
    commit ids), and the amend, which reads and rewrites the whole index again, is saved.
    """
    from vllm_overlay.apply import patched_repo

    tree = Path(repo.working_tree_dir or ".")
    flags = ["--quiet", "--keep-cr"]
    if status is Status.FUZZ:
        flags.append(f"-C{FUZZ_CONTEXT}")
    if status is Status.MERGED_3WAY:
        flags.append("--3way")
    with repo.git.custom_environment(**_committer_env(patch)):
        if patch.trailers:
            repo.git.am(*flags, str(_mail_with_trailer(tree, patch, mail)))
        else:
            repo.git.am(*flags, str(mail))
            repo.git.commit("--amend", "--quiet", "--no-edit", "--no-verify", _trailer_option(patch))
    return patched_repo.head_commit(repo)


def _trailer_option(patch: Patch) -> str:
    from vllm_overlay.apply import patched_repo

    return f"--trailer={patched_repo.patch_file_trailer(patch.name)}"


def _mail_with_trailer(tree: Path, patch: Patch, mail: Path) -> Path:
    """A copy of ``mail`` whose trailer block ends in the ``Patch-File`` trailer (git's interpret-trailers)."""
    with_trailer = mail.with_name(mail.name + ".commit")
    shutil.copyfile(mail, with_trailer)
    gitcmd.git(tree, "interpret-trailers", "--in-place", _trailer_option(patch), str(with_trailer))
    return with_trailer


# A value no patch file holds: the one ``--trailer`` of a batch, replaced by each patch's name (below).
_NAME_PLACEHOLDER = "vllm-overlay-patch-file-name-placeholder-0f4c2a9e"


def _mails_with_trailer(tree: Path, patches: list[Patch], mails: list[Path]) -> list[Path]:
    """``_mail_with_trailer`` of each of ``patches`` (every one with a trailer block), one git process for all.

    One ``interpret-trailers --in-place`` takes one ``--trailer`` for every file, so it adds
    ``Patch-File: <placeholder>``: git decides where the trailer goes, as for one mail, and the
    line it wrote then gets the patch's name for the placeholder. A patch whose last trailer is a
    ``Patch-File`` already, or whose copy does not hold the line exactly once, is given its trailer
    alone: git's ``addIfDifferentNeighbor`` compares the value there, which the placeholder is not.
    """
    from vllm_overlay.apply import patched_repo

    copies: dict[int, Path] = {}
    for number, (patch, mail) in enumerate(zip(patches, mails, strict=True)):
        last_key = patch.trailers[-1][0].lower() if patch.trailers else ""
        if last_key != patched_repo.PATCH_FILE_TRAILER.lower():
            copies[number] = mail.with_name(mail.name + ".commit")
            shutil.copyfile(mail, copies[number])
    if copies:
        placeholder = f"--trailer={patched_repo.patch_file_trailer(_NAME_PLACEHOLDER)}"
        gitcmd.git(tree, "interpret-trailers", "--in-place", placeholder, *map(str, copies.values()))
    written = patched_repo.patch_file_trailer(_NAME_PLACEHOLDER).encode() + b"\n"
    result: list[Path] = []
    for number, (patch, mail) in enumerate(zip(patches, mails, strict=True)):
        copy = copies.get(number)
        text = copy.read_bytes() if copy else b""
        if text.count(written) != 1:  # no copy, or the mail held that line itself
            result.append(_mail_with_trailer(tree, patch, mail))
            continue
        copy.write_bytes(text.replace(written, patched_repo.patch_file_trailer(patch.name).encode() + b"\n"))
        result.append(copy)
    return result


def _committer_env(patch: Patch) -> dict[str, str]:
    """Committer = author, at the author's date: the same series gives the same commit ids."""
    parsed = patch.parsed()
    return {
        "GIT_COMMITTER_NAME": parsed.author_name or "vllm-overlay",
        "GIT_COMMITTER_EMAIL": parsed.author_email or "vllm-overlay@invalid",
        "GIT_COMMITTER_DATE": parsed.date or "2000-01-01T00:00:00+0000",
    }


def seed_preimages(repo: git.Repo, base_commit: str, patches: list[Patch]) -> int:
    """Write into the object store every blob the series creates on ``base_commit``.

    A 3-way merge needs the exact blob a patch was made against (its ``index`` line). For the
    first patch touching a file that is the upstream blob, but for later ones it is the file as
    an earlier patch left it, which no upstream contains. Replaying the series with
    ``git apply --cached`` on a private index recreates those blobs without touching any tree.
    Returns how many patches replayed.
    """
    import tempfile

    replayed = 0
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-seed-") as tmp:
        mails = write_mails(patches, Path(tmp))
        with repo.git.custom_environment(GIT_INDEX_FILE=str(Path(tmp) / "index")):
            repo.git.read_tree(base_commit)
            for mail in mails:
                status, _out, _err = repo.git.apply(
                    "--cached", str(mail), with_extended_output=True, with_exceptions=False
                )
                replayed += status == 0
    return replayed


def apply_after_shared(
    area: staging.StagingArea,
    shared: list[PatchResult],
    patches: list[Patch],
    upstream: Upstream,
    options: Options,
    progress: Callable[[int, int, str], None] | None,
    seed_base: Callable[[], str | None] | None,
) -> list[PatchResult]:
    """Classify and commit the patches after ``shared`` on the staging tree, checked out at its last
    commit (and perhaps narrowed to the files they touch: the others are written meanwhile)."""
    from vllm_overlay.apply import narrow

    mails = write_mails(patches, area.mails)
    faults.phase("checked-out")
    with narrow.widened(area.tree, area.owner_fd):
        new = _apply_each(
            None, area, patches, mails, upstream, options, progress, seed_base, len(shared), shared[-1].commit
        )
    return [*shared, *new]


def apply_from_upstream(
    area: staging.StagingArea,
    patches: list[Patch],
    upstream: Upstream,
    store: Store,
    options: Options,
    progress: Callable[[int, int, str], None] | None,
    seed_base: Callable[[], str | None] | None,
    partial: bool = False,
    verify_upstream: Callable[[], Upstream] | None = None,
) -> list[PatchResult]:
    """Check out ``upstream`` in the staging area and classify (and commit, where accepted) each patch.

    The checkout is narrowed to what the series touches (``narrow``); the other files are written
    while the series is applied, whatever is accepted: every file is written once.
    """
    from vllm_overlay.apply import narrow, patched_repo
    from vllm_overlay.upstream import trees

    mails = write_mails(patches, area.mails)
    source = verify_upstream() if verify_upstream is not None else upstream
    trees.checkout(store, source, area.tree, narrow.touched_paths(patches))
    patched_repo.record_upstream(area.tree, upstream.commit, partial=partial)
    faults.phase("checked-out")
    with narrow.widened(area.tree, area.owner_fd):
        return _apply_each(None, area, patches, mails, upstream, options, progress, seed_base, 0, upstream.commit)


def _apply_each(
    repo: git.Repo | None,
    area: staging.StagingArea,
    patches: list[Patch],
    mails: list[Path],
    upstream: Upstream,
    options: Options,
    progress: Callable[[int, int, str], None] | None,
    seed_base: Callable[[], str | None] | None,
    start: int,
    head: str,
) -> list[PatchResult]:
    """Classify (and commit, where accepted) ``patches[start:]`` in order on ``head``, the staging tree's HEAD.

    Patches that apply one after another at their recorded lines (or at offsets, where accepted)
    are decided on a private index and committed by one ``git am`` (``_clean_run``); the first
    that does not is classified and committed alone on the tree, exactly as before the run, through
    ``repo`` (opened here where the caller had no need of one).
    """
    seeded = False
    tree_root = area.tree
    parse_all_trailers(patches[start:], area.mails)  # one git process for the series, not one a patch
    results: list[PatchResult] = []
    index = start
    while index < len(patches):
        run = _clean_run(area, patches, mails, options, progress, index)
        if run:
            commits = commit_run(tree_root, patches[index : index + len(run)], mails[index : index + len(run)], head)
            for result, commit in zip(run, commits, strict=True):
                result.commit = commit
            faults.phase("committed")
            results += run
            index += len(run)
            head = commits[-1]
            if index == len(patches):
                break
        # patches[index] ended the run: it is classified (and committed) alone.
        if repo is None:
            import git

            repo = git.Repo(tree_root)
        patch, mail = patches[index], mails[index]
        index += 1
        if progress:
            progress(index, len(patches), patch.name)
        _refuse_unsafe_paths(patch, tree_root)
        check = apply_check(repo, mail)  # classify reads it too: seeding writes objects, not the tree
        if not seeded and seed_base is not None and check[0] != 0:
            seeded = True
            base_commit = seed_base()
            if base_commit and base_commit != upstream.commit:
                # The base may have been imported into the store after this clone was made.
                repo.git.fetch("--quiet", "origin", "+refs/tags/*:refs/tags/*")
                seed_preimages(repo, base_commit, patches)
        result = classify(repo, patch, mail, check)
        result.accepted = options.accepts(result.status)
        if result.accepted:
            result.commit = head = commit_patch(repo, patch, mail, result.status)
            faults.phase("committed")
        results.append(result)
    return results


def _refuse_unsafe_paths(patch: Patch, tree_root: Path) -> None:
    problems = paths.problems(patch, tree_root)
    if problems:
        raise ApplyError(f"{patch.name}: refused: " + "; ".join(problems))


def _clean_run(
    area: staging.StagingArea,
    patches: list[Patch],
    mails: list[Path],
    options: Options,
    progress: Callable[[int, int, str], None] | None,
    start: int,
) -> list[PatchResult]:
    """The results of the patches from ``start`` on that apply, each on the ones before, as accepted
    clean or offset patches; empty when ``patches[start]`` does not.

    They are applied with ``git apply --cached --verbose`` to a private index read from HEAD: the
    same check, on the same blobs, as ``git apply --check`` on the clean tree after the patches
    before it were committed, and its verbose output gives the same hunk notes. All the candidates
    (up to the first patch with no trailer block, which is committed alone, with an amend) are
    applied by one ``git apply``, which reads mail after mail onto the index the ones before left;
    where that fails (a patch in the stretch does not apply) they are applied one at a time to find
    the first that does not. A stretch of one patch is checked on the tree itself
    (``_check_on_tree``). The run ends before the first patch that fails there or is not
    accepted; the tree and HEAD are not touched.
    """
    tree_root = area.tree
    candidates: list[int] = []
    for index in range(start, len(patches)):
        if not patches[index].trailers:
            break
        _refuse_unsafe_paths(patches[index], tree_root)  # a patch never adds a symlink: HEAD's tree decides
        candidates.append(index)
    if not candidates:
        return []
    candidate_mails = [mails[i] for i in candidates]
    if len(candidates) == 1:
        outputs = _check_on_tree(tree_root, candidate_mails[0])
    else:
        run_index = area.root / "run-index"
        _copy_index(tree_root, run_index)
        outputs = _apply_cached_together(tree_root, run_index, candidate_mails)
        if outputs is None:
            _copy_index(tree_root, run_index)
            outputs = _apply_cached_in_turn(tree_root, run_index, candidate_mails)
    run: list[PatchResult] = []
    for index, err in zip(candidates, outputs, strict=False):
        result = applied_cleanly(patches[index], err)
        result.accepted = options.accepts(result.status)
        if not result.accepted:
            break
        if progress:
            progress(index + 1, len(patches), patches[index].name)
        run.append(result)
    return run


def _copy_index(tree: Path, index_file: Path) -> None:
    """Copy ``tree``'s index to ``index_file``, a private index for ``git apply --cached``, dated a
    minute ahead.

    HEAD's tree as an index: the tree's own index is exactly that here (a checkout, a reset or an
    am just wrote it), and a copy of it saves a read-tree of every upstream file. Its date: git
    takes an entry whose file is as new as the index (to the second) for one that may have
    changed unseen, and re-reads and hashes that file whenever it writes the index. Right after
    a checkout that took about a second, that is most of the tree's 8,500 files: the check of this
    project's series costs 74 ms of CPU there, 35 ms with the later date
    (``benchmarks/git_step_costs.py --fresh``). The private index is read and written by ``git
    apply --cached`` alone, which never looks at the working tree, and then thrown away: the date
    decides no status, of this tree or any other.
    """
    from vllm_overlay.apply import patched_repo

    shutil.copyfile(tree / ".git" / "index", index_file)
    patched_repo.date_ahead(index_file)


APPLIED_RE = re.compile(r"^Applied patch .+ (?:cleanly|with conflicts)\.$")


def _apply_cached_together(tree: Path, index_file: Path, mails: list[Path]) -> list[str] | None:
    """Each mail's part of one ``git apply --cached --verbose`` of all of ``mails`` (None: it failed).

    git checks a mail's files, writes them to the index, then goes on to the next mail, so its
    verbose output is one section per mail: "Checking patch" lines (with their hunk notes), then
    "Applied patch" lines. A section count other than the mails' also gives None (read one at a time).
    """
    env = {"GIT_INDEX_FILE": str(index_file)}
    status, _out, err = gitcmd.run(tree, "apply", "--cached", "--verbose", *map(str, mails), env=env)
    if status != 0:
        return None
    sections: list[list[str]] = []
    after_applied = True
    for line in err.splitlines():
        if CHECKING_RE.match(line) and after_applied:
            sections.append([])
        if not sections:
            return None
        sections[-1].append(line)
        after_applied = bool(APPLIED_RE.match(line))
    return ["\n".join(section) + "\n" for section in sections] if len(sections) == len(mails) else None


def _check_on_tree(tree: Path, mail: Path) -> list[str]:
    """The verbose output of ``git apply --check`` of one mail on the tree (empty: it does not apply).

    The stretch's only patch needs no private index: the tree holds exactly HEAD here (a checkout,
    a reset with clean, or an am just wrote it), and the check reads only the files the mail
    touches, where a copied index is read and written whole (about 7 ms of 10 on 8,500 files).
    It is the check a patch classified alone gets (``classify.apply_check``), so the hunk notes
    are the same. The common re-apply, after the last patch was edited, takes this path.
    """
    status, _out, err = gitcmd.run(tree, "apply", "--check", "--verbose", str(mail))
    return [err] if status == 0 else []


def _apply_cached_in_turn(tree: Path, index_file: Path, mails: list[Path]) -> list[str]:
    """The verbose output of each mail that applies in turn, up to the first that does not."""
    outputs = []
    for mail in mails:
        env = {"GIT_INDEX_FILE": str(index_file)}
        status, _out, err = gitcmd.run(tree, "apply", "--cached", "--verbose", str(mail), env=env)
        if status != 0:
            break
        outputs.append(err)
    return outputs


def commit_run(tree: Path, patches: list[Patch], mails: list[Path], head: str) -> list[str]:
    """Commit ``patches`` (each with a trailer block, applying cleanly in turn) onto ``head``, ``tree``'s
    HEAD, with as few ``git am`` as their committers allow; their commit ids, in order, the same
    ``commit_patch`` gives.

    Committer = author at the author's date, as ``commit_patch`` sets it: one ``git am
    --committer-date-is-author-date`` per stretch of patches by one author.
    """
    envs = [_committer_env(patch) for patch in patches]
    committers = [(env["GIT_COMMITTER_NAME"], env["GIT_COMMITTER_EMAIL"]) for env in envs]
    commits: list[str] = []
    first = 0
    while first < len(patches):
        last = first + 1
        while last < len(patches) and committers[last] == committers[first]:
            last += 1
        name, email = committers[first]
        with_trailers = _mails_with_trailer(tree, patches[first:last], mails[first:last])
        am = ["am", "--quiet", "--keep-cr", "--committer-date-is-author-date", *map(str, with_trailers)]
        status, _out, err = gitcmd.run(tree, *am, env={"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email})
        if status != 0:
            raise gitcmd.GitError(tree, tuple(am), status, err.encode())
        made = gitcmd.git(tree, "rev-list", "--reverse", f"{head}..HEAD").split()
        if len(made) != last - first:
            raise ApplyError(f"git am made {len(made)} commits for {last - first} patches")
        commits += made
        head = made[-1]
        first = last
    return commits
