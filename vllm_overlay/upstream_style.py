"""The series' Python files against upstream's own ruff configuration, pristine beside patched.

A patch that is to be sent upstream must pass the checks upstream's pre-commit runs. vLLM keeps
its ruff configuration in the sdist's pyproject.toml; some of its files have findings already
(or are not formatted), so the rule is relative: a patched file may have no finding, and no
formatting difference, that the same file in the pristine tree does not have. Both sides are
checked by the same ruff, with the same configuration, in two scratch copies laid out as the
tree is (the files the series changes, plus the ``__init__.py`` files above them, so package
rules such as INP see the real packages). Line numbers move when a patch adds lines, so findings
are compared as a multiset of (file, rule, message).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import git
import unidiff

from vllm_overlay.errors import InputError

CONFIG_FILE = "pyproject.toml"


class UpstreamStyleError(InputError, RuntimeError):
    """The check cannot run (no ruff, no upstream configuration, a tree that is not a repository)."""


@dataclass(frozen=True)
class Finding:
    path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.code} {self.message}"


@dataclass(frozen=True)
class StyleReport:
    files: tuple[str, ...]
    new_findings: tuple[Finding, ...]
    newly_unformatted: tuple[str, ...]
    pristine_findings: int
    patched_findings: int

    @property
    def ok(self) -> bool:
        return not self.new_findings and not self.newly_unformatted


def changed_python_files(repo: git.Repo, base: str, head: str = "HEAD") -> list[str]:
    """The .py files the commits base..head add or modify (deleted files have nothing to check)."""
    names = repo.git.diff("--no-renames", "--diff-filter=AM", "--name-only", "-z", base, head, "--", "*.py")
    return sorted(name for name in names.split("\0") if name)


def check_in_place(tree: Path, base: str) -> StyleReport:
    """As ``check``, but ruff runs in whole trees: ``tree`` itself (its HEAD, clean) and ``base``
    checked out beside it for the time of the check.

    The scratch copies ``check`` makes hold only the changed files, so a rule that looks at the
    project around a file can judge it otherwise than upstream's own run does (isort tells
    first-party from third-party imports by the packages it finds: a new test importing the
    project's ``tests`` package is ordered differently in a copy that lacks it). A branch about to
    be sent upstream (scripts/forward) is checked where it will be checked.
    """
    repo, _config = _repository(tree, base)
    files = changed_python_files(repo, base)
    with tempfile.TemporaryDirectory(prefix="upstream-style-") as scratch:
        pristine_root = Path(scratch, "pristine")
        repo.git.worktree("add", "--detach", "--quiet", str(pristine_root), base)
        try:
            in_pristine = [name for name in files if (pristine_root / name).is_file()]
            before, after = _findings(pristine_root, in_pristine), _findings(tree, files)
            unformatted_before = _unformatted(pristine_root, in_pristine)
            unformatted_after = _unformatted(tree, files)
        finally:
            repo.git.worktree("remove", "--force", str(pristine_root))
    return _report(files, before, after, unformatted_before, unformatted_after)


def _repository(tree: Path, base: str, hint: str = "") -> tuple[git.Repo, bytes]:
    """The repository at ``tree`` and upstream's ruff configuration at ``base``; refused when ruff,
    the repository or the configuration is missing."""
    try:
        import ruff  # noqa: F401  (only to say clearly that it is missing)
    except ImportError:
        raise UpstreamStyleError("ruff is not installed: python3 -m pip install -e '.[test]'") from None
    try:
        repo = git.Repo(tree)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UpstreamStyleError(f"{tree} is not a git repository {hint}".rstrip()) from None
    config = _blob(repo, base, CONFIG_FILE)
    if config is None:
        raise UpstreamStyleError(f"the upstream tree at {base} has no {CONFIG_FILE}: no ruff configuration to check")
    return repo, config


def _report(
    files: list[str],
    before: Counter[Finding],
    after: Counter[Finding],
    unformatted_before: set[str],
    unformatted_after: set[str],
) -> StyleReport:
    new = after - before
    return StyleReport(
        files=tuple(files),
        new_findings=tuple(sorted(new.elements(), key=str)),
        newly_unformatted=tuple(sorted(unformatted_after - unformatted_before)),
        pristine_findings=sum(before.values()),
        patched_findings=sum(after.values()),
    )


def _blob(repo: git.Repo, rev: str, path: str) -> bytes | None:
    try:
        return (repo.commit(rev).tree / path).data_stream.read()
    except KeyError:
        return None


def _package_inits(paths: list[str]) -> set[str]:
    inits: set[str] = set()
    for name in paths:
        for parent in PurePosixPath(name).parents:
            if parent != PurePosixPath("."):
                inits.add((parent / "__init__.py").as_posix())
    return inits


def _lay_out(repo: git.Repo, rev: str, files: list[str], config: bytes, dest: Path) -> list[str]:
    """Write ``files`` as they are at ``rev`` under ``dest``; return those that exist there."""
    (dest / CONFIG_FILE).write_bytes(config)
    present: list[str] = []
    for name in sorted(set(files) | _package_inits(files)):
        data = _blob(repo, rev, name)
        if data is None:
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if name in files:
            present.append(name)
    return present


def _ruff(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise UpstreamStyleError(f"ruff {' '.join(args[:1])} did not finish in {exc.timeout:.0f} s") from None


def _findings(root: Path, files: list[str]) -> Counter[Finding]:
    if not files:
        return Counter()
    done = _ruff(["check", "--no-cache", "--no-fix", "--exit-zero", "--output-format", "json", *files], root)
    if done.returncode != 0:
        raise UpstreamStyleError(f"ruff check failed in {root}: {done.stderr.strip()[-400:]}")
    found: Counter[Finding] = Counter()
    for item in json.loads(done.stdout or "[]"):
        name = Path(item["filename"]).resolve().relative_to(root.resolve()).as_posix()
        found[Finding(name, item.get("code") or "syntax", item["message"])] += 1
    return found


def _unformatted(root: Path, files: list[str]) -> set[str]:
    """The files ruff format would change (its --diff output, read with unidiff: stable across ruff versions)."""
    if not files:
        return set()
    done = _ruff(["format", "--no-cache", "--diff", *files], root)
    if done.returncode not in (0, 1):
        raise UpstreamStyleError(f"ruff format failed in {root}: {done.stderr.strip()[-400:]}")
    names = set()
    for patched in unidiff.PatchSet(done.stdout):
        name = Path(patched.source_file.removeprefix("a/"))
        names.add((name.resolve().relative_to(root.resolve()) if name.is_absolute() else name).as_posix())
    return names


def check(tree: Path, base: str) -> StyleReport:
    """Compare the files ``base..HEAD`` changes in the repository ``tree`` under ``base``'s ruff config."""
    repo, config = _repository(tree, base, "(run scripts/apply-patches first)")
    files = changed_python_files(repo, base)
    with tempfile.TemporaryDirectory(prefix="upstream-style-") as scratch:
        pristine_root, patched_root = Path(scratch, "pristine"), Path(scratch, "patched")
        pristine_root.mkdir()
        patched_root.mkdir()
        in_pristine = _lay_out(repo, base, files, config, pristine_root)
        in_patched = _lay_out(repo, "HEAD", files, config, patched_root)
        before, after = _findings(pristine_root, in_pristine), _findings(patched_root, in_patched)
        unformatted_before = _unformatted(pristine_root, in_pristine)
        unformatted_after = _unformatted(patched_root, in_patched)
    return _report(files, before, after, unformatted_before, unformatted_after)
