"""The upstream lines the project carries the series on, and whether each already has a patch's fix.

The project carries its series on more than one upstream line: the locked release (upstream.lock,
patches/) and the CPU carry (cpu/upstream.lock, cpu/patches/), which is carried from patches/. A
patch may leave patches/ only when every line that carries it has the fix upstream: a release
that has it on the locked line but not on the CPU line still needs the patch for the CPU carry.
Each line's answer comes from a real apply of that line's own series onto that line's upstream
(the engine's reverse-apply check: ``already-upstream``), never from a version comparison.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import series
from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import run as apply_run
from vllm_overlay.errors import InputError
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock as lockfile
from vllm_overlay.upstream import trees as upstream_trees
from vllm_overlay.upstream.lock import Lock

LOCKED = "locked"
CPU = "cpu"
CPU_DIR = "cpu"  # vllm_overlay.cpu.carry.CARRY_DIR: the carry's lock and patches live there


@dataclass(frozen=True)
class CarriedLine:
    """One upstream line the project carries: its name, its lock and the series carried on it."""

    name: str
    lock_file: Path
    patches_dir: Path


def carried_lines(root: Path) -> list[CarriedLine]:
    """The locked line, then the CPU carry where the project has one (cpu/upstream.lock and cpu/patches/series)."""
    lines = [CarriedLine(LOCKED, root / lockfile.LOCK_NAME, root / "patches")]
    cpu_lock, cpu_patches = root / CPU_DIR / lockfile.LOCK_NAME, root / CPU_DIR / "patches"
    if cpu_lock.is_file() and (cpu_patches / "series").is_file():
        lines.append(CarriedLine(CPU, cpu_lock, cpu_patches))
    return lines


def parse_line_specs(values: list[str], known: list[str]) -> dict[str, str]:
    """``--line-upstream LINE=SPEC`` values as line -> spec; a line the project does not carry is an input error."""
    specs: dict[str, str] = {}
    for value in values:
        name, sep, spec = value.partition("=")
        if not sep or not spec or name not in known:
            raise InputError(f"--line-upstream {value!r}: give LINE=UPSTREAM with LINE one of: {', '.join(known)}")
        specs[name] = spec
    return specs


@dataclass(frozen=True)
class LineCheck:
    """One line's answer for one patch: has the fix (reverse-applies), lacks it, or does not carry it."""

    line: str
    upstream: str  # the release (or label) the line was checked against
    carried: bool
    has_it: bool
    status: str = ""  # the apply status on that line ("" when not carried)

    def __str__(self) -> str:
        if not self.carried:
            return f"{self.line} {self.upstream}: does not carry it"
        return f"{self.line} {self.upstream}: {'has it' if self.has_it else 'lacks it'}"


def every_line_has_it(checks: list[LineCheck]) -> bool:
    """The drop rule: at least one line carries the patch, and every line that carries it has the fix."""
    carried = [check for check in checks if check.carried]
    return bool(carried) and all(check.has_it for check in carried)


def verdict(checks: list[LineCheck]) -> str:
    """The per-line summary the audit prints: ``locked 0.33.0: has it / cpu 0.32.0: lacks it -> keep``."""
    return " / ".join(str(check) for check in checks) + (" -> drop" if every_line_has_it(checks) else " -> keep")


def label(upstream: upstream_trees.Upstream) -> str:
    return upstream.version or upstream.label


def checks_from_report(line: str, upstream: upstream_trees.Upstream, report: apply.Report, names: list[str]):
    """Each named patch's check on a line, read from an apply report of that line's series."""
    checks: dict[str, LineCheck] = {}
    for name in names:
        result = report.result_for(name)
        if result is None:
            checks[name] = LineCheck(line, label(upstream), carried=False, has_it=False)
            continue
        status = result.status
        checks[name] = LineCheck(
            line, label(upstream), carried=True, has_it=status is apply.Status.ALREADY_UPSTREAM, status=str(status)
        )
    return checks


def check_line(
    line: CarriedLine, spec: str | None, store: Store, names: list[str]
) -> tuple[upstream_trees.Upstream, dict[str, LineCheck]]:
    """Apply the line's own series onto its upstream (``spec``, default its lock) and read each patch's status.

    Applied strictly (no offset, fuzz or 3-way): a carried line's series applies as it is, and a
    patch that reverse-applies there is one that line's upstream already carries.
    """
    the_lock: Lock = lockfile.load(line.lock_file)
    upstream = upstream_trees.obtain(spec, the_lock, store)
    patches = series.load_series(line.patches_dir)
    with tempfile.TemporaryDirectory(prefix=f"vllm-overlay-line-{line.name}-") as tmp:
        report = apply_run.apply_series(
            patches, upstream, store, Path(tmp) / "tree", apply.Options(), publish_partial=True
        )
    return upstream, checks_from_report(line.name, upstream, report, names)
