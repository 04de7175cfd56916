#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How long audit-upstream takes for one release, phase by phase.

Runs the real audit (``vllm_overlay.audit.session.run_audit``: both upstreams applied, target drift,
dependency-API drift, conflict/merge split, broken merges, range-diff) of this checkout's series
against each given release, ``--repeat`` times, and prints the wall time of every phase and the
process CPU time. The sdists and the dependency versions come from the store (~/.cache/
vllm-overlay); the first run of a release downloads whatever is missing, so pass --repeat 2 and
read the second run for the cached figure. The target is < 60 s per release on 2 cores.

Example::

    python3 benchmarks/audit_upstream_speed.py 0.30.0 0.32.0 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_overlay import series  # noqa: E402
from vllm_overlay.audit import session  # noqa: E402
from vllm_overlay.store import Store  # noqa: E402
from vllm_overlay.upstream import lock  # noqa: E402


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", nargs="+")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    the_lock = lock.load(REPO / "upstream.lock")
    patches = series.load_series(REPO / "patches")
    print(f"{len(patches)} patches, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for release in args.releases:
        for attempt in range(1, args.repeat + 1):
            cpu, start = cpu_seconds(), time.monotonic()
            result = session.run_audit(patches, the_lock, Store(), release, 3, None)
            wall, used = time.monotonic() - start, cpu_seconds() - cpu
            phases = ", ".join(f"{phase} {sec:.1f}" for phase, sec in result.seconds.items() if phase != "total")
            print(f"{release} run {attempt}: {wall:.1f} s wall, {used:.1f} s CPU (this process and git); {phases}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
