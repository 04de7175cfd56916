"""What a person must know about a patch on a new upstream beyond its apply status.

* conflicts: which files still conflict in a 3-way merge (to resolve, with the conflict regions)
  and which merge, with every failing hunk;
* broken merges: a merged or clean result whose changed functions use names that do not
  resolve in the new tree (pyflakes for names, and ``self.attr`` that the tree the patch was
  made on defines but the new tree does not: a method an earlier, unapplied patch adds);
* moved targets: where a Targets symbol of a missing file lives in the new release.
"""

from __future__ import annotations

import ast
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git
import unidiff
from pyflakes import api as pyflakes_api
from pyflakes import messages as pyflakes_messages
from pyflakes import reporter as pyflakes_reporter

from vllm_overlay.apply.classify import HunkNote, PatchResult, Status
from vllm_overlay.audit import targets
from vllm_overlay.series import Patch

CONFLICT_START_RE = re.compile(r"^<{7}( |$)")


@dataclass
class Hunk:
    file: str
    hunk: int
    line: int
    how: str

    def __str__(self) -> str:
        return f"{self.file} hunk #{self.hunk} (line {self.line}): {self.how}"


@dataclass
class ConflictReport:
    resolve: dict[str, list[int]] = field(default_factory=dict)  # file -> conflict region start lines
    merge: list[str] = field(default_factory=list)  # files whose failing hunks merge in 3-way
    hunks: list[Hunk] = field(default_factory=list)
    error: str = ""  # git's message when it could not even try the merge

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _hunks(notes: list[HunkNote], resolve: set[str], merge: set[str]) -> list[Hunk]:
    found = []
    for note in notes:
        if note.file in resolve:
            how = f"{note.note}; conflicts in a 3-way merge"
        elif note.file in merge:
            how = f"{note.note}; merges in a 3-way merge"
        else:
            how = note.note
        found.append(Hunk(note.file, note.hunk, note.recorded_line, how))
    return found


def conflict_report(repo: git.Repo, base: str, patch: Patch, result: PatchResult) -> ConflictReport:
    """Apply the patch with ``git apply --3way`` onto ``base`` and see which files are left unmerged.

    The merge runs on a private index and a scratch work tree holding only the files the patch
    touches (git apply reads and writes no others), so no full checkout is made.
    """
    failing_files = sorted({note.file for note in result.hunks})
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-conflict-") as tmp:
        work = Path(tmp) / "tree"
        work.mkdir()
        scratch = git.Git(work)
        env = {"GIT_DIR": str(repo.git_dir), "GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(work)}
        with scratch.custom_environment(**env):
            scratch.read_tree(base)
            present = [name for name in patch.touched_files if scratch.ls_files("--", name)]
            if present:
                scratch.checkout_index("-u", "--", *present)  # -u: record the stat data
            status, _out, err = scratch.apply(
                "--3way", str(patch.path.resolve()), with_extended_output=True, with_exceptions=False
            )
            unmerged = sorted({line.split("\t", 1)[1] for line in scratch.ls_files("-u").splitlines() if "\t" in line})
        resolve: dict[str, list[int]] = {}
        for name in unmerged:
            text = (work / name).read_text(encoding="utf-8", errors="replace").splitlines()
            resolve[name] = [i for i, line in enumerate(text, start=1) if CONFLICT_START_RE.match(line)]
    error = ""
    if status != 0 and not unmerged:
        error = err.strip().splitlines()[-1] if err.strip() else f"git apply --3way exited {status}"
        # Nothing was merged: every failing file is still to be resolved.
        resolve = {name: [] for name in failing_files}
    merge = [name for name in failing_files if name not in resolve]
    return ConflictReport(resolve, merge, _hunks(result.hunks, set(resolve), set(merge)), error)


def summary(report: ConflictReport, limit: int | None = None) -> str:
    """The reason text: files to resolve, files that merge, the failing hunks (``limit``: and N more)."""
    parts = []
    if report.resolve:
        files = [f"{name} (conflict at line {', '.join(map(str, lines))})" if lines else name
                 for name, lines in report.resolve.items()]  # fmt: skip
        parts.append("resolve " + ", ".join(files))
    if report.merge:
        parts.append("merge in 3-way: " + ", ".join(report.merge))
    if report.error:
        parts.append(f"git: {report.error}")
    hunks = report.hunks if limit is None else report.hunks[:limit]
    if hunks:
        more = len(report.hunks) - len(hunks)
        parts.append("failing hunks: " + "; ".join(str(h) for h in hunks) + (f"; and {more} more" if more else ""))
    return "; ".join(parts)


# --- broken merges -------------------------------------------------------------------------------


class _Collect(pyflakes_reporter.Reporter):
    def __init__(self) -> None:
        self.found: list[pyflakes_messages.Message] = []

    def flake(self, message: pyflakes_messages.Message) -> None:
        self.found.append(message)

    def unexpectedError(self, filename: str, msg: str) -> None:
        pass

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:
        pass


def changed_lines(repo: git.Repo, commit: str) -> dict[str, set[int]]:
    """Line numbers (new side) each .py file's added lines occupy in ``commit``."""
    diff = repo.git.diff("--no-color", "--unified=0", f"{commit}^", commit, "--", "*.py")
    lines: dict[str, set[int]] = {}
    for patched in unidiff.PatchSet(diff):
        if patched.is_removed_file:
            continue
        added = {line.target_line_no for hunk in patched for line in hunk if line.is_added}
        removed_at = {hunk.target_start for hunk in patched if hunk.removed and not hunk.added}
        lines[patched.path] = added | removed_at
    return lines


def _function_spans(tree: ast.Module) -> list[tuple[int, int, ast.AST, ast.ClassDef | None]]:
    spans = []

    def visit(body: list[ast.stmt], cls: ast.ClassDef | None) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                spans.append((node.lineno, node.end_lineno or node.lineno, node, cls))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, node)

    visit(tree.body, None)
    return spans


