"""Where the project's files are: the repository root and the fixed layout inside it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.upstream.lock import LOCK_NAME

DEFAULT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Project:
    root: Path

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def overlay(self) -> Path:
        return self.root / "overlay"

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def patched_tree(self) -> Path:
        return self.build / "patched"


def add_project_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--project",
        type=Path,
        default=DEFAULT_ROOT,
        help="project checkout holding upstream.lock and patches/ (default: this checkout)",
    )


def from_args(args: argparse.Namespace) -> Project:
    return Project(args.project.resolve())
