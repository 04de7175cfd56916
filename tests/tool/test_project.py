"""project: the project's fixed layout and the --project option."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import project
from vllm_overlay.upstream.lock import LOCK_NAME


def test_layout_under_the_root(tmp_path: Path) -> None:
    proj = project.Project(tmp_path)
    assert proj.lock_file == tmp_path / LOCK_NAME == tmp_path / "upstream.lock"
    assert proj.patches == tmp_path / "patches"
    assert proj.overlay == tmp_path / "overlay"
    assert proj.build == tmp_path / "build"
    assert proj.patched_tree == tmp_path / "build" / "patched"


def test_a_project_is_a_frozen_value(tmp_path: Path) -> None:
    proj = project.Project(tmp_path)
    assert proj == project.Project(tmp_path) and hash(proj) == hash(project.Project(tmp_path))
    with pytest.raises(AttributeError):
        proj.root = tmp_path / "other"  # type: ignore[misc]


def test_the_default_root_is_this_checkout() -> None:
    assert project.DEFAULT_ROOT == REPO_ROOT
    assert project.Project(project.DEFAULT_ROOT).lock_file.is_file()
    assert project.Project(project.DEFAULT_ROOT).patches.joinpath("series").is_file()


def test_project_argument_defaults_to_the_checkout_and_resolves(tmp_path: Path, monkeypatch) -> None:
    parser = argparse.ArgumentParser()
    project.add_project_argument(parser)
    assert project.from_args(parser.parse_args([])) == project.Project(REPO_ROOT)
    (tmp_path / "p").mkdir()
    monkeypatch.chdir(tmp_path)
    os.symlink("p", tmp_path / "link")
    given = project.from_args(parser.parse_args(["--project", "link/../link"]))
    assert given.root == (tmp_path / "p").resolve() and given.root.is_absolute()
    assert "--project" in parser.format_help() and "upstream.lock" in parser.format_help()
