"""Trees: the patched tree at every prefix of the series, as a shadow package and an upstream-tests copy.

Step 0 is pristine upstream, step k has patches 1..k applied (one commit each in the patched
repository). A step's *tree id* (git's own content address of the commit's tree) names exactly
what was tested, so the verdict store keys on it; a step's directories are only built when a test
actually has to run on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay.apply import patched_repo
from vllm_overlay.env import shadow
from vllm_overlay.upstream import safetar


def extract(repo: Path, commit: str, paths: list[str], dest: Path) -> dict[str, Path]:
    """Write ``paths`` as they are at ``commit`` under ``dest``; map each path to its copy."""
    result = {}
    for rel in paths:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gitcmd.git(repo, "cat-file", "blob", f"{commit}:{rel}", binary=True))
        result[rel] = target
    return result


def export_tree(repo: Path, commit: str, paths: list[str], dest: Path) -> None:
    """Extract ``paths`` (directories or files) of ``commit`` into ``dest`` without ownership."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = gitcmd.popen("-C", str(repo), "archive", "--format=tar", commit, "--", *paths, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        safetar.extract_all(tar, dest)
    if proc.wait() != 0:
        raise RuntimeError(f"git archive {commit} {' '.join(paths)} failed")


@dataclass
class Step:
    index: int
    commit: str
    shadow: Path  # directory to put first on PYTHONPATH
    replaced: list[str]
    deleted: list[str]


class Trees:
    """The steps of one run: commits and tree ids up front, directories on demand."""

    def __init__(self, workdir: Path, repo: Path, upstream_commit: str, commits: list[str], installed: Path) -> None:
        self.workdir = workdir
        self.repo = repo
        self.upstream_commit = upstream_commit
        self.commits = commits  # the commit of patch k is commits[k - 1]
        self.installed = installed
        self.steps: dict[int, Step] = {}
        self._tree_ids: dict[int, str] = {}
        self._tests_roots: dict[int, Path] = {}

    def commit_of(self, step: int) -> str:
        return self.upstream_commit if step == 0 else self.commits[step - 1]

    def tree_id(self, step: int) -> str:
        if step not in self._tree_ids:
            self._tree_ids[step] = patched_repo.tree_id(self.repo, self.commit_of(step))
        return self._tree_ids[step]

    def pristine_tests_root(self) -> Path:
        root = self.workdir / "upstream-tests" / self.upstream_commit[:16]
        marker = root / ".complete"
        if not marker.exists():
            shutil.rmtree(root, ignore_errors=True)
            present = gitcmd.git(self.repo, "ls-tree", "--name-only", self.upstream_commit).split()
            wanted = [p for p in ("tests", "pyproject.toml") if p in present]
            if "tests" not in wanted:
                raise RuntimeError(f"upstream {self.upstream_commit[:12]} has no tests/ directory")
            export_tree(self.repo, self.upstream_commit, wanted, root)
            marker.write_text(self.upstream_commit + "\n")
        return root

    def step(self, index: int) -> Step:
        """The step's shadow package and upstream-tests root (built on first use)."""
        if index not in self.steps:
            self.steps[index] = self._build(index)
        return self.steps[index]

    def _build(self, index: int) -> Step:
        commit = self.commit_of(index)
        step_dir = self.workdir / "steps" / f"{index:03d}"
        shutil.rmtree(step_dir, ignore_errors=True)
        present, deleted = patched_repo.changed_between(self.repo, self.upstream_commit, commit, shadow.PACKAGE + "/")
        replacements = extract(self.repo, commit, present, step_dir / "files")
        shadow_dir = shadow.build_shadow(self.installed, replacements, deleted, step_dir / "shadow")
        return Step(index, commit, shadow_dir, present, deleted)

    def upstream_tests(self, index: int) -> Path:
        """The root holding vLLM's tests/ (and pyproject.toml) as of the step."""
        if index in self._tests_roots:
            return self._tests_roots[index]
        commit = self.commit_of(index)
        tests_root = self.pristine_tests_root()
        t_present, t_deleted = patched_repo.changed_between(
            self.repo, self.upstream_commit, commit, "tests/", "pyproject.toml"
        )
        if t_present or t_deleted:  # the series edits vLLM's own tests: use them as of this step
            own = self.workdir / "steps" / f"{index:03d}-upstream-tests"
            shutil.rmtree(own, ignore_errors=True)
            shutil.copytree(tests_root, own, symlinks=True)
            for rel in t_deleted:
                (own / rel).unlink(missing_ok=True)
            extract(self.repo, commit, t_present, own)
            tests_root = own
        self._tests_roots[index] = tests_root
        return tests_root

    def check_shadow(self, python: Path, cwd: Path, index: int) -> None:
        """Prove ``import vllm`` resolves to the step's shadow (without importing it)."""
        step = self.step(index)
        code = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"
        env = dict(os.environ, PYTHONPATH=shadow.pythonpath_with(step.shadow, os.environ.get("PYTHONPATH")))
        found = subprocess.run(
            [str(python), "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=False
        ).stdout.strip()
        expected = str(step.shadow / shadow.PACKAGE)
        if os.path.realpath(found) != os.path.realpath(expected) and found != expected:
            raise RuntimeError(f"'import vllm' resolves to {found or 'nothing'}, not the shadow {expected}")
