"""RECORD verification on tiny fake distributions (no vLLM)."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

import pytest

from vllm_overlay import record

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


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return make_dist(tmp_path / "site-packages")


def test_pristine_distribution_has_no_problems(site: Path) -> None:
    assert record.verify_distribution(site, "fakepkg") == []


def test_modified_missing_and_resized_files_are_named(site: Path) -> None:
    (site / "fakepkg" / "core.py").write_bytes(b"VALUE = 2\n")  # same size, other bytes
    (site / "fakepkg" / "sub" / "data.json").write_bytes(b"{}\n")
    (site / "fakepkg" / "__init__.py").unlink()
    problems = {(p.path, p.kind) for p in record.verify_distribution(site, "fakepkg")}
    assert problems == {
        ("fakepkg/core.py", "modified"),
        ("fakepkg/sub/data.json", "size"),
        ("fakepkg/__init__.py", "missing"),
    }


def test_unrecorded_module_is_a_problem_but_bytecode_caches_are_not(site: Path) -> None:
    (site / "fakepkg" / "extra.py").write_text("import os\n")
    (site / "fakepkg" / "sub" / "__pycache__").mkdir()
    (site / "fakepkg" / "sub" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"x")
    problems = record.verify_distribution(site, "fakepkg")
    assert [(p.path, p.kind) for p in problems] == [("fakepkg/extra.py", "unrecorded")]
    assert record.verify_distribution(site, "fakepkg", check_unrecorded=False) == []


def test_replaced_files_must_match_the_manifest_instead_of_record(site: Path) -> None:
    new = b"VALUE = 42\n"
    (site / "fakepkg" / "core.py").write_bytes(new)
    (site / "fakepkg" / "added.py").write_bytes(b"ADDED = 1\n")
    manifest = {
        "fakepkg/core.py": hashlib.sha256(new).hexdigest(),
        "fakepkg/added.py": record.record_hash(hashlib.sha256(b"ADDED = 1\n").hexdigest()),
    }
    assert record.verify_distribution(site, "fakepkg", manifest) == []
    (site / "fakepkg" / "core.py").write_bytes(b"VALUE = 43\n")
    kinds = [(p.path, p.kind) for p in record.verify_distribution(site, "fakepkg", manifest)]
    assert kinds == [("fakepkg/core.py", "replaced-mismatch")]
    (site / "fakepkg" / "added.py").unlink()
    assert ("fakepkg/added.py", "replaced-missing") in {
        (p.path, p.kind) for p in record.verify_distribution(site, "fakepkg", manifest)
    }


def test_absent_distribution_is_reported(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    problems = record.verify_distribution(tmp_path / "empty", "fakepkg")
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
    assert record.main([str(site), "--dist", "fakepkg"]) == 0
    (site / "fakepkg" / "core.py").write_bytes(b"VALUE = 9\n")
    assert record.main([str(site), "--dist", "fakepkg"]) == 1
    assert "modified: fakepkg/core.py" in capsys.readouterr().err
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"files": {"fakepkg/core.py": hashlib.sha256(b"VALUE = 9\n").hexdigest()}}))
    assert record.main([str(site), "--dist", "fakepkg", "--replaced", str(manifest)]) == 0


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
