"""Bump: carry the series to a new upstream release and re-lock.

The series is applied with ``git am --3way`` into a working repository (build/bump). git stops
at the first conflict; the person resolves it there and runs ``bump --continue``, which refuses
while any changed file still holds conflict markers. Resolutions are recorded with git rerere in
a cache kept beside the repository (build/bump-rr-cache), so a later bump over the same
conflicts replays them without stopping. When every patch is in, patches/ and upstream.lock are
first saved inside the bump repository, then the refreshed series is exported and the lock
rewritten from the release itself (sdist and wheel sha256s from the index, commit id from
vllm/_version.py, the torch and flashinfer pins from its metadata). ``bump --abort`` restores the
saved patches/ and upstream.lock at any point until they are committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import export, patched_repo
from vllm_overlay.audit import dependencies
from vllm_overlay.errors import InputError, WorkFailure
from vllm_overlay.series import Patch, as_git_am_reads
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock as lockfile
from vllm_overlay.upstream import trees as upstream_trees
from vllm_overlay.upstream.lock import Artifact, Lock

STATE_FILE = "vllm-overlay-bump.json"
BACKUP_DIR = "vllm-overlay-backup"  # inside the bump repository's .git: patches/ and upstream.lock
MARKER_RE = re.compile(r"^(<{7}|>{7})( |$)|^={7}$")
PINNED = ("torch", "flashinfer-python")
WHEEL_ARCHES = ("x86_64", "aarch64")


class BumpError(WorkFailure, RuntimeError):
    """The bump cannot start or continue (with the reason and what to do): exit 1."""


@dataclass
class BumpState:
    spec: str
    upstream: dict[str, object]
    installed: dict[str, str] = field(default_factory=dict)  # project file -> sha256 the bump wrote

    @classmethod
    def load(cls, repo_dir: Path) -> BumpState:
        path = repo_dir / ".git" / STATE_FILE
        if not path.exists():
            raise BumpError(f"{repo_dir}: no bump in progress (start one with: scripts/bump VERSION)")
        data = json.loads(path.read_text())
        return cls(data["spec"], data["upstream"], data.get("installed", {}))

    def save(self, repo_dir: Path) -> None:
        data = {"spec": self.spec, "upstream": self.upstream, "installed": self.installed}
        (repo_dir / ".git" / STATE_FILE).write_text(json.dumps(data, indent=1, sort_keys=True))


def rr_cache_dir(repo_dir: Path) -> Path:
    """Where recorded resolutions live: beside the bump repository, so they outlive it."""
    return repo_dir.parent / f"{repo_dir.name}-rr-cache"


def enable_rerere(repo: git.Repo, repo_dir: Path) -> None:
    cache = rr_cache_dir(repo_dir)
    cache.mkdir(parents=True, exist_ok=True)
    link = Path(repo.git_dir) / "rr-cache"
    if not link.exists():
        link.symlink_to(cache.resolve(), target_is_directory=True)
    repo.git.config("rerere.enabled", "true")
    repo.git.config("rerere.autoUpdate", "true")


def check_direction(old_version: str, new_version: str, allow_downgrade: bool) -> None:
    """A bump to an older release than the lock's is refused unless asked for."""
    try:
        older = Version(new_version) < Version(old_version)
    except InvalidVersion as exc:
        raise BumpError(f"cannot compare versions {old_version!r} and {new_version!r}: {exc}") from exc
    if older and not allow_downgrade:
        raise BumpError(f"{new_version} is older than the locked {old_version}: a downgrade needs --allow-downgrade")


def with_patch_file_trailer(patch: Patch) -> bytes:
    """The patch text with a Patch-File trailer, so export writes the refreshed patch to the same file.

    Read as git am reads it (a CRLF mail gets LF endings), so the trailer lands before its ``---``.
    """
    text = as_git_am_reads(patch.raw).decode("utf-8")
    head, sep, rest = text.partition("\n---\n")
    return (head.rstrip("\n") + "\n" + patched_repo.patch_file_trailer(patch.name) + sep + rest).encode("utf-8")


def conflict_markers(repo: git.Repo) -> list[str]:
    """``path:line`` of every conflict marker in a file that differs from HEAD or is unmerged."""
    names = set(repo.git.diff("--name-only", "HEAD").split()) | set(
        repo.git.diff("--name-only", "--diff-filter=U").split()
    )
    names |= set(repo.git.ls_files("--others", "--exclude-standard").split())
    root = Path(repo.working_tree_dir or ".")
    found = []
    for name in sorted(names):
        path = root / name
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MARKER_RE.match(line):
                found.append(f"{name}:{number}")
    return found


