"""The drop step of a bump: patches every carried line's upstream already has leave the series.

Before a bump applies the series to a new release, each carried line is checked for each
patch's fix by a real apply (vllm_overlay.audit.lines): the locked line on the new release, the
CPU carry on its own upstream. A patch that every line carrying it has is proposed for drop, and
``bump VERSION --drop`` takes it out as a step of its own, before the series moves:

- its file and its line leave patches/ and patches/series, and cpu/patches where that line carries it;
- its regression tests leave tests/patches/<series>/ for tests/upstream-behaviour/<series>/ (same
  relative path): no patch claims them any more, so the per-patch runner stops running them, and
  they stay as tests of the upstream behaviour, run against the new release's pristine tree;
  a test another remaining patch still lists stays where it is;
- the drop is recorded in docs/drops.md: the patch, ``Applied-Upstream: <version>``, what each
  line answered and where its tests went;
- a remaining patch that some line already has (but not every line) gets ``Applied-Upstream:``
  and ``Forwarded: not-needed`` from what the check found (git interpret-trailers writes them);
- cpu/carried-from is re-recorded when it was current: the carry is the same carry minus the
  same patch.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay import series
from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import run as apply_run
from vllm_overlay.audit import lines
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees

UPSTREAM_BEHAVIOUR = Path("tests") / "upstream-behaviour"
PATCH_TESTS = Path("tests") / "patches"
DROPS_LOG = Path("docs") / "drops.md"
DROPS_LOG_HEAD = """# Patches dropped because upstream has them

Each row is one `scripts/bump VERSION --drop`: a patch left the series (patches/, and cpu/patches
where that line carried it) because every carried line's upstream already had its fix, checked by
applying each line's series onto that line's upstream (the patch reverse-applied there). Its
regression tests moved to tests/upstream-behaviour/<series>/ and now test the upstream behaviour
on the new release.

| patch | Applied-Upstream | carried lines | tests now in |
|---|---|---|---|
"""


@dataclass
class DropPlan:
    """What every carried line answered for each patch, for the release the locked line moves to."""

    version: str
    checks: dict[str, list[lines.LineCheck]] = field(default_factory=dict)  # patch -> one check per line

    @property
    def drop(self) -> list[str]:
        """The patches every line carrying them has: they leave the series."""
        return [name for name, checks in self.checks.items() if lines.every_line_has_it(checks)]

    @property
    def held(self) -> list[str]:
        """The patches some line has but another still needs: they stay, their headers say so."""
        return [
            name
            for name, checks in self.checks.items()
            if any(check.has_it for check in checks) and not lines.every_line_has_it(checks)
        ]

    def summary(self, name: str) -> str:
        return lines.verdict(self.checks[name])


def plan(root: Path, new: upstream_trees.Upstream, store: Store, line_specs: dict[str, str] | None = None) -> DropPlan:
    """Check every carried line for every patch of patches/: the locked line on ``new``, the others on theirs."""
    carried = lines.carried_lines(root)
    patches = series.load_series(carried[0].patches_dir)
    names = [patch.name for patch in patches]
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-drop-") as tmp:
        report = apply_run.apply_series(patches, new, store, Path(tmp) / "tree", apply.Options(), publish_partial=True)
    per_line = [lines.checks_from_report(lines.LOCKED, new, report, names)]
    for line in carried[1:]:
        per_line.append(lines.check_line(line, (line_specs or {}).get(line.name), store, names)[1])
    return DropPlan(lines.label(new), {name: [checks[name] for checks in per_line] for name in names})


def _remove_from_series(patches_dir: Path, name: str) -> bool:
    """Take ``name`` out of a series directory (its file and its line); False when that series lacks it."""
    names = [entry.path for entry in series.read_series(patches_dir)]
    if name not in names:
        return False
    names.remove(name)
    (patches_dir / "series").write_text(series.render_series(names))
    (patches_dir / name).unlink()
    parent = (patches_dir / name).parent
    if parent != patches_dir and not any(parent.iterdir()):
        parent.rmdir()
    return True


def _move_tests(root: Path, patch: series.Patch, still_listed: set[str]) -> list[str]:
    """Move the patch's tests under tests/patches/ to tests/upstream-behaviour/; returns where each is now."""
    now: list[str] = []
    for test in patch.tests:
        path = test.split("::", 1)[0]
        relative = Path(path)
        if path in still_listed or not relative.is_relative_to(PATCH_TESTS) or not (root / relative).exists():
            now.append(path)
            continue
        target = UPSTREAM_BEHAVIOUR / relative.relative_to(PATCH_TESTS)
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(root / relative, root / target)
        now.append(target.as_posix())
    return now


def set_trailers(patch_file: Path, values: dict[str, str]) -> None:
    """Write trailers into a patch file in place (replacing any of the same key), as git writes them."""
    arguments = ["interpret-trailers", "--in-place", "--if-exists", "replace"]
    for key, value in values.items():
        arguments += ["--trailer", f"{key}: {value}"]
    gitcmd.process(*arguments, str(patch_file), check=True, capture_output=True)


def _carry_was_current(root: Path) -> bool:
    from vllm_overlay.cpu import carry

    recorded = root / carry.CARRY_DIR / carry.CARRIED_FROM
    if not recorded.is_file():
        return False
    first = recorded.read_text(encoding="utf-8").split("  ", 1)[0]
    return first == carry.series_digest(root / "patches")


def apply_plan(root: Path, drop_plan: DropPlan) -> list[str]:
    """Take the planned patches out (see the module's docstring); returns the project files changed."""
    from vllm_overlay.cpu import carry, recarry

    carried = lines.carried_lines(root)
    locked_dir = carried[0].patches_dir
    dropping = drop_plan.drop
    carry_current = len(carried) > 1 and _carry_was_current(root)
    patches = {patch.name: patch for patch in series.load_series(locked_dir)}
    remaining_tests = {
        test.split("::", 1)[0] for line in carried for patch in series.load_series(line.patches_dir)
        if patch.name not in dropping for test in patch.tests
    }  # fmt: skip
    changed: list[str] = []
    log = root / DROPS_LOG
    rows = log.read_text(encoding="utf-8") if log.is_file() else DROPS_LOG_HEAD
    for name in dropping:
        patch = patches[name]
        moved = _move_tests(root, patch, remaining_tests)
        for line in carried:
            if _remove_from_series(line.patches_dir, name):
                changed.append((line.patches_dir / name).relative_to(root).as_posix())
        rows += f"| {name} | {drop_plan.version} | {drop_plan.summary(name)} | {', '.join(moved)} |\n"
        changed += [path for path in moved if path.startswith(UPSTREAM_BEHAVIOUR.as_posix())]
    for name in drop_plan.held:
        having = [check for check in drop_plan.checks[name] if check.has_it]
        set_trailers(
            locked_dir / name,
            {
                "Applied-Upstream": ", ".join(f"{check.upstream} ({check.line} line)" for check in having),
                "Forwarded": "not-needed (upstream has the fix; carried only for: "
                + ", ".join(f"{c.line} {c.upstream}" for c in drop_plan.checks[name] if c.carried and not c.has_it)
                + ")",
            },
        )
        changed.append((locked_dir / name).relative_to(root).as_posix())
    if dropping:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(rows, encoding="utf-8")
        changed.append(DROPS_LOG.as_posix())
    if carry_current and changed:
        where = root / carry.CARRY_DIR / carry.CARRIED_FROM
        where.write_text(recarry.render_carried_from(locked_dir, "as of this carry"), encoding="utf-8")
        changed.append(where.relative_to(root).as_posix())
    return changed
