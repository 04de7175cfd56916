"""One module per verb: ``add_arguments`` (cheap: run for --help) and ``run`` (imports what the verb needs)."""

from __future__ import annotations

import ast
import importlib.util


def docstring_of(module: str) -> str | None:
    """The docstring of ``module`` read from its source, without importing it (and all it imports)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        return ast.get_docstring(ast.parse(handle.read(), spec.origin), clean=False)
