"""scripts/setup (README command 1's set-up) in a scratch checkout: what it does when venv is missing, reuse."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pip
import pytest

from tests.tool.helpers.repos import REPO_ROOT

# Nothing installs this: a pip install from this pyproject.toml fails, so a run that exits 0 installed nothing.
UNINSTALLABLE = '[project]\nname = "scratch"\nversion = "0"\ndependencies = ["no-such-distribution-vllm-overlay==0"]\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "scripts" / "setup", root / "scripts" / "setup")
    (root / "pyproject.toml").write_text(UNINSTALLABLE)
    return root


def fake_python(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "python3"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def setup(checkout: Path, python: Path | str = sys.executable, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_OVERLAY_PYTHON": str(python), "PIP_NO_INDEX": "1"}
    return subprocess.run(
        [str(checkout / "scripts" / "setup"), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_missing_venv_says_what_to_install_and_leaves_no_half_environment(checkout, tmp_path):
    """Debian's python3 without python3-venv: `-m venv` makes the directory, no pip, and fails."""
    python = fake_python(
        tmp_path,
        f'case "$1 $2" in "-c "*) exec {sys.executable} "$@";; "-m venv") '
        f'{sys.executable} -m venv --without-pip "$3"; echo "ensurepip is not available" >&2; exit 1;; esac; exit 1',
    )
    result = setup(checkout, python)
    assert result.returncode == 2, result.stderr
    assert "apt-get install python3-venv" in result.stderr
    assert not (checkout / ".venv").exists()


def test_an_interpreter_older_than_3_11_is_refused(checkout, tmp_path):
    python = fake_python(tmp_path, "exit 1")  # the version probe fails as it does on 3.10
    result = setup(checkout, python)
    assert result.returncode == 2
    assert "needs Python 3.11 or newer" in result.stderr


def test_a_venv_without_pip_is_made_again(checkout):
    """A .venv left half-made by an earlier failure is replaced, not reused."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")], check=True)
    marker = checkout / ".venv" / "left-from-before"
    marker.write_text("")
    result = setup(checkout)  # the scratch pyproject cannot be installed: pip's failure is the exit code
    assert result.returncode != 0
    assert not marker.exists()
    assert subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-m", "pip", "--version"]).returncode == 0


def test_an_installed_environment_is_reused_without_pip(checkout):
    # A venv that has pip: this interpreter's, through a .pth file (quicker than ensurepip).
    venv = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "pip-of-the-test.pth").write_text(str(Path(pip.__file__).resolve().parent.parent) + "\n")
    stamps = checkout / ".venv" / "vllm-overlay-setup"
    stamps.mkdir()
    shutil.copy2(checkout / "pyproject.toml", stamps / "pyproject.toml")
    before = (checkout / ".venv" / "pyvenv.cfg").stat().st_ino
    assert setup(checkout).returncode == 0  # nothing to install: pyproject.toml unchanged since the stamp
    assert (checkout / ".venv" / "pyvenv.cfg").stat().st_ino == before
    # --test wants the test extras, which no stamp records: it installs, and this pyproject.toml cannot be.
    assert setup(checkout, sys.executable, "--test").returncode != 0


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_says_what_it_does_and_exits_0_touching_nothing(checkout, flag):
    result = setup(checkout, sys.executable, flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: scripts/setup [--test | --help]\n") and "--test" in result.stdout
    assert "Exit codes" in result.stdout and result.stderr == ""
    assert not (checkout / ".venv").exists()


def test_an_unknown_option_is_the_usage_line_and_exit_2(checkout):
    result = setup(checkout, sys.executable, "--tset")
    assert (result.returncode, result.stderr, result.stdout) == (2, "usage: scripts/setup [--test | --help]\n", "")
    assert not (checkout / ".venv").exists()
