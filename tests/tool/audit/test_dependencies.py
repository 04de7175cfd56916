"""Dependency-API drift: Dependency-Targets parsed and linted, sources fetched and cached, symbols compared."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from tests.tool.helpers.repos import change_line_20
from vllm_overlay import lint
from vllm_overlay.apply import engine as apply
from vllm_overlay.audit import decisions, dependencies, targets
from vllm_overlay.series import load_series
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees

WRAPPER_OLD = "class Wrapper:\n    def __init__(self, n, shared=None):\n        self._buf = shared\n"
WRAPPER_NEW = "class Wrapper:\n    def __init__(self, n):\n        self._buf = None\n"
PACKAGE_INIT = "from .impl import Wrapper as Wrapper\n"
TARGET = dependencies.DependencyTarget.parse("Demo_Lib:demolib:Wrapper.__init__")


def make_wheel(tmp_path, version: str, impl: str) -> upstream_trees.IndexFile:
    path = tmp_path / f"demo_lib-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("demolib/__init__.py", PACKAGE_INIT)
        wheel.writestr("demolib/impl.py", impl)
        wheel.writestr("demo_lib-1.dist-info/METADATA", "Name: demo-lib\n")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return upstream_trees.IndexFile(path.name, path.as_uri(), sha, path.stat().st_size)


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A package index holding demo-lib 1.0 (the locked pin's API) and 2.0 (without ``shared``)."""
    files = {"1.0": make_wheel(tmp_path, "1.0", WRAPPER_OLD), "2.0": make_wheel(tmp_path, "2.0", WRAPPER_NEW)}
    asked: list[tuple[str, str]] = []

    def release_files(project, version):
        asked.append((project, version))
        if version not in files:
            raise upstream_trees.SourceError(f"the package index lists no files for {project} {version}")
        return [files[version]]

    monkeypatch.setattr(upstream_trees, "release_files", release_files)
    return asked


def test_trailer_parses_and_lint_checks_it(project, make_patch, upstream_dir):
    assert (TARGET.distribution, TARGET.module, TARGET.qualname) == ("demo-lib", "demolib", "Wrapper.__init__")
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    head, sep, rest = text.partition("\n---\n")
    path.write_text(
        head + "\nDependency-Targets: flashinfer-python:flashinfer.fused_moe:B12xMoEWrapper.__init__"
        "\nDependency-Targets: nopin:mod:Sym, broken-entry" + sep + rest
    )
    found = lint.lint(project, project / "patches")
    assert any("upstream.lock pins no nopin" in p for p in found), found
    assert any("'broken-entry' is not DISTRIBUTION:MODULE:QUALNAME" in p for p in found), found
    assert not any("flashinfer-python:" in p for p in found), found
    assert [str(t) for t in dependencies.declared(load_series(project / "patches")[0])] == [
        "flashinfer-python:flashinfer.fused_moe:B12xMoEWrapper.__init__",
        "nopin:mod:Sym",
    ]


def test_pins_come_from_the_release_metadata():
    pkg_info = (
        "Metadata-Version: 2.1\nName: vllm\nRequires-Dist: torch==2.13.0\nRequires-Dist: Flashinfer_Python==0.6.1\n"
        'Requires-Dist: regex\nRequires-Dist: pytest==8.0; extra == "test"\n'
    )
    assert dependencies.exact_pins(pkg_info) == {"torch": "2.13.0", "flashinfer-python": "0.6.1"}
    assert dependencies.release_pins(lambda p: None, {"torch": "1"}) == {"torch": "1"}


def test_sources_are_verified_cached_and_compared(tmp_path, store_env, index):
    store = Store()
    old_root = dependencies.source_root(store, "demo-lib", "1.0")
    new_root = dependencies.source_root(store, "demo-lib", "2.0")
    assert (old_root / "demolib" / "impl.py").read_text() == WRAPPER_OLD
    assert not (old_root / "demo_lib-1.dist-info").exists()  # only the Python files are kept
    assert dependencies.source_root(store, "demo-lib", "1.0") == old_root and len(index) == 2  # cached
    old, new = dependencies.directory_reader(old_root), dependencies.directory_reader(new_root)
    node, where = dependencies.locate(old, "demolib", "Wrapper.__init__")  # followed the re-export
    assert node is not None and where == "demolib/impl.py"
    drift = dependencies.compare(TARGET, "1.0", "2.0", old, new)
    assert drift.drift is targets.Drift.CHANGED
    assert "demo-lib 1.0 -> 2.0" in str(drift) and "parameters missing there: shared" in str(drift)
    run = dependencies.DependencyTarget.parse("demo-lib:demolib:Wrapper.run")
    gone = dependencies.compare(run, "1.0", "2.0", old, old)
    assert gone.drift is targets.Drift.ABSENT
    removed = dependencies.compare(TARGET, "1.0", "2.0", old, lambda p: None)
    assert removed.drift is targets.Drift.REMOVED


def test_a_clean_patch_is_no_keep_when_its_dependency_changed(store_env, index, project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "uses lib")
    head, sep, rest = path.read_text().partition("\n---\n")
    path.write_text(head + "\nDependency-Targets: demo-lib:demolib:Wrapper.__init__" + sep + rest)
    patches = load_series(project / "patches")
    clean = apply.PatchResult(patches[0].name, "demo", "uses lib", apply.Status.CLEAN, True)
    store = Store()
    same = dependencies.drift_by_patch(patches, {"demo-lib": "1.0"}, {"demo_lib": "1.0"}, store)
    assert decisions.decide(clean, [], same[patches[0].name])[0] is decisions.Decision.KEEP
    moved = dependencies.drift_by_patch(patches, {"demo-lib": "1.0"}, {"demo-lib": "2.0"}, store)
    decision, reason = decisions.decide(clean, [], moved[patches[0].name])
    assert decision is decisions.Decision.REFRESH
    assert "demo-lib 1.0 -> 2.0: demolib:Wrapper.__init__ changed" in reason and "shared" in reason
    unknown = dependencies.drift_by_patch(patches, {"demo-lib": "1.0"}, {"demo-lib": "3.0"}, store)
    decision, reason = decisions.decide(clean, [], unknown[patches[0].name])
    assert decision is decisions.Decision.REFRESH and "not checked" in reason and "demo-lib 3.0" in reason
