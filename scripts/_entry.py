"""Shared launcher for scripts/: makes the repository's package importable and runs one verb."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launch(verb: str) -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        from vllm_overlay.cli import main
    except ModuleNotFoundError as exc:  # a dependency of the tool is missing
        sys.exit(f"{Path(sys.argv[0]).name}: missing dependency '{exc.name}'. Run: python3 -m pip install -e {REPO}")
    sys.exit(main([verb, *sys.argv[1:]]))
