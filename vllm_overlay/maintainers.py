"""Who carries each series: ``maintainers.toml``, the identity its patches are authored and signed off by.

vLLM takes a commit only with a ``Signed-off-by:`` line (the Developer Certificate of Origin), so
a carried patch that can go upstream as it is names a real author and signs off as them. Which
identity that is belongs to the project, not to whoever last ran git: one file at the repository
root names a default maintainer for every series and, where someone else carries a series, an
override for it. lint-patches checks every patch's ``From:`` and sign-off against it.

    default = "Name <email>"

    [series]
    route-sanitization = "Other Name <other@example.org>"
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay.errors import InputError

MAINTAINERS_FILE = "maintainers.toml"
DEFAULT_KEY = "default"
SERIES_KEY = "series"
# An identity as git writes one in From: and Signed-off-by: a name (no angle brackets, no blanks at
# either end) and an e-mail address in angle brackets.
IDENTITY_RE = re.compile(r"^[^<>\s](?:[^<>\n]*[^<>\s])? <[^<>\s@]+@[^<>\s@]+>$")
EXAMPLE = '"Ada Lovelace <ada@example.org>"'


class MaintainersError(InputError, ValueError):
    """maintainers.toml is missing, not TOML, or names something that is not an identity or a series."""


@dataclass(frozen=True)
class Maintainers:
    """The default maintainer and the series carried by someone else."""

    default: str
    overrides: Mapping[str, str] = field(default_factory=dict)

    def of(self, series: str) -> str:
        """The identity that authors and signs off the patches of ``series``."""
        return self.overrides.get(series, self.default)


def load(path: Path, series: Collection[str] | None = None) -> Maintainers:
    """Read ``path``; an override must name one of ``series`` (None: not checked).

    Every problem is a MaintainersError naming the file and what to write instead.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MaintainersError(
            f"{path}: not found: it names who authors and signs off each series' patches; write "
            f"`{DEFAULT_KEY} = {EXAMPLE}` there (README.md, Patch format)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MaintainersError(f"{path}: cannot be read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MaintainersError(f"{path}: not valid TOML ({exc}): correct it") from None
    unknown = sorted(set(data) - {DEFAULT_KEY, SERIES_KEY})
    if unknown:
        raise MaintainersError(
            f"{path}: unknown key {unknown[0]!r}: the file holds `{DEFAULT_KEY} = ...` and a [{SERIES_KEY}] table"
        )
    if DEFAULT_KEY not in data:
        raise MaintainersError(f"{path}: no default maintainer: write `{DEFAULT_KEY} = {EXAMPLE}` at its top")
    default = _identity(path, DEFAULT_KEY, data[DEFAULT_KEY])
    table = data.get(SERIES_KEY, {})
    if not isinstance(table, dict):
        raise MaintainersError(f"{path}: {SERIES_KEY} must be a table: [{SERIES_KEY}], then `name = {EXAMPLE}` lines")
    overrides = {name: _identity(path, f"[{SERIES_KEY}] {name}", value) for name, value in table.items()}
    if series is not None:
        for name in overrides:
            if name not in series:
                known = ", ".join(sorted(series)) or "none"
                raise MaintainersError(
                    f"{path}: [{SERIES_KEY}] {name!r} is no series of patches/series (its series: {known}): "
                    "correct the name or remove the line"
                )
    return Maintainers(default, overrides)


def _identity(path: Path, where: str, value: object) -> str:
    if not isinstance(value, str) or not IDENTITY_RE.match(value):
        raise MaintainersError(
            f'{path}: {where} = {value!r} is not an identity as git writes one: write "Name <email>", e.g. {EXAMPLE}'
        )
    return value
