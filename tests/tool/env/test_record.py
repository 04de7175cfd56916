"""RECORD verification on tiny fake distributions (no vLLM)."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

import pytest

from vllm_overlay.env import record

FILES = {
    "fakepkg/__init__.py": b"",
    "fakepkg/core.py": b"VALUE = 1\n",
    "fakepkg/sub/data.json": b'{"a": 1}\n',
}


def make_dist(site: Path, name: str = "fakepkg", version: str = "1.0", files: dict[str, bytes] | None = None) -> Path:
    """Install ``files`` plus a dist-info whose RECORD lists them, as pip would."""
    files = FILES if files is None else files
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines.append(f"{rel},{record.record_hash(hashlib.sha256(data).hexdigest())},{len(data)}")
    # What pip also writes: a compiled file without hash, RECORD itself, a script outside site-packages.
    pyc = site / "fakepkg" / "__pycache__" / "core.cpython-311.pyc"
    pyc.parent.mkdir(parents=True, exist_ok=True)
    pyc.write_bytes(b"compiled")
    lines += ["fakepkg/__pycache__/core.cpython-311.pyc,,", f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    lines.append("../../../bin/fakepkg,sha256=AAAA,4")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return site


def wheel_record(site: Path, name: str = "fakepkg", version: str = "1.0") -> str:
    """The RECORD as the wheel had it: the trusted expectation, read before any test tampers."""
    return (site / f"{name}-{version}.dist-info" / "RECORD").read_text()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return make_dist(tmp_path / "site-packages")


@pytest.fixture
def expected(site: Path) -> str:
    return wheel_record(site)


def test_pristine_distribution_has_no_problems(site: Path, expected: str) -> None:
    assert record.verify_distribution(site, "fakepkg", expected=expected) == []


def test_modified_missing_and_resized_files_are_named(site: Path, expected: str) -> None:
    (site / "fakepkg" / "core.py").write_bytes(b"VALUE = 2\n")  # same size, other bytes
    (site / "fakepkg" / "sub" / "data.json").write_bytes(b"{}\n")
    (site / "fakepkg" / "__init__.py").unlink()
    problems = {(p.path, p.kind) for p in record.verify_distribution(site, "fakepkg", expected=expected)}
    assert problems == {
        ("fakepkg/core.py", "modified"),
        ("fakepkg/sub/data.json", "size"),
        ("fakepkg/__init__.py", "missing"),
    }


def test_unrecorded_module_is_a_problem_but_bytecode_caches_are_not(site: Path, expected: str) -> None:
    (site / "fakepkg" / "extra.py").write_text("import os\n")
    (site / "fakepkg" / "sub" / "__pycache__").mkdir()
    (site / "fakepkg" / "sub" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"x")
    problems = record.verify_distribution(site, "fakepkg", expected=expected)
    assert [(p.path, p.kind) for p in problems] == [("fakepkg/extra.py", "unrecorded")]
    assert record.verify_distribution(site, "fakepkg", check_unrecorded=False, expected=expected) == []


def test_replaced_files_must_match_the_manifest_instead_of_record(site: Path, expected: str) -> None:
    new = b"VALUE = 42\n"
    (site / "fakepkg" / "core.py").write_bytes(new)
    (site / "fakepkg" / "added.py").write_bytes(b"ADDED = 1\n")
    manifest = {
        "fakepkg/core.py": hashlib.sha256(new).hexdigest(),
        "fakepkg/added.py": record.record_hash(hashlib.sha256(b"ADDED = 1\n").hexdigest()),
    }
    assert record.verify_distribution(site, "fakepkg", manifest, expected=expected) == []
    (site / "fakepkg" / "core.py").write_bytes(b"VALUE = 43\n")
    kinds = [(p.path, p.kind) for p in record.verify_distribution(site, "fakepkg", manifest, expected=expected)]
    assert kinds == [("fakepkg/core.py", "replaced-mismatch")]
    (site / "fakepkg" / "added.py").unlink()
    assert ("fakepkg/added.py", "replaced-missing") in {
        (p.path, p.kind) for p in record.verify_distribution(site, "fakepkg", manifest, expected=expected)
    }


def test_absent_distribution_is_reported(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    problems = record.verify_distribution(
        tmp_path / "empty", "fakepkg", expected=wheel_record(make_dist(tmp_path / "w"))
    )
    assert [p.kind for p in problems] == ["no-dist"]


def test_hash_spellings_and_single_file_check(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    hex_digest = hashlib.sha256(b"abc").hexdigest()
    assert record.file_sha256(path) == hex_digest
    assert record.to_hex(record.record_hash(hex_digest)) == hex_digest
    assert record.to_hex("sha256:" + hex_digest.upper()) == hex_digest
    assert record.check_file(path, record.record_hash(hex_digest))
    assert not record.check_file(path, "0" * 64)
    assert not record.check_file(tmp_path / "missing", hex_digest)
    with pytest.raises(ValueError):
        record.to_hex("md5=xyz")


def test_command_line_exit_status_and_manifest(site: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    wheel = tmp_path / "wheel-RECORD"
    wheel.write_text(wheel_record(site))
    given = ["--expected-record", str(wheel)]
    assert record.main([str(site), "--dist", "fakepkg", *given]) == 0
    (site / "fakepkg" / "core.py").write_bytes(b"VALUE = 9\n")
    assert record.main([str(site), "--dist", "fakepkg", *given]) == 1
    assert "modified: fakepkg/core.py" in capsys.readouterr().err
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"files": {"fakepkg/core.py": hashlib.sha256(b"VALUE = 9\n").hexdigest()}}))
    assert record.main([str(site), "--dist", "fakepkg", "--replaced", str(manifest), *given]) == 0


def test_module_uses_the_standard_library_only() -> None:
    """A copy ships inside the image: it may import nothing outside the standard library."""
    tree = ast.parse(Path(record.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


# --- the installed RECORD is under check, never the expectation -------------------------------------
# Each attack edits fakepkg/core.py (or redirects it) and then covers its tracks in the installed
# files; the expectation is the wheel's RECORD as it was, so every one is reported.

EDITED = b"VALUE = 666\n"


def kinds(site: Path, expected: str) -> set[tuple[str, str]]:
    return {(p.kind, p.path) for p in record.verify_distribution(site, "fakepkg", expected=expected)}


def info(site: Path) -> Path:
    return site / "fakepkg-1.0.dist-info"


def test_deleted_record_is_a_failure_and_the_edit_is_still_named(site: Path, expected: str) -> None:
    (site / "fakepkg" / "core.py").write_bytes(EDITED)
    (info(site) / "RECORD").unlink()
    found = kinds(site, expected)
    assert ("record-missing", "fakepkg-1.0.dist-info/RECORD") in found
    assert ("size", "fakepkg/core.py") in found


def test_emptied_record_is_a_failure(site: Path, expected: str) -> None:
    (site / "fakepkg" / "core.py").write_bytes(EDITED)
    (info(site) / "RECORD").write_text("")
    found = kinds(site, expected)
    assert ("record-missing", "fakepkg-1.0.dist-info/RECORD") in found
    assert ("size", "fakepkg/core.py") in found


def test_a_row_rewritten_for_an_edited_module_is_a_failure(site: Path, expected: str) -> None:
    (site / "fakepkg" / "core.py").write_bytes(EDITED)
    rows = (info(site) / "RECORD").read_text().splitlines()
    forged = f"fakepkg/core.py,{record.record_hash(hashlib.sha256(EDITED).hexdigest())},{len(EDITED)}"
    (info(site) / "RECORD").write_text("\n".join(forged if r.startswith("fakepkg/core.py,") else r for r in rows))
    found = kinds(site, expected)
    assert ("size", "fakepkg/core.py") in found
    assert any(kind == "record-altered" for kind, _ in found)


def test_a_symlinked_directory_inside_the_package_is_reported(site: Path, expected: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "__init__.py").write_text("import os  # runs on import fakepkg.plugins\n")
    (site / "fakepkg" / "plugins").symlink_to(outside, target_is_directory=True)
    assert ("symlink", "fakepkg/plugins") in kinds(site, expected)


def test_a_recorded_module_replaced_by_a_symlink_is_reported(site: Path, expected: str, tmp_path: Path) -> None:
    copy = tmp_path / "core.py"  # the same bytes, elsewhere: what it points at can change later
    copy.write_bytes((site / "fakepkg" / "core.py").read_bytes())
    (site / "fakepkg" / "core.py").unlink()
    (site / "fakepkg" / "core.py").symlink_to(copy)
    assert ("symlink", "fakepkg/core.py") in kinds(site, expected)


def test_an_empty_directory_and_a_second_dist_info_are_reported(site: Path, expected: str) -> None:
    (site / "fakepkg" / "namespace").mkdir()  # import fakepkg.namespace works: a namespace package
    (site / "fakepkg-2.0.dist-info").mkdir()
    found = kinds(site, expected)
    assert ("unrecorded", "fakepkg/namespace") in found
    assert ("unrecorded", "fakepkg-2.0.dist-info") in found


def test_installer_rows_and_files_are_accepted(site: Path, expected: str) -> None:
    (info(site) / "INSTALLER").write_text("pip\n")
    (info(site) / "REQUESTED").write_text("")
    with open(info(site) / "RECORD", "a") as handle:
        handle.write(f"{info(site).name}/INSTALLER,sha256=x,4\n{info(site).name}/REQUESTED,,\n")
        handle.write("fakepkg/sub/__pycache__/data.cpython-311.pyc,,\n")
    assert record.verify_distribution(site, "fakepkg", expected=expected) == []


def test_a_reduced_install_is_checked_against_the_same_cut_of_the_wheel_record(site: Path, expected: str) -> None:
    """A stand-in base carries the .py files only; its RECORD and the expectation are cut alike."""
    rows = record.scoped_rows(record.parse_record(expected), (".py",))
    assert "fakepkg/sub/data.json" not in rows and "fakepkg/core.py" in rows
    (site / "fakepkg" / "sub" / "data.json").unlink()
    (site / "fakepkg" / "sub").rmdir()  # a stand-in never makes a directory it carries nothing in
    kept = [r for r in expected.splitlines() if not r.startswith("fakepkg/sub/data.json")]
    (info(site) / "RECORD").write_text("\n".join(kept) + "\n")
    assert record.verify_distribution(site, "fakepkg", expected=expected, suffixes=(".py",)) == []
    assert ("missing", "fakepkg/sub/data.json") in kinds(site, expected)
