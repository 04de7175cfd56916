"""The tool tests mirror the package: vllm_overlay/X.py is tested in test_X.py, vllm_overlay/P/X.py in P/test_X.py.

A newcomer looking for the tests of a module finds them by its path. A module without a test module
of its own is listed here with where its behaviour is proven instead; the list cannot rot: an entry
that gains a test module, or names no module, fails too. Shared helpers live in helpers/ and
fixtures in conftest.py: a test module never imports another test module or a conftest.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tool.helpers.repos import REPO_ROOT

PACKAGE = REPO_ROOT / "vllm_overlay"
TESTS = REPO_ROOT / "tests" / "tool"

# Modules proven elsewhere, and where.
ELSEWHERE = {
    "faults.py": "test infrastructure (VLLM_OVERLAY_KILL_AT); the kills it makes are apply/test_engine_faults.py's",
    "image/errors.py": "ImageError alone: raised and asserted by the image tests; an input error (test_errors.py)",
    "e2e/fault_models.py": "loaded inside a vLLM server (imports vllm, torch): serve-e2e's hang and TP failures",
    "e2e/tp_probe.py": "runs inside the CPU runtime at TP=2 (imports vllm and torch); serve-e2e --tp",
    "testrun/execute.py": "pytest processes, their pool and time limits: testrun/test_session.py's whole runs",
    "testrun/runner.py": "the run over a plan: testrun/test_session.py and testrun/test_verdict_store.py",
    "testrun/render.py": "the table and JUnit cases: the whole runs of testrun/test_session.py read them",
    "testrun/trees.py": "the shadow trees of every prefix: testrun/test_plan.py and testrun/test_session.py",
    "upstream/index_entry.py": "two plain types (what an index lists): upstream/test_indexes.py, test_index_pages.py",
}


def _modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def _test_module(module: str) -> Path:
    path = Path(module)
    return TESTS / path.parent / f"test_{path.name}"


def test_every_module_has_a_test_module_at_its_mirrored_path_or_says_where_it_is_proven():
    missing = [m for m in _modules() if not _test_module(m).is_file() and m not in ELSEWHERE]
    assert missing == [], f"no tests/tool/<path>/test_<module>.py for: {missing}"


def test_the_list_of_modules_proven_elsewhere_holds_only_modules_without_a_test_module():
    modules = set(_modules())
    stale = [m for m in ELSEWHERE if m not in modules or _test_module(m).is_file()]
    assert stale == [], f"remove from ELSEWHERE (gone, or tested at its path now): {stale}"


def test_no_test_module_imports_another_test_module_or_a_conftest():
    offending = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if name.startswith("tests.") and (last == "conftest" or last.startswith("test_")):
                    offending.append(f"{path.relative_to(REPO_ROOT)}: {name}")
    assert offending == [], offending
