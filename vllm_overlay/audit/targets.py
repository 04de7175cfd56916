"""Target drift: did a symbol a patch changes differ between two upstream trees?

A patch's Targets header names ``module:qualname`` symbols. A patch can apply cleanly to a new
upstream while the function it edits was rewritten around it; line positions say nothing about
that, so each symbol is compared by its AST (``ast.dump`` without positions): formatting, moves
within the file and comments do not count, a changed statement does.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable
from dataclasses import dataclass

import git

# Reads a file of an upstream tree by its repo-relative path; None when the file does not exist.
FileReader = Callable[[str], str | None]


def commit_reader(repo: git.Repo, commit: str) -> FileReader:
    """Read files of one commit straight from a repository (None where the file is absent)."""

    def read(path: str) -> str | None:
        try:
            return repo.git.show(f"{commit}:{path}")
        except git.GitCommandError:
            return None

    return read


class Drift(enum.StrEnum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    REMOVED = "removed"  # present in the old upstream, gone from the new one
    APPEARED = "appeared"  # absent from the old upstream (added by the patch), present upstream now
    ABSENT = "absent"  # in neither upstream: a symbol the patch itself adds
    UNPARSABLE = "unparsable"


@dataclass(frozen=True)
class TargetDrift:
    target: str
    drift: Drift
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.target}: {self.drift}" + (f" ({self.detail})" if self.detail else "")


def module_files(module: str) -> list[str]:
    """Candidate source files of a dotted module name."""
    base = module.replace(".", "/")
    return [f"{base}.py", f"{base}/__init__.py"]


def find_symbol(tree: ast.Module, qualname: str) -> ast.AST | None:
    """The class/function/assignment node of ``qualname`` (dotted through classes and functions)."""
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = None
        for candidate in scope:
            if isinstance(candidate, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if candidate.name == part:
                    node = candidate
            elif isinstance(candidate, ast.Assign | ast.AnnAssign):
                targets = candidate.targets if isinstance(candidate, ast.Assign) else [candidate.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    node = candidate
        if node is None:
            return None
        scope = getattr(node, "body", [])
    return node


def _symbol_dump(read: FileReader, target: str) -> tuple[str | None, str]:
    """(ast dump or None when absent, note)."""
    module, _, qualname = target.partition(":")
    for path in module_files(module):
        source = read(path)
        if source is None:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        node = find_symbol(tree, qualname) if qualname else tree
        if node is None:
            return None, f"{qualname} not in {path}"
        return ast.dump(node, include_attributes=False), path
    return None, f"no module {module}"


def compare(target: str, old: FileReader, new: FileReader) -> TargetDrift:
    """Compare one ``module:qualname`` between the old and the new upstream."""
    try:
        before, _ = _symbol_dump(old, target)
        after, where_after = _symbol_dump(new, target)
    except ValueError as exc:
        return TargetDrift(target, Drift.UNPARSABLE, str(exc))
    if before is None and after is None:
        return TargetDrift(target, Drift.ABSENT, "added by the patch")
    if before is None:
        return TargetDrift(target, Drift.APPEARED, f"now defined upstream in {where_after}")
    if after is None:
        return TargetDrift(target, Drift.REMOVED, where_after)
    if before == after:
        return TargetDrift(target, Drift.UNCHANGED)
    return TargetDrift(target, Drift.CHANGED, where_after)


def compare_all(targets: list[str], old: FileReader, new: FileReader) -> list[TargetDrift]:
    return [compare(target, old, new) for target in targets]
