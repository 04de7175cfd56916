#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The tool beside the hand way with git, job by job (docs/speed.md's targets): both medians and their ratio.

Each job runs the tool's command and the equivalent plain git commands ALTERNATELY (tool, hand,
hand, tool, tool, hand, ...) in one run, so both see the same machine load and the same drift;
the figures are medians of wall time and of CPU time (the process and every child it waited for:
git included). Read the ratios: on a shared machine the seconds move with the load, which is
printed with each job.

Jobs (``--jobs``, default all):

  startup      every ``scripts/VERB --help`` (the slowest verb)     vs  ``git --version``
  noop         ``apply-patches`` with nothing changed             vs  ``git status`` of the output
  incremental  ``apply-patches`` after the last patch changed     vs  ``git reset --hard HEAD~1`` + ``git am`` of it
  full         ``apply-patches`` into a new output                vs  ``git clone --shared`` + checkout + ``git am``
               (the series was applied before: the cache keeps its build)
  first        the same, the cache's kept builds removed before   vs  the same
               every tool run (a series never applied)
  export       ``export-patches --check``                         vs  ``git format-patch --stdout`` of the range
  lint         ``lint-patches``                                   vs  (no hand way: absolute figures)

The startup job runs the commands in scripts/ as the README does (a shell that starts the
checkout's interpreter); the other jobs start that interpreter themselves (``python -m
vllm_overlay.cli``, which also reports the tool's own CPU), the same process without the shell.

Everything runs on a copy of the project's patches/ and upstream.lock in a scratch directory (the
incremental job edits the copy's last patch); the upstream comes from the tool's cache (run
scripts/apply-patches once first). Example::

    .venv/bin/python benchmarks/speed_tool_vs_git.py --repeat 5

After each run of the full and first jobs, once the clock has passed the second in which the
run's index was written, the tree's first ``git status`` is timed apart and printed on a line of
its own ("then the first git status"). git takes an entry whose file is as new as the index (to
the second: the stat of git 2.39 as Debian builds it compares no nanoseconds) for racily clean,
and hashes that file again at every read until the index is written in a later second (``git
status`` writes it back, ``git diff`` does not). A checkout leaves the files it wrote in its last
second so; the hand way's ``git am`` right after it pays for them (docs/speed.md), the tool's
published tree leaves them to the first git command run in it. That line prices what each side
leaves behind: the sums beside it compare two settled trees.

The full and first jobs remove the last tree before each run. On a file system that reuses freed
inodes slowly (ext4 without a journal: docs/speed.md) the checkout right after a removal costs
several times what it costs later; ``--settle SECONDS`` waits that long after each removal, so the
checkout is measured as on a machine that removed nothing just before (on this project's machine
the effect lasted minutes, a sync or not: docs/speed.md). ``--keep-trees`` instead gives every run
of these jobs a new directory, all removed with the scratch directory at the end: no run follows a
removal of the job's own.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from vllm_overlay.cli import VERBS  # noqa: E402  (the registry: every verb has its command in scripts/)

PYTHON = REPO / ".venv" / "bin" / "python"
TOOL = [str(PYTHON if PYTHON.exists() else Path(sys.executable)), "-m", "vllm_overlay.cli"]
# The tool as ``python -m vllm_overlay.cli`` runs it, which also appends its own process's CPU
# seconds (Python's part; git is in its children) to the file named by OWN_CPU_VARIABLE.
OWN_CPU_VARIABLE = "VLLM_OVERLAY_BENCH_OWN_CPU"
OWN_CPU_WRAPPER = f"""
import atexit, os, resource, runpy, sys
def own_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["{OWN_CPU_VARIABLE}"], "a") as record:
        record.write(f"{{usage.ru_utime + usage.ru_stime}}\\n")
atexit.register(own_cpu)
sys.argv[0] = "vllm_overlay.cli"
runpy.run_module("vllm_overlay.cli", run_name="__main__", alter_sys=True)
"""
TOOL_WITH_OWN_CPU = [TOOL[0], "-c", OWN_CPU_WRAPPER]
IDENTITY = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@invalid"}
IDENTITY |= {"GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@invalid"}


def measured(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its waited-for children) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run_env = ENV if env is None else env
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=run_env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sequence(steps: list[list[str]], cwd: Path | None = None) -> tuple[float, float]:
    total_wall = total_cpu = 0.0
    for step in steps:
        wall, cpu = measured(step, cwd)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
    return total_wall, total_cpu


def series_files(project: Path) -> list[str]:
    lines = (project / "patches" / "series").read_text().splitlines()
    return [str(project / "patches" / line.strip()) for line in lines if line.strip() and not line.startswith("#")]


def store_repo() -> Path:
    cache = os.environ.get("VLLM_OVERLAY_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-overlay"
    )
    return Path(cache) / "upstreams.git"


def hand_way_steps(tree: Path, tag: str, files: list[str]) -> list[list[str]]:
    """The hand way of a full apply into ``tree``: a ``--shared`` clone of the tool's upstream cache,
    a checkout of the upstream, ``git am`` of the series."""
    return [
        ["git", "clone", "-q", "--shared", "--no-checkout", str(store_repo()), str(tree)],
        ["git", "-C", str(tree), "checkout", "-q", "-B", "patched", tag],
        ["git", "-C", str(tree), "am", "-q", "--keep-cr", *files],
    ]


def hand_incremental_steps(tree: Path, patch: Path) -> list[list[str]]:
    """The hand way of a re-apply after the last patch changed: drop its commit, ``git am`` it again."""
    return [
        ["git", "-C", str(tree), "reset", "-q", "--hard", "HEAD~1"],
        ["git", "-C", str(tree), "am", "-q", "--keep-cr", str(patch)],
    ]


def reworded(patch: bytes, label: str) -> bytes:
    """``patch`` with ``label`` put in front of its Description: the message and its trailer block stay
    well formed, and a label new at every run means no tree kept from an earlier run holds the series."""
    assert b"\nDescription: " in patch
    return patch.replace(b"\nDescription: ", f"\nDescription: ({label}) ".encode(), 1)


def upstream_tag(project: Path) -> str:
    import tomllib

    return "upstream/" + tomllib.loads((project / "upstream.lock").read_text())["upstream"]["version"]


class Bench:
    def __init__(self, scratch: Path, repeat: int) -> None:
        self.scratch = scratch
        self.repeat = repeat
        self.project = scratch / "project"
        (self.project / "patches").mkdir(parents=True)
        shutil.copytree(REPO / "patches", self.project / "patches", dirs_exist_ok=True)
        shutil.copy(REPO / "upstream.lock", self.project / "upstream.lock")
        shutil.copytree(REPO / "tests" / "patches", self.project / "tests" / "patches")
        self.out = scratch / "patched"
        self.rows: list[tuple[str, str, str, list[tuple[float, float]], list[tuple[float, float]]]] = []

    def tool(self, *args: str) -> list[str]:
        return [*TOOL_WITH_OWN_CPU, *args, "--project", str(self.project)]

    def own_cpu_of_last_run(self) -> float | None:
        """The CPU seconds the last tool run's own process reported (None: it reported none)."""
        try:
            lines = OWN_CPU_FILE.read_text().split()
        except FileNotFoundError:
            return None
        return float(lines[-1]) if lines else None

    def job(
        self,
        name: str,
        tool_label: str,
        hand_label: str,
        tool_run: Callable[[], tuple[float, float]],
        hand_run: Callable[[], tuple[float, float]] | None,
        before_tool: Callable[[], None] = lambda: None,
        before_hand: Callable[[], None] = lambda: None,
        after_tool: Callable[[], tuple[float, float]] | None = None,
        after_hand: Callable[[], tuple[float, float]] | None = None,
    ) -> None:
        """Run both sides alternately; ``after_*``, where given, is timed apart right after each run
        of its side (the first ``git status`` of the tree it built: ``first_status``)."""
        tool_times, hand_times, own_times = [], [], []
        tool_after: list[tuple[float, float]] = []
        hand_after: list[tuple[float, float]] = []
        for round_number in range(self.repeat):
            # Tool first in even rounds, the hand way first in odd ones: where a run's cost drifts
            # during the job (on ext4 here, a checkout after trees were created and removed costs
            # more at each round), neither side is always the later one.
            sides = [(before_tool, tool_run, tool_times, after_tool, tool_after)]
            if hand_run is not None:
                sides.append((before_hand, hand_run, hand_times, after_hand, hand_after))
            for prepare, timed, times, after, after_times in sides if round_number % 2 == 0 else sides[::-1]:
                prepare()
                OWN_CPU_FILE.unlink(missing_ok=True)  # what a run reports is this run's alone
                times.append(timed())
                own = self.own_cpu_of_last_run() if times is tool_times else None
                if own is not None:
                    own_times.append(own)
                if after is not None:
                    after_times.append(after())
        self.rows.append((name, tool_label, hand_label, tool_times, hand_times))
        print(render_row(self.rows[-1]), flush=True)
        if tool_after and hand_after:
            print(render_settled(tool_times, hand_times, tool_after, hand_after))
        if own_times:
            # What Python itself cost in the tool's runs; the rest of their CPU is git's.
            print(f"{'':<12} the tool's own process (Python), s CPU: median {median(own_times):.3f};", end=" ")
            print("runs: " + " ".join(f"{c:.3f}" for c in own_times), flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render_row(row: tuple[str, str, str, list[tuple[float, float]], list[tuple[float, float]]]) -> str:
    name, tool_label, hand_label, tool_times, hand_times = row
    tw, tc = median([w for w, _ in tool_times]), median([c for _, c in tool_times])
    load = os.getloadavg()[0]
    text = f"{name:<12} tool  {tw:7.3f} s wall {tc:7.3f} s CPU   ({tool_label})\n"
    if hand_times:
        hw, hc = median([w for w, _ in hand_times]), median([c for _, c in hand_times])
        text += f"{'':<12} hand  {hw:7.3f} s wall {hc:7.3f} s CPU   ({hand_label})\n"
        text += f"{'':<12} ratio {tw / hw:7.2f}x wall {tc / hc if hc else float('inf'):7.2f}x CPU"
    else:
        text += f"{'':<12} (no hand way)"
    text += f"   [n={len(tool_times)}, load average {load:.2f}]"
    # Each run in order: the first runs of a job may differ from the rest (the incremental job's
    # first has no spare tree yet), which a median hides.
    text += f"\n{'':<12} tool runs, s CPU: " + " ".join(f"{c:.3f}" for _, c in tool_times)
    if hand_times:
        text += f"\n{'':<12} hand runs, s CPU: " + " ".join(f"{c:.3f}" for _, c in hand_times)
    return text


def render_settled(
    tool_times: list[tuple[float, float]],
    hand_times: list[tuple[float, float]],
    tool_after: list[tuple[float, float]],
    hand_after: list[tuple[float, float]],
) -> str:
    """The lines of each side's first ``git status`` after its runs, and the sums: medians of each
    run plus its status (CPU; wall without the wait before the status)."""

    def summed(times: list[tuple[float, float]], after: list[tuple[float, float]]) -> tuple[float, float]:
        pairs = list(zip(times, after, strict=True))
        return median([w + aw for (w, _), (aw, _) in pairs]), median([c + ac for (_, c), (_, ac) in pairs])

    tw, tc = summed(tool_times, tool_after)
    hw, hc = summed(hand_times, hand_after)
    status_tool, status_hand = median([c for _, c in tool_after]), median([c for _, c in hand_after])
    text = f"{'':<12} then the first git status: tool {status_tool:.3f} s CPU, hand {status_hand:.3f} s CPU"
    text += f"\n{'':<12} status after each tool run, s CPU: " + " ".join(f"{c:.3f}" for _, c in tool_after)
    text += f"\n{'':<12} status after each hand run, s CPU: " + " ".join(f"{c:.3f}" for _, c in hand_after)
    text += f"\n{'':<12} with it, tool {tw:.3f} s wall {tc:.3f} s CPU, hand {hw:.3f} s wall {hc:.3f} s CPU:"
    text += f" ratio {tw / hw:.2f}x wall {tc / hc:.2f}x CPU"
    return text


def first_status(tree: Path) -> tuple[float, float]:
    """The first ``git status`` of a tree just built, once the clock is past the second its index
    was written in (the wait is not timed): it hashes again each file git takes for racily clean
    (a file as new as the index, to the second) and writes the index back, which settles them."""
    written = (tree / ".git" / "index").stat().st_mtime
    wait = math.floor(written) + 1.05 - time.time()
    if wait > 0:
        time.sleep(wait)
    return measured(["git", "-C", str(tree), "status", "--porcelain"])


def kept_builds_folder() -> Path:
    return store_repo().parent / "kept-builds"


def run(jobs: list[str], repeat: int, settle: float = 0.0, keep_trees: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-speed-") as tmp:
        bench = Bench(Path(tmp), repeat)
        project, out = bench.project, bench.out
        tag = upstream_tag(project)
        hand = bench.scratch / "hand"
        files = series_files(project)

        # Where each run of the full and first jobs writes its tree: with --keep-trees a new
        # directory per run (all go with the scratch directory at the end), else the same one,
        # removed before the run.
        bases = {"tool": bench.scratch / "fresh", "hand": hand}
        targets = dict(bases)
        numbers = itertools.count()

        def hand_full() -> tuple[float, float]:
            return sequence(hand_way_steps(targets["hand"], tag, files))

        def tool_full() -> tuple[float, float]:
            return measured(bench.tool("apply-patches", "-o", str(targets["tool"])))

        # Each full and first run is followed by the first git status of the tree it built (timed apart).
        statuses_after = {
            "after_tool": lambda: first_status(targets["tool"]),
            "after_hand": lambda: first_status(targets["hand"]),
        }

        def new_target(side: str) -> Callable[[], None]:
            base = bases[side]

            def step() -> None:
                if keep_trees:
                    targets[side] = base.with_name(f"{base.name}-{next(numbers)}")
                else:
                    remove(base)()

            return step

        def remove(path: Path) -> Callable[[], None]:
            def step() -> None:
                shutil.rmtree(path, ignore_errors=True)
                # The kernel writes the removal (and the last run's files) back before the next
                # timed run, instead of billing it to whichever side runs next.
                os.sync()
                time.sleep(settle)

            return step

        # The output both the no-op and the incremental jobs start from; the hand clone beside it.
        subprocess.run(bench.tool("apply-patches", "-o", str(out)), check=True, capture_output=True, env=ENV)
        remove(hand)()
        hand_full()
        if "startup" in jobs:
            slowest: list[str] = []

            def tool_help() -> tuple[float, float]:
                times = [measured([str(REPO / "scripts" / verb), "--help"]) for verb in VERBS]
                worst = max(range(len(times)), key=lambda i: times[i][1])
                slowest.append(list(VERBS)[worst])
                return times[worst]

            bench.job(
                "startup",
                "slowest VERB --help of all verbs",
                "git --version",
                tool_help,
                lambda: measured(["git", "--version"]),
            )
            print(f"{'':<12} slowest verbs: {', '.join(sorted(set(slowest)))}")
        if "noop" in jobs:
            bench.job(
                "noop",
                "apply-patches, nothing changed",
                "git status of the output",
                lambda: measured(bench.tool("apply-patches", "-o", str(out))),
                lambda: measured(["git", "-C", str(out), "status"]),
            )
        if "incremental" in jobs:
            last = Path(files[-1])
            original = last.read_bytes()
            edits = {"tool": 0, "hand": 0}

            def edit(who: str) -> Callable[[], None]:
                def step() -> None:
                    edits[who] += 1
                    last.write_bytes(reworded(original, f"reworded {who} {edits[who]}"))

                return step

            def hand_incremental() -> tuple[float, float]:
                return sequence(hand_incremental_steps(hand, last))

            bench.job(
                "incremental",
                "apply-patches after the last patch changed",
                "git reset --hard HEAD~1 + git am of the last patch",
                lambda: measured(bench.tool("apply-patches", "-o", str(out))),
                hand_incremental,
                before_tool=edit("tool"),
                before_hand=edit("hand"),
            )
            last.write_bytes(original)
            subprocess.run(bench.tool("apply-patches", "-o", str(out)), check=True, capture_output=True, env=ENV)
        if "full" in jobs:
            bench.job(
                "full",
                "apply-patches into a new output",
                "git clone --shared + git checkout + git am of the series",
                tool_full,
                hand_full,
                before_tool=new_target("tool"),
                before_hand=new_target("hand"),
                **statuses_after,
            )
        if "first" in jobs:
            next_tool_target = new_target("tool")

            def forget_builds() -> None:
                shutil.rmtree(kept_builds_folder(), ignore_errors=True)  # a cache: always safe to remove
                next_tool_target()

            bench.job(
                "first",
                "apply-patches into a new output, no kept build",
                "git clone --shared + git checkout + git am of the series",
                tool_full,
                hand_full,
                before_tool=forget_builds,
                before_hand=new_target("hand"),
                **statuses_after,
            )
        if "export" in jobs:
            bench.job(
                "export",
                "export-patches --check",
                "git format-patch --stdout of the range",
                lambda: measured(bench.tool("export-patches", "--check", "--repo", str(out))),
                lambda: measured(["git", "-C", str(out), "format-patch", "--stdout", f"{tag}..HEAD"]),
            )
        if "lint" in jobs:
            bench.job("lint", "lint-patches", "", lambda: measured(bench.tool("lint-patches")), None)


ENV = dict(os.environ, **IDENTITY)
# As installed for use: Python caches the tool's compiled modules (a sandbox may forbid that).
ENV.pop("PYTHONDONTWRITEBYTECODE", None)
ENV["PYTHONPATH"] = str(REPO) + (os.pathsep + ENV["PYTHONPATH"] if ENV.get("PYTHONPATH") else "")
OWN_CPU_FILE = Path(tempfile.gettempdir()) / f"vllm-overlay-bench-own-cpu-{os.getpid()}"
ENV[OWN_CPU_VARIABLE] = str(OWN_CPU_FILE)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side per job (default 5)")
    parser.add_argument(
        "--jobs",
        default="startup,noop,incremental,full,first,export,lint",
        help="comma-separated jobs (default: all): startup,noop,incremental,full,first,export,lint",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long after each removal of a tree (full, first) before the next run (default 0)",
    )
    parser.add_argument(
        "--keep-trees",
        action="store_true",
        help="full, first: write each run's tree into a new directory, all removed at the end",
    )
    options = parser.parse_args()
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.split()[-1]
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores; git {git_version}")
    try:
        run(options.jobs.split(","), options.repeat, options.settle, options.keep_trees)
    finally:
        OWN_CPU_FILE.unlink(missing_ok=True)
