"""The stand-in bases: the mirror from the machine's apt sources, the vllm .py files with their RECORD."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


def test_stand_in_mirror_comes_from_the_machines_apt_sources(tmp_path: Path) -> None:
    from vllm_overlay.image import engine, standins

    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://archive.example.invalid/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://archive.example.invalid/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n"
    )
    assert standins.apt_mirror(apt) == "http://archive.example.invalid/debian"
    (apt / "sources.list").write_text(
        "# deb http://old.example.invalid/debian bookworm main\n"
        "deb [signed-by=/k.gpg] http://one-line.example.invalid/debian bookworm main\n"
    )
    assert standins.apt_mirror(apt) == "http://one-line.example.invalid/debian"  # sources.list comes first
    empty = tmp_path / "empty"
    (empty / "sources.list.d").mkdir(parents=True)
    with pytest.raises(engine.EngineError, match="--mirror"):
        standins.apt_mirror(empty)


def test_stand_in_carries_the_py_files_with_a_record_of_exactly_them(tmp_path: Path) -> None:
    from vllm_overlay.env import record
    from vllm_overlay.image import standins

    site = tmp_path / "site"
    files = {"vllm/__init__.py": b"", "vllm/envs.py": b"X = 1\n", "vllm/_C.abi3.so": b"\0" * 64}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    info = site / "vllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    rows = [
        f"{p.relative_to(site).as_posix()},{record.record_hash(hashlib.sha256(p.read_bytes()).hexdigest())},"
        f"{p.stat().st_size}"
        for p in sorted(site.rglob("*"))
        if p.is_file()
    ]
    (info / "RECORD").write_text("\n".join([*rows, "../../bin/vllm,sha256=x,1", f"{info.name}/RECORD,,"]) + "\n")
    wheel = (info / "RECORD").read_text()  # the wheel's RECORD: the expectation
    assert record.verify_distribution(site, "vllm", expected=wheel) == []

    target = tmp_path / "standin"
    count, size = standins.carry_files(site, info, target)
    assert count == 3 and size == len(b"X = 1\n") + len(info.joinpath("METADATA").read_bytes())
    assert not (target / "vllm" / "_C.abi3.so").exists() and not (target / "bin").exists()
    scope = tuple(standins.STANDIN_SCOPE.split(","))
    # The stand-in is the wheel's RECORD cut as the build's VLLM_RECORD_SCOPE cuts it; uncut, the .so is missing.
    assert record.verify_distribution(target, "vllm", expected=wheel, suffixes=scope) == []
    assert [(p.kind, p.path) for p in record.verify_distribution(target, "vllm", expected=wheel)] == [
        ("record-altered", "vllm-9.9.9.dist-info/RECORD"),
        ("missing", "vllm/_C.abi3.so"),
    ]
    (target / "vllm" / "envs.py").write_text("X = 2\n")
    problems = record.verify_distribution(target, "vllm", expected=wheel, suffixes=scope)
    assert [p.path for p in problems] == ["vllm/envs.py"]
