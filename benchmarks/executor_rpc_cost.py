#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The executor's cost per RPC at TP=1, 2 and 4: pristine beside patched.

Each side runs in its own process: the real MultiprocExecutor RPC path and
real WorkerProc ranks (built through tests/patches/queue-event-ownership/
qeo_worker_pipeline.py: real output threads and shared-memory queues, the
ranks' busy loops as threads of the same process, the GPU worker a stand-in
that answers at once). It times N sequential execute_model RPCs (fault
tolerance off, sync scheduling; one reply, from the output rank, as vLLM
sends them) and prints the median and p90 in microseconds per TP size.

Sides alternate, process by process, for --rounds rounds, so drift of the
machine hits both alike; the last lines are the medians over rounds and the
patched - pristine difference. A tree is laid over the installed vllm with
scripts/with-patched-vllm; pristine is the installed vllm itself.

    python3 benchmarks/executor_rpc_cost.py --python ENV/bin/python --tree build/patched
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "tests" / "patches" / "queue-event-ownership"


def measure(tp_sizes: list[int], rpcs: int) -> dict[int, list[float]]:
    """Per TP size, the wall time of each execute_model RPC, in seconds."""
    sys.path.insert(0, str(HARNESS))
    import pytest
    from qeo_worker_pipeline import Pipeline

    timings: dict[int, list[float]] = {}
    for tp in tp_sizes:
        with pytest.MonkeyPatch.context() as monkeypatch:
            pipe = Pipeline(monkeypatch, lambda rank, method, batch: batch, world_size=tp, async_scheduling=False)
            try:
                for i in range(50):  # warm-up
                    pipe.executor.execute_model(i)
                samples = []
                for i in range(rpcs):
                    start = time.perf_counter()
                    pipe.executor.execute_model(i)
                    samples.append(time.perf_counter() - start)
                timings[tp] = samples
            finally:
                pipe.close()
    return timings


def run_side(python: str, tree: str | None, tp_sizes: list[int], rpcs: int) -> dict[int, float]:
    cmd = [python, __file__, "--child", "--rpcs", str(rpcs), "--tp", *map(str, tp_sizes)]
    if tree:
        cmd = [str(REPO / "scripts" / "with-patched-vllm"), "--tree", tree, "--", *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose installed vllm is pristine")
    parser.add_argument("--tree", help="patched vLLM tree laid over it (scripts/with-patched-vllm)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rpcs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        timings = measure(args.tp, args.rpcs)
        print(json.dumps({tp: statistics.median(s) * 1e6 for tp, s in timings.items()}))
        return 0
    if not args.tree:
        parser.error("--tree is required (the patched tree to compare with pristine)")

    results: dict[str, list[dict[int, float]]] = {"pristine": [], "patched": []}
    for rnd in range(args.rounds):
        for side, tree in (("pristine", None), ("patched", args.tree)):
            medians = run_side(args.python, tree, args.tp, args.rpcs)
            results[side].append(medians)
            shown = "  ".join(f"TP={tp} {us:7.1f} us" for tp, us in medians.items())
            print(f"round {rnd + 1} {side:8s} {shown}", flush=True)
    print(f"median per RPC over {args.rounds} rounds of {args.rpcs} sequential execute_model RPCs:")
    for tp in args.tp:
        pristine = statistics.median(r[tp] for r in results["pristine"])
        patched = statistics.median(r[tp] for r in results["patched"])
        difference = patched - pristine
        print(f"  TP={tp}: pristine {pristine:7.1f} us  patched {patched:7.1f} us  difference {difference:+6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
