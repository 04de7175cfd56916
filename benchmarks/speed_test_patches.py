#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test-patches with nothing changed (the speed target: under 10 s wall), and its environment check.

1. The environment check alone, ALTERNATELY: the stat-kept proof ``testenv.ensure`` uses now
   (``envproof.verify``: only files whose stat changed are hashed) beside the full RECORD hash
   every run used to pay (``record.verify_distribution``), on the cached test environment.
2. ``scripts/test-patches`` on this checkout, ``--repeat`` times after one priming run (which may
   run what the verdict store does not hold yet, e.g. the tool tests after the tool changed).

Prints medians of wall and CPU time (CPU: the process and its waited-for children) and the load
average. Needs the test environment (built by the first test-patches run). Example::

    .venv/bin/python benchmarks/speed_test_patches.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_overlay.env import proof as envproof  # noqa: E402
from vllm_overlay.env import record, testenv  # noqa: E402
from vllm_overlay.store import Store  # noqa: E402
from vllm_overlay.upstream import lock  # noqa: E402


def timed(function) -> tuple[float, float, object]:
    started, cpu = time.perf_counter(), time.process_time()
    value = function()
    return time.perf_counter() - started, time.process_time() - cpu, value


def environment_check(repeat: int) -> None:
    the_lock = lock.load(REPO / "upstream.lock")
    env = testenv.ensure(the_lock, Store())  # builds it if missing; leaves a proof
    proof_now, full = [], []
    with tempfile.TemporaryDirectory() as tmp:
        proof = Path(tmp) / "env.proof.json"
        envproof.verify(env.site_packages, the_lock.project, proof)  # the one full check a key pays
        for _ in range(repeat):
            wall, cpu, (problems, hashed) = timed(lambda: envproof.verify(env.site_packages, the_lock.project, proof))
            assert not problems, problems
            proof_now.append((wall, cpu, hashed))
            wall, cpu, problems = timed(lambda: record.verify_distribution(env.site_packages, the_lock.project))
            assert not problems, problems
            full.append((wall, cpu, None))
    rows = {"proof kept by stat (now)": proof_now, "full RECORD hash (before)": full}
    for label, times in rows.items():
        wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
        hashed = f", {times[0][2]} file(s) hashed" if times[0][2] is not None else ""
        print(f"env check  {label:<28} {wall:6.2f} s wall {cpu:6.2f} s CPU{hashed}")
    ratio_wall = statistics.median(t[0] for t in full) / statistics.median(t[0] for t in proof_now)
    ratio_cpu = statistics.median(t[1] for t in full) / statistics.median(t[1] for t in proof_now)
    print(f"env check  full / proof: {ratio_wall:.1f}x wall, {ratio_cpu:.1f}x CPU   [n={repeat}, load {load()}]")


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def test_patches(repeat: int) -> None:
    command = [str(REPO / "scripts" / "test-patches")]
    runs = []
    for index in range(repeat + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        checked = next((line for line in result.stderr.splitlines() if "pristine per RECORD" in line), "")
        label = "priming run" if index == 0 else f"run {index}"
        figures = f"{wall:6.1f} s wall {cpu:6.1f} s CPU"
        print(f"test-patches {label:<12} exit {result.returncode}  {figures}  [load {load()}]")
        if checked:
            print(f"             {checked.strip()}")
        if index:
            runs.append((wall, cpu))
    wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    print(f"test-patches nothing changed: median {wall:.1f} s wall, {cpu:.1f} s CPU over {repeat} run(s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="measured runs of each (default 3)")
    parser.add_argument("--skip-test-patches", action="store_true", help="only the environment check")
    options = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores")
    environment_check(options.repeat)
    if not options.skip_test_patches:
        test_patches(options.repeat)
