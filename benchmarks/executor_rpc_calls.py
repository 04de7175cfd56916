#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python and C calls the executor's thread makes per RPC: pristine beside patched.

A count does not drift with the machine's load as a time does: it names what a successful RPC
does on top of 0.33.0's path. Built as benchmarks/executor_rpc_cost.py builds the executor (real
MultiprocExecutor, WorkerProc ranks as threads, shared-memory queues, a stand-in worker that
answers at once), it counts, with a profile hook on the calling thread, every call made during N
sequential execute_model RPCs after a warm-up. The calls of the spin-wait (how often a wait
loops depends on timing, not on the code) are counted apart.

    python3 benchmarks/executor_rpc_calls.py --python ENV/bin/python --tree build/patched [--tp 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "tests" / "patches" / "queue-event-ownership"
# Calls whose number follows how long a wait lasts (the readers' spin loop), not the code path.
SPIN = {
    *("_wait_until_readable", "check_readable", "timeout_ms", "wait", "should_warn", "sched_yield"),
    *("monotonic", "min", "memory_fence", "lock.__exit__", "buf"),
}


def count(tp: int, rpcs: int, async_scheduling: bool) -> dict[str, float]:
    """Calls per RPC on the calling thread: {name: count}, spin-wait calls under their own key."""
    sys.path.insert(0, str(HARNESS))
    import pytest
    from qeo_worker_pipeline import Pipeline

    counts: collections.Counter[str] = collections.Counter()
    active = False

    def hook(frame, event, arg) -> None:  # type: ignore[no-untyped-def]
        if not active or event not in ("call", "c_call"):
            return
        if event == "call":
            name = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
            short = frame.f_code.co_name
        else:
            short = getattr(arg, "__qualname__", str(arg))
            name = f"C:{short}"
        counts["(spin-wait)" if short in SPIN else name] += 1

    with pytest.MonkeyPatch.context() as monkeypatch:
        pipe = Pipeline(
            monkeypatch, lambda rank, method, batch: batch, world_size=tp, async_scheduling=async_scheduling
        )
        try:
            for i in range(50):
                pipe.executor.execute_model(i)
            time.sleep(1.5)  # the warm-up's readers settle (see executor_rpc_cost.py)
            sys.setprofile(hook)
            active = True
            for i in range(rpcs):
                pipe.executor.execute_model(i)
            active = False
            sys.setprofile(None)
        finally:
            pipe.close()
    return {name: n / rpcs for name, n in counts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose installed vllm is pristine")
    parser.add_argument("--tree", help="patched vLLM tree laid over it (scripts/with-patched-vllm)")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--rpcs", type=int, default=400)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(count(args.tp, args.rpcs, args.async_scheduling)))
        return 0
    if not args.tree:
        parser.error("--tree is required (the patched tree to compare with pristine)")
    sides = {}
    for side, tree in (("pristine", None), ("patched", args.tree)):
        cmd = [args.python, __file__, "--child", "--tp", str(args.tp), "--rpcs", str(args.rpcs)]
        cmd += ["--async-scheduling"] if args.async_scheduling else []
        if tree:
            cmd = [str(REPO / "scripts" / "with-patched-vllm"), "--tree", tree, "--", *cmd]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        sides[side] = json.loads(out.strip().splitlines()[-1])
    pristine, patched = sides["pristine"], sides["patched"]
    work = {side: sum(n for name, n in calls.items() if name != "(spin-wait)") for side, calls in sides.items()}
    print(f"calls per RPC on the calling thread, TP={args.tp}, {args.rpcs} RPCs, spin-wait apart:")
    print(
        f"  pristine {work['pristine']:.1f}  patched {work['patched']:.1f}  ({work['patched'] - work['pristine']:+.1f})"
    )
    print("  where they differ (per RPC, pristine -> patched):")
    for name in sorted(set(pristine) | set(patched)):
        a, b = pristine.get(name, 0.0), patched.get(name, 0.0)
        if name != "(spin-wait)" and abs(a - b) >= 0.01:
            print(f"    {name:60s} {a:6.2f} -> {b:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
