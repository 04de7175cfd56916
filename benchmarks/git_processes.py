#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where one apply's CPU goes, git process by git process, beside the hand way's (speed jobs 3 and 4).

speed_tool_vs_git.py gives each side's total; this script says what the totals are made of. With
``--jobs full`` (the default) it runs, alternately, ``--repeat`` times each:

  first   ``apply-patches`` into a new output, the cache's kept builds removed before (a series
          never applied: job 4')
  full    ``apply-patches`` into a new output, the series' kept build in the cache (job 4)
  hand    ``git clone --shared`` of the tool's upstream cache + ``git checkout`` + ``git am`` of
          the series

and with ``--jobs incremental`` (job 3; the last patch's Description reworded before every run,
as speed_tool_vs_git.py's incremental job does):

  incremental       ``apply-patches`` into the same output (its spare reset to the shared prefix)
  hand-incremental  ``git reset --hard HEAD~1`` + ``git am`` of the last patch in a clone made
                    the hand way

with a ``git`` first on PATH that runs the real one under bash's ``time`` and logs the CPU of
each git process (user + system, millisecond resolution; the wrapper's own shell is not counted).
Every run writes a new directory, none removed before the end, so no run follows a removal of
this script's (docs/speed.md: on this machine a checkout after one costs several times more).
Printed per job: the medians of the whole CPU (the process and all it waited for), of the tool's
own process (its Python) and of each git subcommand's count and CPU, largest first. The
wrapper's shells add to the whole: compare the parts, and the totals with speed_tool_vs_git.py.
Run scripts/apply-patches once first (the upstream comes from the tool's cache). Example::

    .venv/bin/python benchmarks/git_processes.py --repeat 3
    .venv/bin/python benchmarks/git_processes.py --jobs incremental --repeat 12
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from speed_tool_vs_git import (  # this folder: the same cache, project copy and runs
    ENV,
    OWN_CPU_FILE,
    Bench,
    hand_incremental_steps,
    hand_way_steps,
    kept_builds_folder,
    measured,
    reworded,
    series_files,
    upstream_tag,
)

# Runs git under bash's ``time`` (TIMEFORMAT: user and system seconds, 3 decimals) and appends one
# line per process to $BENCH_GIT_PROCESSES_LOG: "<user> <system> <argument>\x1f<argument>...".
WRAPPER = """#!/bin/bash
TIMEFORMAT='%3U %3S'
times="$BENCH_GIT_PROCESSES_LOG.$$"
{ time "$BENCH_GIT_PROCESSES_REAL" "$@" 2>&3 ; } 3>&2 2>"$times"
status=$?
IFS=$'\\x1f'
printf '%s %s\\n' "$(< "$times")" "$*" >> "$BENCH_GIT_PROCESSES_LOG"
rm -f "$times"
exit $status
"""
# git's options that take the next argument as their value (before the subcommand).
VALUED_OPTIONS = {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env"}


def subcommand(argv: list[str]) -> str:
    """The git subcommand of one logged process (``am``, ``checkout``, ...)."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in VALUED_OPTIONS:
            index += 2
        elif word.startswith("-"):
            index += 1
        else:
            return word
    return "(none)"


def read_log(log: Path) -> dict[str, tuple[int, float]]:
    """{subcommand: (processes, CPU seconds)} of the processes ``log`` holds."""
    parts: dict[str, tuple[int, float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        user, system, args = line.split(" ", 2)
        name = subcommand(args.split("\x1f"))
        count, cpu = parts.get(name, (0, 0.0))
        parts[name] = (count + 1, cpu + float(user) + float(system))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each job (default 3)")
    parser.add_argument(
        "--jobs",
        choices=("full", "incremental"),
        default="full",
        help="full: a first apply, a full apply and the hand way's (job 4); incremental: a re-apply "
        "after the last patch changed and the hand way's (job 3). Default: full",
    )
    args = parser.parse_args()
    real_git = shutil.which("git")
    assert real_git, "git is not on PATH"
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-git-processes-") as tmp:
        scratch = Path(tmp)
        shim = scratch / "bin"
        shim.mkdir()
        (shim / "git").write_text(WRAPPER)
        (shim / "git").chmod(0o755)
        log = scratch / "git.log"
        env = dict(ENV, BENCH_GIT_PROCESSES_LOG=str(log), BENCH_GIT_PROCESSES_REAL=real_git)
        env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
        bench = Bench(scratch, args.repeat)
        files = series_files(bench.project)
        tag = upstream_tag(bench.project)
        trees = (scratch / f"tree-{n}" for n in itertools.count())
        # The series' kept build, which the full job uses (and the first job removes); the output
        # the incremental job re-applies into.
        output = next(trees)
        subprocess.run(bench.tool("apply-patches", "-o", str(output)), check=True, capture_output=True, env=ENV)

        def tool_run(target: Path) -> tuple[float, float | None]:
            OWN_CPU_FILE.unlink(missing_ok=True)
            _wall, cpu = measured(bench.tool("apply-patches", "-o", str(target)), env=env)
            return cpu, bench.own_cpu_of_last_run()

        def tool(forget_builds: bool) -> Callable[[], tuple[float, float | None]]:
            def run() -> tuple[float, float | None]:
                if forget_builds:
                    shutil.rmtree(kept_builds_folder(), ignore_errors=True)  # a cache: always safe to remove
                return tool_run(next(trees))

            return run

        def hand() -> tuple[float, float | None]:
            return sum(measured(step, env=env)[1] for step in hand_way_steps(next(trees), tag, files)), None

        last = Path(files[-1])
        original = last.read_bytes()
        labels = itertools.count()
        hand_tree = next(trees)

        def tool_incremental() -> tuple[float, float | None]:
            last.write_bytes(reworded(original, f"tool {next(labels)}"))
            return tool_run(output)

        def hand_incremental() -> tuple[float, float | None]:
            last.write_bytes(reworded(original, f"hand {next(labels)}"))
            return sum(measured(step, env=env)[1] for step in hand_incremental_steps(hand_tree, last)), None

        if args.jobs == "incremental":
            for step in hand_way_steps(hand_tree, tag, files):
                subprocess.run(step, check=True, capture_output=True, env=ENV)
            # Untimed: the first re-apply after a new output starts from a kept build; the second
            # has the spare the timed runs use.
            for _warm_up in range(2):
                tool_incremental()
                hand_incremental()
            jobs = {"incremental": tool_incremental, "hand-incremental": hand_incremental}
        else:
            jobs = {"first": tool(True), "full": tool(False), "hand": hand}
        results: dict[str, list[tuple[float, float | None, dict[str, tuple[int, float]]]]] = {j: [] for j in jobs}
        names = list(jobs)
        for round_number in range(args.repeat):
            order = names[round_number % len(names) :] + names[: round_number % len(names)]
            for name in order:
                log.unlink(missing_ok=True)
                cpu, own = jobs[name]()
                results[name].append((cpu, own, read_log(log)))
        load = os.getloadavg()[0]
        for name, runs in results.items():
            whole = statistics.median(cpu for cpu, _own, _parts in runs)
            owns = [own for _cpu, own, _parts in runs if own is not None]
            line = f"{name:<16} whole {whole:.3f} s CPU (runs: {' '.join(f'{cpu:.3f}' for cpu, _o, _p in runs)})"
            if owns:
                line += f"; the tool's own process (Python) {statistics.median(owns):.3f} s"
            print(f"{line}   [n={len(runs)}, load average {load:.2f}]")
            commands = sorted({c for _cpu, _own, parts in runs for c in parts})
            rows = []
            for command in commands:
                counts = [parts.get(command, (0, 0.0))[0] for _c, _o, parts in runs]
                cpus = [parts.get(command, (0, 0.0))[1] for _c, _o, parts in runs]
                rows.append((statistics.median(cpus), statistics.median(counts), command))
            for cpu, count, command in sorted(rows, reverse=True):
                print(f"       git {command:<20} {count:>4g} process(es) {cpu * 1000:9.1f} ms CPU")
            git_total = sum(cpu for cpu, _count, _command in rows)
            print(f"       git, all (sum of the medians)         {git_total * 1000:9.1f} ms CPU")


if __name__ == "__main__":
    main()
