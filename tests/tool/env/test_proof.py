# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The environment's proof by file stat: unchanged files are not read again, any change is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tool.helpers.installs import make_site, site_record
from vllm_overlay.env import proof as envproof


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return make_site(tmp_path / "site-packages")


@pytest.fixture
def expected(site: Path) -> str:
    return site_record(site)


def test_a_second_check_reads_nothing_and_a_tampered_file_is_read_and_found(site, expected, tmp_path):
    proof = tmp_path / "cache" / "env.proof.json"
    problems, hashed = envproof.verify(site, "vllm", proof, expected)
    assert problems == [] and hashed == 4 and proof.is_file()  # three files and METADATA
    assert envproof.verify(site, "vllm", proof, expected) == ([], 0)

    # Same size, mtime put back: only the ctime (which nothing can set back) tells.
    core = site / "vllm" / "core.py"
    before = core.stat()
    core.write_bytes(b"value = 2\n")
    os.utime(core, ns=(before.st_atime_ns, before.st_mtime_ns))
    problems, hashed = envproof.verify(site, "vllm", proof, expected)
    assert [(p.kind, p.path) for p in problems] == [("modified", "vllm/core.py")] and hashed == 1
    assert not proof.exists()  # a failed check keeps no proof
    core.write_bytes(b"value = 1\n")
    assert envproof.verify(site, "vllm", proof, expected)[0] == []


def test_added_and_removed_files_are_found_with_a_proof(site, expected, tmp_path):
    proof = tmp_path / "env.proof.json"
    assert envproof.verify(site, "vllm", proof, expected)[0] == []
    (site / "vllm" / "added.py").write_text("x = 1\n")
    assert [(p.kind, p.path) for p in envproof.verify(site, "vllm", proof, expected)[0]] == [
        ("unrecorded", "vllm/added.py")
    ]
    (site / "vllm" / "added.py").unlink()
    assert envproof.verify(site, "vllm", proof, expected)[0] == []
    (site / "vllm" / "utils" / "math.py").unlink()
    assert [p.kind for p in envproof.verify(site, "vllm", proof, expected)[0]] == ["missing"]


def test_a_changed_record_is_a_full_check(site, expected, tmp_path):
    proof = tmp_path / "env.proof.json"
    assert envproof.verify(site, "vllm", proof, expected)[1] == 4
    record_file = next(site.glob("vllm-*.dist-info")) / "RECORD"
    record_file.write_text(record_file.read_text() + "\n")
    assert envproof.verify(site, "vllm", proof, expected) == ([], 4)


def test_a_proof_does_not_cover_a_record_rewritten_for_an_edited_file(site, expected, tmp_path):
    """The proof is bound to the installed RECORD too; the expectation stays the wheel's."""
    proof = tmp_path / "env.proof.json"
    assert envproof.verify(site, "vllm", proof, expected)[0] == []
    record_file = next(site.glob("vllm-*.dist-info")) / "RECORD"
    record_file.unlink()
    problems = envproof.verify(site, "vllm", proof, expected)[0]
    assert [p.kind for p in problems] == ["record-missing"]
