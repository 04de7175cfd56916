"""Runs one verb of the tool: ``python scripts/_entry.py VERB [ARGS...]`` (scripts/_launch.sh picks the interpreter)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launch(verb: str, args: list[str]) -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        from vllm_overlay.cli import main
    except ModuleNotFoundError as exc:  # a dependency of the tool is missing
        sys.exit(
            f"{verb}: missing dependency '{exc.name}'. Run: {REPO / 'scripts' / 'setup'} "
            "(installs the tool into the checkout's .venv)"
        )
    sys.exit(main([verb, *args]))


if __name__ == "__main__":
    launch(sys.argv[1], sys.argv[2:])