def _changed_functions(tree: ast.Module, lines: set[int]) -> list[tuple[ast.AST, ast.ClassDef | None]]:
    return [(node, cls) for start, end, node, cls in _function_spans(tree) if any(start <= n <= end for n in lines)]


def _class_attributes(read: targets.FileReader, path: str, source: str, cls: str, depth: int = 0) -> set[str] | None:
    """Names a class defines (methods, class attributes, ``self.x =``), its bases in the tree included.

    Bases from outside the tree (torch.nn.Module) contribute nothing; callers only compare two
    trees' answers, so what such a base provides cancels out. None when the class is not there.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    node = targets.find_symbol(tree, cls)
    if not isinstance(node, ast.ClassDef) or depth > 8:
        return None
    names: set[str] = set()
    for item in ast.walk(node):
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
            names.add(item.id)
        elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
            names.add(item.attr)
    imports = {
        alias.asname or alias.name: (imported.module or "", alias.name)
        for imported in tree.body
        if isinstance(imported, ast.ImportFrom) and imported.level == 0
        for alias in imported.names
    }
    for base in node.bases:
        if not isinstance(base, ast.Name):
            continue
        if targets.find_symbol(tree, base.id) is not None:
            inherited = _class_attributes(read, path, source, base.id, depth + 1)
        elif base.id in imports and imports[base.id][0].split(".")[0] == path.split("/")[0]:
            module, name = imports[base.id]
            inherited = None
            for candidate in targets.module_files(module):
                text = read(candidate)
                if text is not None:
                    inherited = _class_attributes(read, candidate, text, name, depth + 1)
                    break
        else:
            inherited = None
        names |= inherited or set()
    return names


def _self_attributes(function: ast.AST) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in ast.walk(function):
        if (
            isinstance(item, ast.Attribute)
            and isinstance(item.ctx, ast.Load)
            and isinstance(item.value, ast.Name)
            and item.value.id == "self"
        ):
            found.setdefault(item.attr, item.lineno)
    return found


def unresolved_names(
    repo: git.Repo, commit: str, old_read: targets.FileReader | None, patch_files: list[str]
) -> list[str]:
    """Names the commit's changed functions use that the new tree does not define.

    ``old_read`` reads the tree the patch was made on (the old upstream with the series up to
    this patch): a ``self.attr`` counts only when that tree's class defines it and the new
    tree's class does not, so attributes from outside the tree (torch.nn.Module) never count.
    """
    problems: list[str] = []
    for path, lines in changed_lines(repo, commit).items():
        if path not in patch_files:
            continue
        try:
            source = repo.git.show(f"{commit}:{path}")
        except git.GitCommandError:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            problems.append(f"{path}:{exc.lineno}: does not parse: {exc.msg}")
            continue
        functions = _changed_functions(tree, lines)
        spans = [(node.lineno, node.end_lineno or node.lineno) for node, _ in functions]
        old_source = old_read(path) if old_read is not None else None
        # A name the tree the patch was made on leaves undefined too is not this merge's doing.
        known = {text for _, text in _undefined(old_source, path)} if old_source is not None else set()
        for line, text in _undefined(source, path):
            if text not in known and (line in lines or any(start <= line <= end for start, end in spans)):
                problems.append(f"{path}:{line}: {text}")
        if old_read is None:
            continue
        read_new = targets.commit_reader(repo, commit)
        for function, cls in functions:
            if cls is None:
                continue
            new_names = _class_attributes(read_new, path, source, cls.name)
            old_names = _class_attributes(old_read, path, old_source, cls.name) if old_source else None
            if new_names is None or old_names is None:
                continue
            for attr, line in _self_attributes(function).items():
                if attr in old_names and attr not in new_names:
                    problems.append(
                        f"{path}:{line}: self.{attr} is not defined by {cls.name} here "
                        "(the tree the patch was made on defines it)"
                    )
    return problems


def _undefined(source: str, path: str) -> list[tuple[int, str]]:
    """pyflakes' undefined-name findings of a file: (line, message)."""
    collect = _Collect()
    pyflakes_api.check(source, path, collect)
    return [
        (message.lineno, message.message % message.message_args)
        for message in collect.found
        if isinstance(message, pyflakes_messages.UndefinedName | pyflakes_messages.UndefinedLocal)
    ]


