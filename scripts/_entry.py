"""Runs one verb of the tool: ``python scripts/_entry.py VERB [ARGS...]`` (scripts/_launch.sh picks the interpreter)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def missing_dependency(exc: ModuleNotFoundError) -> bool:
    """Whether ``exc`` is one of the tool's installed dependencies missing (this interpreter has not had
    scripts/setup): the tool's own process imports only the standard library, itself and those."""
    top = (exc.name or "").partition(".")[0]
    return bool(top) and top not in sys.stdlib_module_names and top != "vllm_overlay"


def launch(verb: str, args: list[str]) -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:  # a verb imports its libraries only when it runs: the import of cli alone proves nothing
        from vllm_overlay.cli import main

        code = main([verb, *args])
    except ModuleNotFoundError as exc:
        if not missing_dependency(exc):
            raise
        print(
            f"{verb}: missing dependency '{exc.name}'. Run: {REPO / 'scripts' / 'setup'} "
            "(installs the tool into the checkout's .venv)",
            file=sys.stderr,
        )
        code = 2  # the environment, not the work: as an input error
    sys.exit(code)


if __name__ == "__main__":
    launch(sys.argv[1], sys.argv[2:])
