"""verify-install's command module: its flags, where it finds site-packages and the manifest, what it says.

The verification itself is cheap and runs for real over a synthetic site-packages (helpers.make_site:
a vllm 'wheel install' whose RECORD lists its files). Only the interpreter probe
(shadow.installed_package_dir, a subprocess of the interpreter --python names) is stood in for where
the test is about which interpreter the command asks, at the module attribute it is looked up by.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tool.helpers.cli import verb_help
from tests.tool.helpers.installs import make_site, seed_wheel_record, site_record
from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import cli
from vllm_overlay.env import record, shadow, wheel_record
from vllm_overlay.image import verify
from vllm_overlay.upstream import lock

OPTIONS = ("--project", "--site-packages", "--python", "--manifest", "--json", "--arch")


@pytest.fixture
def proj(project: Path) -> Path:
    """The fixture project with the repository's overlay/ (where vllm_overlay_status, the checker, lives)."""
    (project / "overlay").symlink_to(REPO_ROOT / "overlay")
    return project


@pytest.fixture
def site(tmp_path: Path, store_env: Path) -> Path:
    """The fake install; its wheel's RECORD in the cache as the lock's wheel (as if downloaded and checked)."""
    made = make_site(tmp_path / "site-packages")
    seed_wheel_record(store_env, lock.load(REPO_ROOT / "upstream.lock"), site_record(made))
    return made


def wheel_line(site: Path) -> str:
    """How the command names the expectation: the locked wheel for this machine and its RECORD's sha256."""
    name = wheel_record.wheel_for(lock.load(REPO_ROOT / "upstream.lock"))[0]
    return f"expected files: {name}'s RECORD, sha256 {record.text_sha256(site_record(site))[:16]}"


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("verify-install", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "Exit codes: 0 verified; 1 differences found" in text


def test_site_packages_and_python_together_are_refused_by_the_parser(capsys, tmp_path):
    for python in ("/usr/bin/python3", "python3"):  # python3 too: the default must not slip through
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["verify-install", "--site-packages", str(tmp_path), "--python", python])
        assert exit_info.value.code == 2
        assert "not allowed with argument" in capsys.readouterr().err


def test_a_pristine_site_packages_is_verified_against_the_lock(proj, site, capsys):
    assert cli.main(["verify-install", "--project", str(proj), "--site-packages", str(site)]) == 0
    captured = capsys.readouterr()
    assert (
        captured.err == f"verifying {site} (manifest: none found: expecting pristine vllm 0.33.0; {wheel_line(site)})\n"
    )
    assert captured.out.startswith(f"verified: vllm 0.33.0 in {site}: the files of vllm-0.33.0-")
    assert (
        "(its RECORD, checked against the lock) apart from 0 replaced file(s), which match the manifest ("
        in captured.out
    )


def test_a_changed_file_is_exit_1_and_each_difference_an_error_line(proj, site, capsys, tmp_path):
    (site / "vllm" / "core.py").write_text("value = 2\n")
    report = tmp_path / "out" / "verify.json"
    argv = ["verify-install", "--project", str(proj), "--site-packages", str(site), "--json", str(report)]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    problems = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(problems) == 1 and "vllm/core.py" in problems[0]
    assert captured.out.startswith(f"FAILED: 1 difference(s) in {site} (")
    data = json.loads(report.read_text())
    assert data == {
        "site_packages": str(site),
        "manifest": "none found: expecting pristine vllm 0.33.0",
        "ok": False,
        "problems": [problems[0].removeprefix("error: ")],
    }


def test_the_manifest_given_is_the_one_verified_against(proj, site, tmp_path, monkeypatch, capsys):
    given = tmp_path / "manifest.json"
    manifest = verify.pristine_manifest(lock.load(proj / "upstream.lock"))
    manifest["files"] = {"vllm/core.py": {"sha256": "0" * 64}}
    given.write_text(json.dumps(manifest))
    seen = []
    monkeypatch.setattr(
        verify, "verify_site_packages", lambda s, m, overlay, expected: seen.append((s, m, overlay, expected)) or []
    )
    argv = ["verify-install", "--project", str(proj), "--site-packages", str(site), "--manifest", str(given)]
    assert cli.main(argv) == 0
    assert seen == [(site, manifest, proj.resolve() / "overlay", site_record(site))]
    captured = capsys.readouterr()
    assert captured.err == f"verifying {site} (manifest: {given}; {wheel_line(site)})\n"
    assert "apart from 1 replaced file(s)" in captured.out


@pytest.mark.parametrize(
    "argv, python", [([], "python3"), (["--python", "/opt/py/bin/python3.11"], "/opt/py/bin/python3.11")]
)
def test_without_site_packages_the_interpreters_vllm_is_verified(proj, site, monkeypatch, argv, python):
    asked = []
    monkeypatch.setattr(shadow, "installed_package_dir", lambda py: asked.append(py) or site / "vllm")
    assert cli.main(["verify-install", "--project", str(proj), *argv]) == 0
    assert asked == [python]


def test_an_interpreter_without_vllm_is_exit_2_in_one_line(proj, tmp_path, capsys):
    """The real probe, of an 'interpreter' that finds no vllm (it prints an empty location)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho\n")
    python.chmod(0o755)
    assert cli.main(["verify-install", "--project", str(proj), "--python", str(python)]) == 2
    assert capsys.readouterr().err == f"error: {python} has no installed 'vllm' package\n"


@pytest.mark.parametrize("content", [None, "{not json"])
def test_a_manifest_missing_or_not_json_is_exit_2_in_one_line(proj, site, tmp_path, capsys, content):
    given = tmp_path / "manifest.json"
    if content is not None:
        given.write_text(content)
    argv = ["verify-install", "--project", str(proj), "--site-packages", str(site), "--manifest", str(given)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert "verifying" not in err


def test_a_project_without_a_lock_is_exit_2_in_one_line(tmp_path, site, capsys):
    assert cli.main(["verify-install", "--project", str(tmp_path), "--site-packages", str(site)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"


def test_an_edit_hidden_by_deleting_record_is_exit_1(proj, site, capsys):
    """The installed RECORD is checked, not believed: deleting it no longer makes every file pristine."""
    (site / "vllm" / "core.py").write_text("value = 666\n")
    (site / "vllm-0.33.0.dist-info" / "RECORD").unlink()
    assert cli.main(["verify-install", "--project", str(proj), "--site-packages", str(site)]) == 1
    err = capsys.readouterr().err
    assert "error: record-missing: vllm-0.33.0.dist-info/RECORD (the installed RECORD is gone)" in err
    assert "vllm/core.py" in err