def am_in_progress(repo: git.Repo) -> bool:
    return (Path(repo.git_dir) / "rebase-apply").exists()


def conflict_help(repo: git.Repo) -> str:
    """What stopped, which files conflict, and exactly what to do next."""
    stopped = ""
    msg_file = Path(repo.git_dir) / "rebase-apply" / "final-commit"
    if msg_file.exists():
        stopped = msg_file.read_text().splitlines()[0]
    unmerged = repo.git.diff("--name-only", "--diff-filter=U").split()
    lines = [f"bump stopped at: {stopped or 'a patch that does not apply'}"]
    if unmerged:
        lines.append("conflicting files (edit the <<<<<<< ======= >>>>>>> regions):")
        lines += [f"  {repo.working_tree_dir}/{name}" for name in unmerged]
    else:
        lines.append("git could not merge it (see `git am --show-current-patch=diff` in the repository)")
    lines += [
        "then:",
        f"  cd {repo.working_tree_dir} && git add <files>      # mark them resolved",
        "  scripts/bump --continue                      # apply the rest, export, re-lock, test",
        "or give up with: scripts/bump --abort",
    ]
    return "\n".join(lines)


def start(
    patches: list[Patch], upstream: upstream_trees.Upstream, store: Store, repo_dir: Path, spec: str, seed_base: str
) -> git.Repo:
    """Check out the new upstream into ``repo_dir`` and ``git am --3way`` the series onto it.

    ``seed_base`` is the upstream commit the series was written for (the lock's): the blobs a
    3-way merge needs are recreated from it first.
    """
    if repo_dir.exists():
        try:
            existing = git.Repo(repo_dir)
        except git.InvalidGitRepositoryError:
            existing = None
        if existing is not None and am_in_progress(existing):
            raise BumpError(f"a bump is already in progress in {repo_dir}: resolve it and --continue, or --abort")
        if (repo_dir / ".git" / BACKUP_DIR).exists():
            raise BumpError(
                f"the bump in {repo_dir} changed patches/ and upstream.lock and holds the previous ones: "
                "commit the new ones and remove it, or restore the old ones with --abort, before another bump"
            )
        refuse_foreign(repo_dir)
        shutil.rmtree(repo_dir)
    upstream_trees.checkout(store, upstream, repo_dir)
    repo = git.Repo(repo_dir)
    BumpState(spec, upstream.to_json()).save(repo_dir)  # first: from now on --abort knows it is ours
    patched_repo.record_upstream(repo, upstream.commit)
    enable_rerere(repo, repo_dir)
    apply.seed_preimages(repo, seed_base, patches)
    queue = Path(repo.git_dir) / "vllm-overlay-patches"
    queue.mkdir()
    files = []
    for index, patch in enumerate(patches, start=1):
        path = queue / f"{index:04d}.patch"
        path.write_bytes(with_patch_file_trailer(patch))
        files.append(str(path))
    _am(repo, "--3way", "--quiet", *files)
    return repo


class ForeignRepository(InputError, BumpError):
    """--repo names a directory bump did not make: an input error (exit 2), nothing touched."""


def made_by_bump(repo_dir: Path) -> bool:
    """True for a repository this tool's bump created (it holds the bump's state file)."""
    return (repo_dir / ".git" / STATE_FILE).is_file()


def refuse_foreign(repo_dir: Path) -> None:
    """Raise BumpError unless ``repo_dir`` is empty or a bump's own repository: it will be removed."""
    if repo_dir.is_symlink() or not repo_dir.is_dir():
        raise ForeignRepository(
            f"{repo_dir} is not a repository bump made (not a directory): refusing to remove it (nothing was touched)"
        )
    if next(repo_dir.iterdir(), None) is not None and not made_by_bump(repo_dir):
        raise ForeignRepository(
            f"{repo_dir} holds files and is not a repository bump made (no .git/{STATE_FILE}): "
            "refusing to touch or remove it (nothing was touched); pass another --repo"
        )


