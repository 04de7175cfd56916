"""One module per verb: ``add_arguments`` (cheap: run for --help) and ``run`` (imports what the verb needs)."""

from __future__ import annotations

import argparse
import ast
import importlib.util


def docstring_of(module: str) -> str | None:
    """The docstring of ``module`` read from its source, without importing it (and all it imports)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        return ast.get_docstring(ast.parse(handle.read(), spec.origin), clean=False)


def add_line_upstream_argument(parser: argparse.ArgumentParser) -> None:
    """``--line-upstream``, for the verbs that check every carried line (audit-upstream, bump)."""
    parser.add_argument(
        "--line-upstream",
        action="append",
        default=[],
        metavar="LINE=VERSION|DIR|REPO@REV",
        help="check a carried line (cpu) on this upstream instead of its own lock's (repeatable)",
    )
