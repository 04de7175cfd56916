"""Bump: carry the series to a new upstream release and re-lock.

The series is applied with ``git am --3way`` into a working repository (build/bump). git stops
at the first conflict; the person resolves it there and runs ``bump --continue``. When every
patch is in, the refreshed series is exported to patches/ and upstream.lock is rewritten from
the release itself (sdist and wheel sha256s from the index, commit id from vllm/_version.py, the
torch and flashinfer pins from its metadata) in one step.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import git

from vllm_overlay import apply, dependencies, export, sources
from vllm_overlay.lock import Artifact, Lock
from vllm_overlay.series import PATCH_FILE_TRAILER, Patch
from vllm_overlay.store import Store

STATE_FILE = "vllm-overlay-bump.json"
PINNED = ("torch", "flashinfer-python")
WHEEL_ARCHES = ("x86_64", "aarch64")


class BumpError(RuntimeError):
    """The bump cannot start or continue (with the reason and what to do)."""


@dataclass
class BumpState:
    spec: str
    upstream: dict[str, object]

    @classmethod
    def load(cls, repo_dir: Path) -> BumpState:
        path = repo_dir / ".git" / STATE_FILE
        if not path.exists():
            raise BumpError(f"{repo_dir}: no bump in progress (start one with: scripts/bump VERSION)")
        data = json.loads(path.read_text())
        return cls(data["spec"], data["upstream"])

    def save(self, repo_dir: Path) -> None:
        (repo_dir / ".git" / STATE_FILE).write_text(json.dumps({"spec": self.spec, "upstream": self.upstream}))


def with_patch_file_trailer(patch: Patch) -> bytes:
    """The patch text with a Patch-File trailer, so export writes the refreshed patch to the same file."""
    text = patch.raw.decode("utf-8")
    head, sep, rest = text.partition("\n---\n")
    return (head.rstrip("\n") + f"\n{PATCH_FILE_TRAILER}: {patch.name}" + sep + rest).encode("utf-8")


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
    patches: list[Patch], upstream: sources.Upstream, store: Store, repo_dir: Path, spec: str, seed_base: str
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
        shutil.rmtree(repo_dir)
    repo = sources.checkout(store, upstream, repo_dir)
    repo.git.config(apply.CONFIG_UPSTREAM, upstream.commit)
    apply.seed_preimages(repo, seed_base, patches)
    BumpState(spec, upstream.to_json()).save(repo_dir)
    queue = Path(repo.git_dir) / "vllm-overlay-patches"
    queue.mkdir()
    files = []
    for index, patch in enumerate(patches, start=1):
        path = queue / f"{index:04d}.patch"
        path.write_bytes(with_patch_file_trailer(patch))
        files.append(str(path))
    _am(repo, "--3way", "--quiet", *files)
    return repo


def resume(repo_dir: Path) -> git.Repo:
    """Continue ``git am`` after the person resolved a conflict (no-op if it already finished)."""
    repo = git.Repo(repo_dir)
    BumpState.load(repo_dir)
    if am_in_progress(repo):
        _am(repo, "--continue")
    return repo


def abort(repo_dir: Path) -> None:
    if not repo_dir.exists():
        raise BumpError(f"{repo_dir}: no bump in progress")
    repo = git.Repo(repo_dir)
    if am_in_progress(repo):
        repo.git.am("--abort")
    shutil.rmtree(repo_dir)


def _am(repo: git.Repo, *args: str) -> None:
    env = {
        "GIT_COMMITTER_NAME": "vllm-overlay bump",
        "GIT_COMMITTER_EMAIL": "bump@vllm-overlay.invalid",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    }
    with repo.git.custom_environment(**env):
        status, _out, _err = repo.git.am(*args, with_extended_output=True, with_exceptions=False)
    if status != 0 or am_in_progress(repo):
        raise BumpError(conflict_help(repo))


def pins_from_metadata(pkg_info: str) -> dict[str, str]:
    """The exact pins (``name==version``) a release's PKG-INFO gives torch and flashinfer-python."""
    pins = dependencies.exact_pins(pkg_info)
    return {name: pins[name] for name in PINNED if name in pins}


def new_lock(old: Lock, upstream: sources.Upstream, store: Store) -> Lock:
    """The lock for a published release, every value taken from the release and the index."""
    if upstream.kind not in ("release", "locked") or not upstream.version:
        raise BumpError("bump re-locks only to a published release (give a version number)")
    files = {entry.filename: entry for entry in sources.release_files(old.project, upstream.version)}
    sdist_name = f"{old.project}-{upstream.version}.tar.gz"
    if sdist_name not in files:
        raise BumpError(f"the index has no {sdist_name}")
    wheels: dict[str, Artifact] = {}
    for arch in WHEEL_ARCHES:
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