def resume(repo_dir: Path) -> git.Repo:
    """Continue ``git am`` after the person resolved a conflict (no-op if it already finished)."""
    if not (repo_dir / ".git").exists():
        raise BumpError(f"{repo_dir}: no bump in progress (start one with: scripts/bump VERSION)")
    repo = git.Repo(repo_dir)
    BumpState.load(repo_dir)
    if am_in_progress(repo):
        markers = conflict_markers(repo)
        if markers:
            raise BumpError(
                "conflict markers are still in:\n"
                + "\n".join(f"  {repo_dir}/{where}" for where in markers)
                + "\nresolve them, `git add` the files, then run scripts/bump --continue again"
            )
        unmerged = repo.git.diff("--name-only", "--diff-filter=U").split()
        if unmerged:
            raise BumpError(
                "not marked resolved (git add them): " + ", ".join(unmerged) + "; then scripts/bump --continue"
            )
        _am(repo, "--continue")
    return repo


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def _project_files(patches_dir: Path, lock_file: Path) -> dict[str, Path]:
    root = lock_file.parent
    files = {p.relative_to(root).as_posix(): p for p in patches_dir.rglob("*") if p.is_file()}
    files[lock_file.name] = lock_file
    return files


def install(repo_dir: Path, patches_dir: Path, lock_file: Path, relocked: Lock) -> list[str]:
    """Save patches/ and upstream.lock in the bump repository, then write the refreshed ones.

    Returns the project files that changed (patches/NAME, upstream.lock).
    """
    state = BumpState.load(repo_dir)
    backup = repo_dir / ".git" / BACKUP_DIR
    if not backup.exists():
        staging = backup.with_name(BACKUP_DIR + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(patches_dir, staging / "patches")
        shutil.copy2(lock_file, staging / lock_file.name)
        staging.rename(backup)
    wanted = export.rendered(export.export_commits(repo_dir))
    changed = [f"{patches_dir.name}/{name}" for name in export.write(patches_dir, wanted)]
    old_lock = lock_file.read_bytes()
    lockfile.write(relocked, lock_file)
    if lock_file.read_bytes() != old_lock:
        changed.append(lock_file.name)
    state.installed = {name: _digest(path) for name, path in _project_files(patches_dir, lock_file).items()}
    state.save(repo_dir)
    return changed


def _committed(project_root: Path, state: BumpState) -> bool:
    """True when HEAD of the project's git repository holds exactly what the bump wrote."""
    try:
        repo = git.Repo(project_root, search_parent_directories=False)
        for name, digest in state.installed.items():
            blob = repo.git.show(f"HEAD:{name}", stdout_as_string=False, strip_newline_in_stdout=False)
            if hashlib.sha256(blob).hexdigest() != digest:
                return False
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandError, ValueError):
        return False
    return bool(state.installed)


def restore(repo_dir: Path, patches_dir: Path, lock_file: Path) -> list[str]:
    """Put back the patches/ and upstream.lock saved before the bump wrote them; returns what changed."""
    backup = repo_dir / ".git" / BACKUP_DIR
    if not backup.exists():
        return []
    saved_root = backup
    saved = {p.relative_to(saved_root).as_posix(): p for p in (saved_root / "patches").rglob("*") if p.is_file()}
    saved[lock_file.name] = saved_root / lock_file.name
    current = _project_files(patches_dir, lock_file)
    rel = {name.replace("patches/", f"{patches_dir.name}/", 1): path for name, path in saved.items()}
    changed = sorted(name for name in set(current) | set(rel) if _digest(current.get(name, Path("/nonexistent")))
                     != _digest(rel.get(name, Path("/nonexistent"))))  # fmt: skip
    shutil.rmtree(patches_dir)
    shutil.copytree(saved_root / "patches", patches_dir)
    shutil.copy2(saved_root / lock_file.name, lock_file)
    shutil.rmtree(backup)
    state = BumpState.load(repo_dir)
    state.installed = {}
    state.save(repo_dir)
    return changed