# --- moved targets -------------------------------------------------------------------------------


def moved_targets(
    repo: git.Repo, commit: str, patch: Patch, read_new: targets.FileReader, read_old: targets.FileReader
) -> list[str]:
    """For each Targets symbol whose module file the old upstream has and the new one lacks: where it is now."""
    notes = []
    for target in patch.targets:
        module, _, qualname = target.partition(":")
        files = targets.module_files(module)
        if not qualname or any(read_new(path) is not None for path in files):
            continue
        if all(read_old(path) is None for path in files):
            continue  # a module the patch itself adds
        old_source = next((text for text in map(read_old, files) if text is not None), "")
        try:
            if targets.find_symbol(ast.parse(old_source), qualname) is None:
                continue  # a symbol the patch itself adds
        except SyntaxError:
            pass
        head = qualname.split(".")[0]
        pattern = rf"^\s*(class|def|async def) {re.escape(head)}\b"
        status, out, _err = repo.git.grep(
            "-l", "-E", pattern, commit, "--", "*.py", with_extended_output=True, with_exceptions=False
        )
        places = []
        for line in out.splitlines() if status == 0 else []:
            path = line.split(":", 1)[1]
            source = read_new(path)
            try:
                if source is not None and targets.find_symbol(ast.parse(source), qualname) is not None:
                    places.append(path)
            except SyntaxError:
                continue
        if places:
            notes.append(f"{qualname} is in {', '.join(places)} there")
        else:
            notes.append(f"{qualname} is nowhere in the new release")
    return notes


def is_accepted_merge(result: PatchResult) -> bool:
    return result.accepted and result.commit is not None and result.status is not Status.ALREADY_UPSTREAM
