"""Shared launcher for scripts/: runs one verb in the checkout's environment, else in this interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"  # made by scripts/setup
SETUP_STAMP = VENV / "vllm-overlay-setup" / "pyproject.toml"  # written once the tool is installed there


def checkout_python() -> Path | None:
    """The checkout's environment's interpreter, when scripts/setup installed the tool there and it is not this one."""
    python = VENV / "bin" / "python"
    if not SETUP_STAMP.is_file() or not python.exists():
        return None
    if Path(sys.prefix).resolve() == VENV.resolve():
        return None
    return python


def launch(verb: str) -> None:
    python = checkout_python()
    if python is not None:
        # The system python3 of a PEP 668 distribution cannot hold the tool's dependencies: .venv does.
        os.execv(python, [str(python), sys.argv[0], *sys.argv[1:]])
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        from vllm_overlay.cli import main
    except ModuleNotFoundError as exc:  # a dependency of the tool is missing
        sys.exit(
            f"{Path(sys.argv[0]).name}: missing dependency '{exc.name}'. Run: {REPO / 'scripts' / 'setup'} "
            "(installs the tool into the checkout's .venv)"
        )
    sys.exit(main([verb, *sys.argv[1:]]))
