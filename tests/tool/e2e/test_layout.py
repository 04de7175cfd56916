"""e2e.layout: the image's checks as commands, and a pristine runtime that is not pristine is never laid over.

Laying a staged series over a real CPU runtime (and running vllm_overlay_status in it) needs that
runtime; test_cpu_runtime.py proves the hard-link rule of ``_replace``, and the end-to-end suite the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tool.helpers.images import bare_build_context
from tests.tool.helpers.installs import fake_wheel_record, make_site
from vllm_overlay.e2e import layout
from vllm_overlay.env import record, testenv
from vllm_overlay.errors import InputError
from vllm_overlay.image import build_context


def _context(root: Path) -> build_context.BuildContext:
    """A staged context's manifest and the wheel RECORD it carries (the fake install's, helpers.make_site)."""
    wheel = root / "overlay" / build_context.STATUS_PACKAGE / build_context.WHEEL_RECORD
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_text(fake_wheel_record())
    stated = {"sha256": record.text_sha256(fake_wheel_record())}
    return bare_build_context(root, {"upstream": {"version": "0.33.0"}, "expected_record": stated})


def test_status_commands_are_the_dockerfiles_compile_then_verify(tmp_path: Path) -> None:
    python, site = Path("/rt/bin/python"), Path("/rt/lib/python3.11/site-packages")
    module = [str(python), "-m", build_context.STATUS_PACKAGE]
    assert layout.status_commands(python, site, _context(tmp_path)) == [
        [*module, "compile", "--site-packages", str(site)],
        [
            *module,
            "verify",
            "--site-packages",
            str(site),
            "--expect",
            f"series_sha256={'ab' * 32}",
            "--expect",
            "upstream_version=0.33.0",
        ],
    ]


def _pristine(root: Path) -> testenv.Env:
    site = make_site(root / "lib" / "site-packages")
    return testenv.Env(path=root, python=root / "bin" / "python", site_packages=site, key=None, managed=False)


def test_a_runtime_that_is_not_pristine_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    pristine = _pristine(tmp_path / "runtime")
    (pristine.site_packages / "vllm" / "core.py").write_text("value = 2\n")  # someone edited the installed vllm
    dest = tmp_path / "out" / "patched-runtime"
    with pytest.raises(layout.LayoutError) as caught:
        layout.lay_out(pristine, "vllm", _context(tmp_path / "ctx"), dest)
    message = str(caught.value)
    assert message.startswith(f"{pristine.path}: the installed vllm is not pristine per its RECORD (")
    assert "vllm/core.py" in message and message.endswith("; it is not laid over")
    assert not (tmp_path / "out").exists()
    assert issubclass(layout.LayoutError, InputError)


def test_a_runtime_whose_record_was_deleted_is_refused(tmp_path: Path) -> None:
    """The edit hidden by deleting RECORD: the staged wheel RECORD, not the installed one, is the expectation."""
    pristine = _pristine(tmp_path / "runtime")
    (pristine.site_packages / "vllm" / "core.py").write_text("value = 2\n")
    next(pristine.site_packages.glob("vllm-*.dist-info")).joinpath("RECORD").unlink()
    with pytest.raises(layout.LayoutError, match=r"record-missing: vllm-0\.33\.0\.dist-info/RECORD"):
        layout.lay_out(pristine, "vllm", _context(tmp_path / "ctx"), tmp_path / "out" / "patched-runtime")


def test_replace_writes_a_new_file_over_a_symlink(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine.py"
    pristine.write_text("pristine\n")
    target = tmp_path / "copy" / "deep" / "mod.py"
    target.parent.mkdir(parents=True)
    target.symlink_to(pristine)
    shipped = tmp_path / "shipped.py"
    shipped.write_text("patched\n")
    os.utime(shipped, (1_000_000, 1_000_000))
    layout._replace(shipped, target)
    assert not target.is_symlink() and target.read_text() == "patched\n"
    assert pristine.read_text() == "pristine\n"
    assert target.stat().st_mtime == 1_000_000  # copied with its times, as COPY keeps them
    layout._replace(shipped, tmp_path / "new" / "dir" / "file.py")  # a missing folder is made
    assert (tmp_path / "new" / "dir" / "file.py").read_text() == "patched\n"
