"""README's index of the patches: one row per patch, written from the patches' own trailers.

A table kept by hand goes stale the first time a patch is refreshed, dropped or forwarded, so the
rows between the two marker lines are generated: the name from patches/series, the one-line
summary from ``Description:``, and where the patch stands upstream from ``Forwarded:``, ``Bug:``
and ``Applied-Upstream:``. lint-patches compares them with what the patches say and names every
stale row; ``lint-patches --write-readme-index`` writes them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from vllm_overlay import atomicfile
from vllm_overlay.errors import InputError
from vllm_overlay.series import FORWARDED_NOT_RE, Patch

README_NAME = "README.md"
BEGIN = "<!-- patch index: written from patches/ by scripts/lint-patches --write-readme-index; edit the patches -->"
END = "<!-- end of the patch index -->"
HEADER = ("| patch | what it fixes | forwarded / bug | drop when |", "|---|---|---|---|")
REWRITE = "scripts/lint-patches --write-readme-index rewrites it"


def _cell(text: str) -> str:
    """``text`` as one table cell: on one line, its pipes escaped so they do not split the row."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _upstream(patch: Patch) -> tuple[str, str]:
    """Where the patch stands upstream, and when it can go: from Forwarded, Bug and Applied-Upstream."""
    stands: list[str] = []
    drop: list[str] = []
    for value in patch.values("Forwarded"):
        not_forwarded = FORWARDED_NOT_RE.match(value)
        if not_forwarded:
            stands.append(f"not forwarded: {not_forwarded['reason']}")
            drop.append(not_forwarded["drop"])
        else:
            stands.append(f"forwarded: {value}")
            drop.append(f"upstream releases {value}")
    stands.extend(f"bug: {value}" for value in patch.values("Bug"))
    applied = patch.values("Applied-Upstream")
    if applied:
        drop = [f"applied upstream in {', '.join(applied)}: drop on moving there"]
    return "; ".join(stands), "; ".join(drop)


def index_lines(patches: Sequence[Patch]) -> list[str]:
    """The index as README holds it between the markers: the header, then one row per patch in series order."""
    rows = []
    for patch in patches:
        stands, drop = _upstream(patch)
        name = patch.name.removesuffix(".patch")
        rows.append(f"| `{name}` | {_cell(patch.value('Description') or '')} | {_cell(stands)} | {_cell(drop)} |")
    return [*HEADER, *rows]


def _span(lines: list[str]) -> tuple[int, int] | None:
    """Index of the BEGIN and END marker lines, or None where README lacks either (or has them reversed)."""
    if BEGIN not in lines or END not in lines:
        return None
    begin, end = lines.index(BEGIN), lines.index(END)
    return (begin, end) if begin < end else None


def problems(readme: Path, patches: Sequence[Patch]) -> list[str]:
    """How README's index differs from what ``patches`` say, one line per stale row (empty: it matches).

    A project without a README has no index to keep; a README without the markers is reported,
    as an index removed by mistake would otherwise never be checked again.
    """
    if not readme.is_file():
        return []
    lines = readme.read_text(encoding="utf-8").splitlines()
    span = _span(lines)
    if span is None:
        return [f"{readme.name}: no patch index (the lines {BEGIN!r} ... {END!r}); {REWRITE} after adding them"]
    begin, end = span
    held, expected = lines[begin + 1 : end], index_lines(patches)
    found = []
    matcher = difflib.SequenceMatcher(a=held, b=expected, autojunk=False)
    for tag, held_from, held_to, expected_from, expected_to in matcher.get_opcodes():
        if tag == "equal":
            continue
        stale, wanted = held[held_from:held_to], expected[expected_from:expected_to]
        for offset, line in enumerate(stale):
            number = begin + 2 + held_from + offset
            instead = f"; the patches say {wanted[offset]!r}" if offset < len(wanted) else "; no patch says it"
            found.append(f"{readme.name}:{number}: patch index row {line!r} is stale{instead} ({REWRITE})")
        for line in wanted[len(stale) :]:
            number = begin + 2 + held_to
            found.append(f"{readme.name}:{number}: patch index lacks the row {line!r} ({REWRITE})")
    return found


def write(readme: Path, patches: Sequence[Patch]) -> bool:
    """Write the index between README's markers; whether that changed the file (InputError: no markers)."""
    text = readme.read_text(encoding="utf-8")
    lines = text.splitlines()
    span = _span(lines)
    if span is None:
        raise InputError(f"{readme}: no patch index markers: add the lines {BEGIN!r} and {END!r} where it goes")
    begin, end = span
    new_lines = [*lines[: begin + 1], *index_lines(patches), *lines[end:]]
    new_text = "\n".join(new_lines) + ("\n" if text.endswith("\n") else "")
    if new_text == text:
        return False
    atomicfile.write_bytes(readme, new_text.encode("utf-8"))
    return True