def abort(repo_dir: Path, patches_dir: Path | None = None, lock_file: Path | None = None) -> list[str]:
    """Give up the bump: restore patches/ and upstream.lock unless committed, remove the repository.

    Returns the lines to tell the person (what was restored or left alone).
    """
    if not repo_dir.exists():
        raise BumpError(f"{repo_dir}: no bump in progress")
    if not made_by_bump(repo_dir):
        raise ForeignRepository(
            f"{repo_dir} is not a repository bump made (no .git/{STATE_FILE}): refusing to abort in it or "
            "remove it (nothing was touched)"
        )
    said: list[str] = []
    if patches_dir is not None and lock_file is not None and (repo_dir / ".git" / BACKUP_DIR).exists():
        state = BumpState.load(repo_dir)
        if _committed(lock_file.parent, state):
            said.append("patches/ and upstream.lock from this bump are committed: left as they are")
        else:
            restored = restore(repo_dir, patches_dir, lock_file)
            said.append(
                f"restored {len(restored)} file(s) to what they were before the bump: " + ", ".join(restored)
                if restored
                else "patches/ and upstream.lock already matched what they were before the bump"
            )
    else:
        said.append("patches/ and upstream.lock were not changed by this bump")
    repo = git.Repo(repo_dir)
    if am_in_progress(repo):
        # An interrupted am may have left its state half-written; the repository goes anyway.
        with contextlib.suppress(git.GitCommandError):
            repo.git.am("--abort")
    shutil.rmtree(repo_dir)
    said.append(f"{repo_dir} removed (recorded resolutions kept in {rr_cache_dir(repo_dir)})")
    return said


def _am(repo: git.Repo, *args: str) -> None:
    env = {
        "GIT_COMMITTER_NAME": "vllm-overlay bump",
        "GIT_COMMITTER_EMAIL": "bump@vllm-overlay.invalid",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    }
    with repo.git.custom_environment(**env):
        status, _out, _err = repo.git.am(*args, with_extended_output=True, with_exceptions=False)
        # rerere may have replayed a recorded resolution for every conflict (and staged it): then
        # nothing needs a person, and git am only waits to be told to go on.
        stuck_at = None
        while (status != 0 or am_in_progress(repo)) and _replayed(repo):
            current = _current_patch(repo)
            if current == stuck_at:
                break  # the replayed resolution did not let git am go on: a person must look
            stuck_at = current
            status, _out, _err = repo.git.am("--continue", with_extended_output=True, with_exceptions=False)
    if status != 0 or am_in_progress(repo):
        raise BumpError(conflict_help(repo))


def _current_patch(repo: git.Repo) -> str:
    next_file = Path(repo.git_dir) / "rebase-apply" / "next"
    return next_file.read_text().strip() if next_file.exists() else ""


def _replayed(repo: git.Repo) -> bool:
    """git am stopped, but recorded resolutions left nothing unmerged and no conflict markers."""
    if not am_in_progress(repo) or not (Path(repo.git_dir) / "MERGE_RR").exists():
        return False
    return not repo.git.diff("--name-only", "--diff-filter=U").split() and not conflict_markers(repo)


def pins_from_metadata(pkg_info: str) -> dict[str, str]:
    """The exact pins (``name==version``) a release's PKG-INFO gives torch and flashinfer-python."""
    pins = dependencies.exact_pins(pkg_info)
    return {name: pins[name] for name in PINNED if name in pins}


def new_lock(old: Lock, upstream: upstream_trees.Upstream, store: Store) -> Lock:
    """The lock for a published release, every value taken from the release and the index."""
    if upstream.kind not in ("release", "locked") or not upstream.version:
        raise BumpError("bump re-locks only to a published release (give a version number)")
    files = {entry.filename: entry for entry in upstream_trees.release_files(old.project, upstream.version)}
    sdist_name = f"{old.project}-{upstream.version}.tar.gz"
    if sdist_name not in files:
        raise BumpError(f"the index has no {sdist_name}")
    wheels: dict[str, Artifact] = {}
    for arch in sorted(WHEEL_ARCHES):  # the order lock.parse reads them in: a re-lock is byte-stable
        matching = sorted(name for name in files if name.endswith(".whl") and f"_{arch}." in name)
        if matching:
            wheels[arch] = Artifact(matching[0], files[matching[0]].sha256)
    repo = git.Repo(store.upstreams_git)
    try:
        pkg_info = repo.git.show(f"{upstream.commit}:PKG-INFO")
    except git.GitCommandError:
        pkg_info = ""
    pins = pins_from_metadata(pkg_info)
    return Lock(
        project=old.project,
        version=upstream.version,
        commit=upstream.release_commit or "",
        sdist=Artifact(sdist_name, files[sdist_name].sha256),
        wheels=wheels,
        base_image=re.sub(r":v[^:]*$", f":v{upstream.version}", old.base_image),
        base_digest="",  # a new tag needs resolving against a registry again
        pins={name: pins[name] for name in PINNED if name in pins},
    )


def finish(repo_dir: Path, patches_dir: Path) -> list[str]:
    """Export the refreshed series from the bump repository; returns the changed files."""
    return export.write(patches_dir, export.rendered(export.export_commits(repo_dir)))
