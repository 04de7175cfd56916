#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the user's first ``git status`` costs in a tree a cold apply just built.

Runs ``apply-patches --rebuild`` (a build from upstream: the narrowed checkout, the series, the
widening) of this project's series into a new directory ``--repeat`` times; after each, once the
clock has left the second the index was written in, times the tree's first ``git status`` and a
second one (a settled index: what a hand-made tree's status costs), and counts the index entries
git takes for racily clean (dated in the index's second or later) and whether the index has a
cache tree (TREE). Prints every run and the medians: wall and CPU of the apply and of each ``git status``.

It runs the tool of the tree it lies in, on that tree's patches/ and the shared cache (the
upstream must be imported: run scripts/apply-patches once first). To measure another commit,
run a copy of this script from a ``git archive`` of that commit with this checkout's interpreter.
Example::

    .venv/bin/python benchmarks/first_status_after_apply.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git

REPO = Path(__file__).resolve().parents[1]


def timed_status(tree: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one ``git status`` in ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def index_facts(tree: Path) -> tuple[int, bool]:
    """Entries dated in the index's second or later (racily clean), and whether it has a cache tree."""
    second = int((tree / ".git" / "index").stat().st_mtime)
    index = git.IndexFile(git.Repo(tree))
    racy = sum(1 for entry in index.entries.values() if entry.mtime[0] >= second)
    return racy, index._extension_data[:4] == b"TREE"  # git writes the cache tree first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="cold applies (default 3)")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores; tool at {REPO}")
    firsts: list[tuple[float, float]] = []
    seconds: list[tuple[float, float]] = []
    applies: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="first-status-") as tmp:
        for run in range(args.repeat):
            tree = Path(tmp) / f"tree-{run}"
            apply = [str(REPO / "scripts" / "apply-patches"), "--project", str(REPO), "-o", str(tree), "--rebuild"]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(apply, check=True, capture_output=True)
            applied = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            applies.append((applied, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
            index_second = int((tree / ".git" / "index").stat().st_mtime)
            time.sleep(max(0.0, index_second + 1.1 - time.time()))
            racy, cache_tree = index_facts(tree)
            firsts.append(timed_status(tree))
            seconds.append(timed_status(tree))
            print(
                f"run {run + 1}: apply {applied:.2f} s wall {applies[-1][1]:.2f} s CPU; "
                f"index: {racy} racily clean entries, "
                f"cache tree {'yes' if cache_tree else 'no'}; first git status {firsts[-1][0]:.3f} s wall "
                f"{firsts[-1][1]:.3f} s CPU, second {seconds[-1][0]:.3f} s wall {seconds[-1][1]:.3f} s CPU "
                f"[load average {os.getloadavg()[0]:.2f}]"
            )
            shutil.rmtree(tree)
    first_cpu, second_cpu = statistics.median(c for _w, c in firsts), statistics.median(c for _w, c in seconds)
    print(
        f"medians: first git status {statistics.median(w for w, _c in firsts):.3f} s wall {first_cpu:.3f} s CPU; "
        f"second {statistics.median(w for w, _c in seconds):.3f} s wall {second_cpu:.3f} s CPU; "
        f"first / second CPU {first_cpu / second_cpu:.1f}x; apply {statistics.median(w for w, _c in applies):.2f} s "
        f"wall {statistics.median(c for _w, c in applies):.2f} s CPU [n={args.repeat}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
