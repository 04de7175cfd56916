"""The commands in scripts/: each starts one interpreter, the checkout's environment's, else python3."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay.cli import VERBS

SCRIPTS = REPO_ROOT / "scripts"
LAUNCHED = sorted(p.name for p in SCRIPTS.iterdir() if '. "$here/_launch.sh"' in p.read_text())


def recording_python(path: Path, record: Path) -> Path:
    """An interpreter stand-in that writes how it was started (its path, then one argument a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > "{record}"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("_launch.sh", "lint-patches"):
        shutil.copy2(SCRIPTS / name, root / "scripts" / name)
    return root


def run(command: list[str], path: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def test_the_checkouts_environment_runs_the_verb_where_setup_installed_the_tool(checkout, tmp_path):
    record = tmp_path / "started"
    venv_python = recording_python(checkout / ".venv" / "bin" / "python", record)
    (checkout / ".venv" / "vllm-overlay-setup").mkdir()
    (checkout / ".venv" / "vllm-overlay-setup" / "pyproject.toml").write_text("")
    on_path = recording_python(tmp_path / "bin" / "python3", tmp_path / "python3-started")
    done = run([str(checkout / "scripts" / "lint-patches"), "--tree", "a b"], f"{on_path.parent}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    started = record.read_text().splitlines()
    assert Path(started[0]).resolve() == venv_python
    assert Path(started[1]) == checkout / "scripts" / "_entry.py"
    assert started[2:] == ["lint-patches", "--tree", "a b"]
    assert not (tmp_path / "python3-started").exists()  # one interpreter, not python3 that re-executes


def test_without_an_installed_environment_python3_runs_it(checkout, tmp_path):
    """A .venv that scripts/setup did not finish (no stamp) is not used."""
    recording_python(checkout / ".venv" / "bin" / "python", tmp_path / "venv-started")
    on_path = recording_python(tmp_path / "bin" / "python3", tmp_path / "started")
    done = run(["sh", "lint-patches", "--help"], f"{on_path.parent}:{os.environ['PATH']}", cwd=checkout / "scripts")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "started").read_text().splitlines()[1:] == ["./_entry.py", "lint-patches", "--help"]
    assert not (tmp_path / "venv-started").exists()


def test_no_python3_is_one_clear_line_and_exit_2(checkout, tmp_path):
    (tmp_path / "empty").mkdir()
    done = run([str(checkout / "scripts" / "lint-patches")], str(tmp_path / "empty"))
    assert done.returncode == 2
    assert done.stderr == (
        "lint-patches: no python3 on PATH: the tool needs Python 3.11 or newer (then run scripts/setup)\n"
    )


@pytest.mark.parametrize("name", LAUNCHED)
def test_every_command_runs_its_own_verb(name):
    done = subprocess.run([str(SCRIPTS / name), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: vllm-overlay {name} ")


def test_every_verb_has_its_command_and_every_command_but_the_shell_ones_is_launched():
    shell = {"_launch.sh", "_entry.py", "check", "setup"}
    assert sorted(p.name for p in SCRIPTS.iterdir() if p.name not in shell) == LAUNCHED
    assert LAUNCHED == sorted(VERBS)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """An interpreter of this Python's version with none of the tool's dependencies: before scripts/setup."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import unidiff"], capture_output=True).returncode != 0
    return python


@pytest.mark.parametrize("verb", ["lint-patches", "cache", "test-patches"])
def test_a_verb_run_before_setup_says_in_one_line_to_run_it(bare_python, tmp_path, verb):
    done = subprocess.run(
        [str(bare_python), str(SCRIPTS / "_entry.py"), verb, "--project", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"{verb}: missing dependency '") and len(done.stderr.splitlines()) == 1
    assert f"Run: {SCRIPTS / 'setup'} " in done.stderr and done.stdout == ""


def test_its_help_needs_no_dependency(bare_python):
    done = subprocess.run(
        [str(bare_python), str(SCRIPTS / "_entry.py"), "lint-patches", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: vllm-overlay lint-patches ")


def test_a_missing_module_that_is_no_dependency_is_not_blamed_on_setup(monkeypatch):
    sys.path.insert(0, str(SCRIPTS))
    try:
        import _entry
    finally:
        sys.path.remove(str(SCRIPTS))
    assert _entry.missing_dependency(ModuleNotFoundError(name="unidiff"))
    assert _entry.missing_dependency(ModuleNotFoundError(name="git.exc"))
    assert not _entry.missing_dependency(ModuleNotFoundError(name="vllm_overlay.no_such_module"))
    assert not _entry.missing_dependency(ModuleNotFoundError(name="tomllib"))
    assert not _entry.missing_dependency(ModuleNotFoundError())
