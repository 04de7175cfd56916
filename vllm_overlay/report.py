"""Human and machine renderings of an apply report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import atomicfile, output
from vllm_overlay.errors import InputError

if TYPE_CHECKING:  # the apply engine is imported by the verbs that apply, not by every start-up
    from vllm_overlay.apply.engine import Report


def apply_table(report: Report) -> str:
    up = report.upstream
    lines = [
        f"upstream: {up.label} ({up.kind}; release commit {up.release_commit or '?'}"
        + (f"; sdist sha256 {up.sha256}" if up.sha256 else "")
        + ")",
    ]
    width = max((len(r.name) for r in report.results), default=10)
    for result in report.results:
        mark = "ok " if result.accepted else "NO "
        lines.append(f"  {mark}{result.status:<17} {result.name:<{width}}")
        if result.detail and result.status.value != "clean":
            lines.append(f"      {result.detail}")
        lines.extend(f"      {note}" for note in result.hunks)
        lines.extend(f"      warning: {warning}" for warning in result.warnings)
    accepted = sum(r.accepted for r in report.results)
    if report.unchanged:
        lines.append(
            f"{accepted}/{len(report.results)} patches applied; patched tree: {report.output} (unchanged: same lock, "
            "upstream and patch bytes as when it was published, and untouched since; nothing rebuilt)"
        )
    elif report.published:
        lines.append(f"{accepted}/{len(report.results)} patches applied; patched tree: {report.output}")
    else:
        lines.append(
            f"{accepted}/{len(report.results)} patches accepted; nothing written to {report.output} "
            "(see the statuses above; --allow-offset, --allow-fuzz and --3way widen what is accepted)"
        )
    return "\n".join(lines)


class ReportPathError(InputError, ValueError):
    """A report file (--json, --junit, --markdown, ...) cannot be written where it was asked for."""


def check_destinations(**paths: Path | None) -> None:
    """Prove, before the long work starts, that every report path given can be written.

    ``paths`` maps an option name (``json``) to its value. A probe file is created and removed
    beside each one, so a missing, read-only or non-directory parent is found now, not after an
    hour of tests. Raises ReportPathError naming the option and the reason.
    """
    for option, path in paths.items():
        if path is None:
            continue
        flag = "--" + option.replace("_", "-")
        if path.is_dir():
            raise ReportPathError(f"{flag} {path}: is a directory; name a file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, probe = atomicfile.create_temp(path.parent, f".{path.name}.", ".probe")
            os.close(fd)
            probe.unlink()
        except OSError as exc:
            raise ReportPathError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None


def write_json(data: object, path: Path) -> None:
    """Write JSON atomically so a reader never sees half a report."""
    try:
        text = output.redact_credentials(json.dumps(data, indent=2, sort_keys=True) + "\n")
        atomicfile.write_bytes(path, text.encode("utf-8"))
    except OSError as exc:
        raise ReportPathError(f"--json {path}: cannot write there ({exc.strerror or exc})") from None
