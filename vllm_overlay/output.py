"""All user-facing messages go through here: one place decides stream and format."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

# scheme://user:secret@ or scheme://token@ in any URL of a message (an index URL with credentials).
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*)(?P<password>:[^/@\s]*)?@")


def redact_credentials(text: str) -> str:
    """``text`` with the secrets of every URL in it masked as pip masks them.

    ``https://user:token@host/`` becomes ``https://user:****@host/`` and ``https://token@host/``
    becomes ``https://****@host/``: the host stays readable, the secret never reaches a terminal,
    a CI log or a report.
    """

    def mask(match: re.Match[str]) -> str:
        if match.group("password") is not None:
            return f"{match.group('scheme')}{match.group('user')}:****@"
        return f"{match.group('scheme')}****@"

    return _URL_CREDENTIALS.sub(mask, text)


def info(message: str) -> None:
    print(redact_credentials(message), file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"warning: {redact_credentials(message)}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    print(f"error: {redact_credentials(message)}", file=sys.stderr, flush=True)


def result(message: str) -> None:
    """Results (reports, tables) go to stdout so they can be piped."""
    print(redact_credentials(message), flush=True)


def waiting_for(path: Path) -> Callable[[int | None], None]:
    """An ``on_wait`` for a lock on ``path``: says whose run the command waits for."""
    return lambda pid: info(
        f"waiting for {'pid ' + str(pid) if pid else 'another process'}, which is writing {path} "
        "(--no-wait to give up instead)"
    )
