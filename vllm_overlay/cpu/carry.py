"""The series carried onto the CPU runtime's release: cpu/upstream.lock, cpu/patches/.

The end-to-end suite serves with vLLM's CPU build of the release before the locked upstream
(vllm_overlay.cpu.runtime). The series is carried onto that release with the project's own bump
machinery (``git am --3way``, resolutions reviewed by hand, recorded with rerere) and kept as data:
cpu/upstream.lock pins the tree it is patched from (written by the bump, as upstream.lock is) and
cpu/patches/ holds the carried patches in the same format as patches/. Applying it needs no hand
work: every carried patch must apply clean (no offset, fuzz or 3-way), or the carry is stale.

A carry project is a Project whose lock, patches and build directory live under cpu/, so
apply, export, staging and the image's manifest are the same code as for the locked series.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay import series
from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import patched_repo
from vllm_overlay.apply import run as apply_run
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.cpu.runtime import RuntimeLock
from vllm_overlay.errors import InputError
from vllm_overlay.image import build_context, labels
from vllm_overlay.project import Project
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

CARRY_DIR = "cpu"
# The digest of the locked series (patches/series and every patch it lists) the carry was made
# from: a carried series proves nothing about a patches/ it was not carried from.
CARRIED_FROM = "carried-from"


class CarryError(InputError, RuntimeError):
    """The carried series is stale, touches runtime-only files or cannot be staged (scripts/carry-cpu mends it)."""


@dataclass(frozen=True)
class CarryProject(Project):
    """The project's layout with the lock, patches and build outputs of the carried series."""

    @property
    def lock_file(self) -> Path:
        return self.root / CARRY_DIR / lock.LOCK_NAME

    @property
    def patches(self) -> Path:
        return self.root / CARRY_DIR / "patches"

    @property
    def build(self) -> Path:
        return self.root / "build" / CARRY_DIR

    @property
    def runtime_lock(self) -> Path:
        return self.root / CARRY_DIR / "runtime.lock"


def series_digest(patches_dir: Path) -> str:
    """The series' sha256 as the image's manifest and labels state it (``labels.series_sha256``)."""
    return labels.series_sha256(series.load_series(patches_dir))


def recorded_source(proj: CarryProject) -> str:
    """The locked series' digest recorded when the carry was made (cpu/carried-from)."""
    path = proj.root / CARRY_DIR / CARRIED_FROM
    try:
        return path.read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError):
        raise CarryError(f"{path}: missing: the carry does not say which patches/ it was carried from") from None


def stale_problem(proj: CarryProject) -> str | None:
    """Why the carried series is not the carry of today's patches/ (None: it is)."""
    recorded, current = recorded_source(proj), series_digest(proj.root / "patches")
    if recorded == current:
        return None
    return (
        f"{CARRY_DIR}/patches was carried from another patches/ (series digest {recorded[:12]}; patches/ is now "
        f"{current[:12]}): carry it again (docs/e2e.md, 'Carrying the series') and record the new digest in "
        f"{CARRY_DIR}/{CARRIED_FROM}, or pass --allow-stale-carry to serve the old carry knowingly"
    )


def runtime_only_problems(patches: list[series.Patch], runtime: RuntimeLock) -> list[str]:
    """Carried patches touching files in which the runtime wheel differs from the upstream tree.

    Those files (CPU build metadata) are the wheel's; laying a patched copy of the sdist's version
    over them would replace the CPU build's own code with the GPU build's.
    """
    problems = []
    for patch in patches:
        for file in patch.diff:
            path = (file.target_file if file.target_file != "/dev/null" else file.source_file).split("/", 1)[-1]
            if path in runtime.runtime_only:
                problems.append(f"{patch.name} changes {path}, which the {runtime.project} wheel ships its own of")
    return problems


def build_tree(proj: CarryProject, the_lock: lock.Lock, store: Store, dest: Path | None = None) -> apply.Report:
    """Apply the carried series onto its locked tree into ``dest`` (default build/cpu/patched), strictly."""
    patches = series.load_series(proj.patches, allow_empty=False)
    upstream = upstream_trees.obtain(None, the_lock, store)
    report = apply_run.apply_series(
        patches,
        upstream,
        store,
        (dest or proj.patched_tree).resolve(),
        apply.Options(),
    )
    if not report.ok:
        refused = [f"{r.name}: {r.status}" for r in report.results if not r.accepted]
        raise CarryError(
            "the carried series does not apply clean onto "
            f"{upstream.label} ({'; '.join(refused)}): carry it again (docs/e2e.md, 'Carrying the series')"
        )
    return report


def stage(
    proj: CarryProject, the_lock: lock.Lock, runtime: RuntimeLock, tree: Path, dest: Path
) -> build_context.BuildContext:
    """The image's build context for the carried series: one layer per series, overlay, manifest."""
    patches = series.load_series(proj.patches, allow_empty=False)
    problems = runtime_only_problems(patches, runtime)
    if problems:
        raise CarryError("; ".join(problems))
    return build_context.stage(
        proj,
        the_lock,
        patches,
        tree=tree,
        dest=dest,
        distribution=runtime.project,
        expected_record=cpu_runtime.expected_record(runtime, Store()),
    )


def range_diff(main_tree: Path, carried_tree: Path) -> str:
    """``git range-diff`` of the locked series (main_tree) against the carried one.

    Both trees are apply-patches outputs; the carried tree's commits are fetched into a scratch ref
    of the main tree's repository so git can compare them.
    """
    ref = "refs/vllm-overlay/carried"
    gitcmd.process("-C", str(main_tree), "fetch", "-q", str(carried_tree), f"+HEAD:{ref}", check=True)
    main_base = patched_repo.upstream_base(main_tree)
    carried_base = patched_repo.upstream_base(carried_tree)
    _status, out, _err = gitcmd.run(
        main_tree, "range-diff", "--no-color", f"{main_base}..HEAD", f"{carried_base}..{ref}"
    )  # its exit status aside: what it printed is the answer
    return out.strip()
