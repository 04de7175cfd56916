"""Check patches/ without applying anything.

Every patch parses (unidiff), is listed in series exactly once, carries the DEP-3 headers
(Description, Origin, Bug or Forwarded, Last-Update) and the project's (Series, Tests,
Upstream-Tests, Targets), touches only regular files inside the upstream tree (no absolute
paths, no '..', no symlinks or binary content), and every file named under Tests exists.
With --tree, paths are also resolved against that tree to catch symlinks leaving it.

Exit codes: 0 clean; 1 problems found.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_overlay import lint, output, project


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument("--tree", type=Path, default=None, help="upstream tree to resolve paths against")


def run(args: argparse.Namespace) -> int:
    proj = project.from_args(args)
    problems = lint.lint(proj.root, proj.patches, args.tree)
    for problem in problems:
        output.result(problem)
    if problems:
        output.error(f"{len(problems)} problem(s) in patches/")
        return 1
    output.info("patches/: no problems")
    return 0
