"""audit.targets: did a symbol a patch changes differ between two upstream trees (by AST, read from git)?"""

from __future__ import annotations

import ast
from pathlib import Path

import git as gitpython

from tests.tool.helpers.repos import git
from vllm_overlay.audit import targets
from vllm_overlay.audit.targets import Drift, TargetDrift

OLD = '''\
LIMIT = 4
name: str = "engine"


class Engine:
    """The engine."""

    def step(self, n):
        return n + 1

    class Inner:
        def deep(self):
            return 0


def helper(x):
    return x * 2
'''

# The same code reformatted, a comment added, helper moved above Engine; LIMIT changed; deep edited.
NEW = '''\
def helper(x):
    # doubled
    return (x *
            2)


LIMIT = 5
name: str = "engine"


class Engine:
    """The engine."""

    def step(self, n):
        return n + 1

    class Inner:
        def deep(self):
            return 1

    def added(self):
        pass
'''


def _trees(tmp_path: Path) -> tuple[gitpython.Repo, str, str]:
    root = tmp_path / "repo"
    (root / "vllm" / "engine").mkdir(parents=True)
    (root / "vllm" / "engine" / "__init__.py").write_text(OLD)
    (root / "vllm" / "broken.py").write_text("x = 1\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "old")
    old = git(root, "rev-parse", "HEAD").strip()
    (root / "vllm" / "engine" / "__init__.py").write_text(NEW)
    (root / "vllm" / "broken.py").write_text("def (:\n")
    (root / "vllm" / "fresh.py").write_text("def made():\n    pass\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "new")
    return gitpython.Repo(root), old, git(root, "rev-parse", "HEAD").strip()


def test_compare_between_two_commits(tmp_path: Path) -> None:
    repo, old, new = _trees(tmp_path)
    before, after = targets.commit_reader(repo, old), targets.commit_reader(repo, new)
    found = targets.compare_all(
        [
            "vllm.engine:helper",
            "vllm.engine:Engine.step",
            "vllm.engine:LIMIT",
            "vllm.engine:name",
            "vllm.engine:Engine.Inner.deep",
            "vllm.engine:Engine.added",
            "vllm.engine:Engine.never",
            "vllm.fresh:made",
            "vllm.broken:x",
            "vllm.gone:f",
        ],
        before,
        after,
    )
    assert [(d.target, d.drift, d.detail) for d in found] == [
        ("vllm.engine:helper", Drift.UNCHANGED, ""),  # formatting, comments and moves do not count
        ("vllm.engine:Engine.step", Drift.UNCHANGED, ""),
        ("vllm.engine:LIMIT", Drift.CHANGED, "vllm/engine/__init__.py"),
        ("vllm.engine:name", Drift.UNCHANGED, ""),  # an annotated assignment is a symbol too
        ("vllm.engine:Engine.Inner.deep", Drift.CHANGED, "vllm/engine/__init__.py"),
        ("vllm.engine:Engine.added", Drift.APPEARED, "now defined upstream in vllm/engine/__init__.py"),
        ("vllm.engine:Engine.never", Drift.ABSENT, "added by the patch"),
        ("vllm.fresh:made", Drift.APPEARED, "now defined upstream in vllm/fresh.py"),
        ("vllm.broken:x", Drift.UNPARSABLE, found[8].detail),
        ("vllm.gone:f", Drift.ABSENT, "added by the patch"),
    ]
    assert found[8].detail.startswith("vllm/broken.py: ")
    back = targets.compare("vllm.fresh:made", after, before)
    assert (back.drift, back.detail) == (Drift.REMOVED, "no module vllm.fresh")
    assert (
        targets.compare("vllm.engine:Engine.added", after, before).detail
        == "Engine.added not in vllm/engine/__init__.py"
    )


def test_a_module_target_compares_the_whole_module(tmp_path: Path) -> None:
    repo, old, new = _trees(tmp_path)
    before, after = targets.commit_reader(repo, old), targets.commit_reader(repo, new)
    assert targets.compare("vllm.engine", before, after).drift is Drift.CHANGED
    assert targets.compare("vllm.engine", before, before).drift is Drift.UNCHANGED


def test_commit_reader_reads_a_commit_not_the_working_tree(tmp_path: Path) -> None:
    repo, old, _new = _trees(tmp_path)
    read = targets.commit_reader(repo, old)
    assert read("vllm/engine/__init__.py") == OLD.rstrip("\n")  # git show drops the final newline
    assert read("vllm/fresh.py") is None
    assert read("no/such/file.py") is None


def test_module_files_and_find_symbol() -> None:
    assert targets.module_files("vllm.v1.core") == ["vllm/v1/core.py", "vllm/v1/core/__init__.py"]
    tree = ast.parse(OLD)
    assert isinstance(targets.find_symbol(tree, "Engine.Inner.deep"), ast.FunctionDef)
    assert isinstance(targets.find_symbol(tree, "LIMIT"), ast.Assign)
    assert isinstance(targets.find_symbol(tree, "name"), ast.AnnAssign)
    assert targets.find_symbol(tree, "helper.inner") is None
    assert targets.find_symbol(tree, "LIMIT.real") is None  # an assignment has no body to look into
    assert targets.find_symbol(ast.parse("async def go():\n    pass\n"), "go") is not None


def test_the_last_definition_of_a_name_is_the_one_compared() -> None:
    old = "def f():\n    return 1\n\n\ndef f():\n    return 2\n"
    new = "def f():\n    return 3\n\n\ndef f():\n    return 2\n"
    assert (
        targets.compare("m:f", lambda p: old if p == "m.py" else None, lambda p: new if p == "m.py" else None).drift
        is Drift.UNCHANGED
    )


def test_target_drift_text() -> None:
    assert str(TargetDrift("m:f", Drift.UNCHANGED)) == "m:f: unchanged"
    assert str(TargetDrift("m:f", Drift.REMOVED, "f not in m.py")) == "m:f: removed (f not in m.py)"
