#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Cost of proving an imported upstream every run: the cheap fingerprint check and the full rehash.

Reads the store's repository only (nothing is written): by default the locked release's tag in the
cache ($VLLM_OVERLAY_CACHE or ~/.cache/vllm-overlay). Prints seconds per check and the object count.

    .venv/bin/python benchmarks/upstream_check.py [--tag upstream/0.33.0] [--repeat 5] [--full]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from vllm_overlay.store import Store
from vllm_overlay.upstream import lock, objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", help="tag in the store's upstreams.git (default: the locked release's)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="also time the full rehash of every object")
    args = parser.parse_args()
    tag = args.tag or f"upstream/{lock.load(Path(__file__).resolve().parents[1] / 'upstream.lock').version}"
    repo = Store().upstreams_git
    started = time.perf_counter()
    listed = [oid for _mode, kind, oid, _path in objects.tree_entries(repo, tag) if kind != "commit"]
    print(f"{tag}: {len(listed)} objects listed in {time.perf_counter() - started:.3f}s (done once, at import)")
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        objects.fingerprint(repo, listed)
        times.append(time.perf_counter() - started)
    median_ms, max_ms = statistics.median(times) * 1000, max(times) * 1000
    print(f"fingerprint check (every run): median {median_ms:.1f} ms, max {max_ms:.1f} ms")
    if args.full:
        started = time.perf_counter()
        objects.rehash(repo, tag)
        print(f"full rehash (only when the object files changed): {time.perf_counter() - started:.2f}s")


if __name__ == "__main__":
    main()
