"""The shadow package: patched files over an installed vllm, the installation never touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.tool.helpers.installs import make_installed
from vllm_overlay.env import shadow


def test_shadow_same_file_set_and_untouched_install(tmp_path: Path) -> None:
    installed = make_installed(tmp_path / "site")
    new_b = tmp_path / "b.py"
    new_b.write_text("B = 'patched'\n")
    added = tmp_path / "new.py"
    added.write_text("N = 1\n")
    before = {p: p.read_bytes() for p in installed.rglob("*") if p.is_file()}
    dest = shadow.build_shadow(
        installed, {"vllm/sub/b.py": new_b, "vllm/sub/deep/new.py": added}, ["vllm/gone.py"], tmp_path / "shadow"
    )
    shadow_pkg = dest / "vllm"
    # Same file set as a full per-file symlink farm would have, minus the deleted file, plus the added one.
    listed = {p.relative_to(shadow_pkg).as_posix() for p in shadow_pkg.rglob("*") if p.is_file()}
    listed = {p for p in listed if "__pycache__" not in p}
    assert listed == {"__init__.py", "a.py", "lib.so", "sub/__init__.py", "sub/b.py", "sub/c.py",
                      "sub/deep/__init__.py", "sub/deep/new.py"}  # fmt: skip
    assert (shadow_pkg / "sub" / "b.py").read_text() == "B = 'patched'\n"
    assert not (shadow_pkg / "sub" / "b.py").is_symlink()
    assert (shadow_pkg / "a.py").is_symlink() and (shadow_pkg / "sub" / "deep").is_dir()
    # Untouched modules keep their bytecode, replaced or deleted ones do not.
    pycache = sorted(p.name for p in (shadow_pkg / "sub" / "__pycache__").iterdir())
    assert "b.cpython-311.pyc" not in pycache and "c.cpython-311.pyc" in pycache
    assert "gone.cpython-311.pyc" not in {p.name for p in (shadow_pkg / "__pycache__").iterdir()}
    out = subprocess.run(
        [sys.executable, "-c", "import vllm.sub.b as b, vllm.sub.c as c, vllm.sub.deep.new as n; print(b.B, c.C, n.N)"],
        env=dict(os.environ, PYTHONPATH=str(dest), PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["patched", "installed", "1"]
    assert {p: p.read_bytes() for p in installed.rglob("*") if p.is_file()} == before
