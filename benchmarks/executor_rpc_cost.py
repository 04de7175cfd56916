#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The executor's cost per RPC at TP=1, 2 and 4: pristine beside patched.

Each side runs in its own process: the real MultiprocExecutor RPC path and
real WorkerProc ranks (the stand-in GPU worker and the executor of
tests/patches/queue-event-ownership/qeo_worker_pipeline.py: real output
threads and shared-memory queues; the GPU worker a stand-in that answers at
once). The ranks are forked processes started by WorkerProc's own
make_worker_process / worker_main, as vLLM starts them (--ranks threads: the
harness's threads of the timed process instead, which share its GIL). It
times N sequential execute_model RPCs (fault tolerance off; sync scheduling,
or --async-scheduling where each rank's output thread sends its outputs; one
reply, from the output rank, as vLLM sends them) and prints the median in
microseconds per TP size. With
--ranks played no rank runs: the timed process writes each reply (through
the output rank's WorkerProc.handle_output) before the RPC and takes the
request off the ranks' queues after it, untimed, so what is timed is the
executor's own work per RPC, without a wait on another thread or process.

Sides alternate, process by process, for --rounds rounds, so drift of the
machine hits them alike (--before adds an earlier revision's tree to the
alternation, and pristine runs twice a round: the second, "control", is
what the machine alone makes of two identical sides). Printed last: the
medians over rounds, the paired difference per round with a sign test
(a side is distinguishable from pristine where p < 0.05; read it beside
the control's), and the fastest round of each side: on a shared 2-core
machine a round is sometimes slowed several-fold by other work (the ranks
spin while they wait, and TP=2 already needs three busy cores), and the least
disturbed round is the closest to an idle machine.
A tree is laid over the installed vllm with scripts/with-patched-vllm;
pristine is the installed vllm itself. With --pythonpath-of-trees (a machine
without the installed vllm, such as the device machine: see
benchmarks/executor_rpc_cost_device.sh) every tree is a whole vllm/ package
put first on PYTHONPATH, and --pristine names pristine's.

    python3 benchmarks/executor_rpc_cost.py --python ENV/bin/python --tree build/patched
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "tests" / "patches" / "queue-event-ownership"
SETTLE_S = 1.5


class RanksAsProcesses:
    """The ranks as vLLM runs them, each its own process.

    WorkerProc.make_worker_process forks each rank (VLLM_WORKER_MULTIPROC_METHOD
    is fork, vLLM's default, so the child runs the stand-in worker set up here),
    WorkerProc.worker_main builds its WorkerProc and runs its busy loop, and
    WorkerProc.wait_for_ready hands back the response queues the executor reads.
    With the ranks as threads of one process (--ranks threads, the harness's
    Pipeline) they share the executor's GIL; as processes they spin on cores of
    their own, as on a GPU host.
    """

    def __init__(self, monkeypatch, step, world_size: int, async_scheduling: bool) -> None:
        from qeo_worker_pipeline import config_view, executor_over, use_stand_in_worker
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
        from vllm.utils.system_utils import get_mp_context
        from vllm.v1.executor.multiproc_executor import WorkerProc

        use_stand_in_worker(monkeypatch, step)
        config = config_view(world_size, async_scheduling, fault_tolerance=False)
        broadcast = MessageQueue(world_size, world_size)
        lock = get_mp_context().Lock()
        # As the executor's _init_executor: each forked rank closes the pipes
        # of the ranks forked before it, so closing a death pipe here ends
        # that rank.
        inherited_fds: list[int] = []
        unready = []
        for rank in range(world_size):
            handle = WorkerProc.make_worker_process(
                config, rank, rank, "", broadcast.export_handle(), lock, rank == 0, inherited_fds=inherited_fds
            )
            unready.append(handle)
            inherited_fds += [handle.death_writer.fileno(), handle.ready_pipe.fileno()]
        workers = WorkerProc.wait_for_ready(unready)
        broadcast.wait_until_ready()
        for worker in workers:
            worker.worker_response_mq.wait_until_ready()
        self.executor = executor_over(config, broadcast, [w.worker_response_mq for w in workers])
        self.executor.workers = workers

    def close(self) -> None:
        # The executor's own shutdown: it closes each rank's death pipe, waits
        # for the ranks to exit (then SIGTERM, SIGKILL) and shuts the queues.
        self.executor.shutdown()
        # The broadcast queue's shared memory is unlinked when its
        # MessageQueue is collected; without a collection here one segment
        # was left at exit (the resource tracker warned of it).
        gc.collect()


def _played_rpc(pipe):
    """execute_model with no rank running: its reply is written first, by
    the output rank's own WorkerProc.handle_output (sync scheduling), and the
    request is taken off every rank's broadcast reader afterwards, neither
    timed. What is timed is the executor's own work per RPC (send, read a
    reply already there, bookkeeping), free of any wait on another thread or
    process: a figure a 2-core machine measures as steadily as an idle one."""
    executor = pipe.executor
    output_proc = pipe.procs[executor.output_rank]
    readers = [proc.rpc_broadcast_mq for proc in pipe.procs]
    timed = _timed_rpc(executor)

    def rpc(i: int) -> float:
        output_proc.handle_output(i)
        elapsed = timed(i)
        for reader in readers:
            reader.dequeue()
        return elapsed

    return rpc


def _timed_rpc(executor):
    """One sequential execute_model RPC, its wall time in seconds."""

    def rpc(i: int) -> float:
        start = time.perf_counter()
        executor.execute_model(i)
        return time.perf_counter() - start

    return rpc


def measure(
    tp_sizes: list[int], rpcs: int, async_scheduling: bool = False, ranks: str = "processes"
) -> dict[int, list[float]]:
    """Per TP size, the wall time of each execute_model RPC, in seconds."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    sys.path.insert(0, str(HARNESS))
    import pytest
    from qeo_worker_pipeline import Pipeline

    def step(rank, method, batch):
        return batch

    timings: dict[int, list[float]] = {}
    for tp in tp_sizes:
        with pytest.MonkeyPatch.context() as monkeypatch:
            if ranks == "processes":
                pipe = RanksAsProcesses(monkeypatch, step, tp, async_scheduling)
            else:
                pipe = Pipeline(
                    monkeypatch, step, world_size=tp, async_scheduling=async_scheduling, serve=ranks == "threads"
                )
            try:
                timed_rpc = _played_rpc(pipe) if ranks == "played" else _timed_rpc(pipe.executor)
                for i in range(50):  # warm-up
                    timed_rpc(i)
                timings[tp] = [timed_rpc(i) for i in range(rpcs)]
            finally:
                pipe.close()
        if ranks == "threads":
            # The closed pipeline's reader threads spin (sched_yield, holding
            # the GIL between yields) until their queues' SpinCondition goes
            # idle, busy_loop_s (1 s) after their last read: the next TP size
            # is timed only after that. Ranks as processes have exited.
            time.sleep(SETTLE_S)
    return timings


SIGNIFICANCE = 0.05


def sign_test(slower: int, rounds: int) -> float:
    """Two-sided p of `slower` rounds of `rounds` under "either side as likely to be slower"."""
    if rounds == 0:
        return 1.0
    tail = min(slower, rounds - slower)
    return min(1.0, 2 * sum(math.comb(rounds, k) for k in range(tail + 1)) / 2**rounds)


def run_side(
    python: str,
    tree: str | None,
    tp_sizes: list[int],
    rpcs: int,
    async_scheduling: bool = False,
    pythonpath: bool = False,
    ranks: str = "processes",
) -> dict[int, float]:
    cmd = [python, __file__, "--child", "--rpcs", str(rpcs), "--ranks", ranks, "--tp", *map(str, tp_sizes)]
    if async_scheduling:
        cmd.append("--async-scheduling")
    env = None
    if tree and pythonpath:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))
    elif tree:
        cmd = [str(REPO / "scripts" / "with-patched-vllm"), "--tree", tree, "--", *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose installed vllm is pristine")
    parser.add_argument("--tree", help="patched vLLM tree laid over it (scripts/with-patched-vllm)")
    parser.add_argument(
        "--before", help="an earlier revision's patched tree, timed in the same alternation (before/after figures)"
    )
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rpcs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="the ranks as with async scheduling (outputs sent by each rank's output thread)",
    )
    parser.add_argument(
        "--pythonpath-of-trees",
        action="store_true",
        help="each tree is a whole vllm/ package put first on PYTHONPATH (no installed vllm needed)",
    )
    parser.add_argument("--pristine", help="with --pythonpath-of-trees: pristine's tree")
    parser.add_argument(
        "--ranks",
        choices=["processes", "threads", "played"],
        default="processes",
        help="each rank its own forked process, as vLLM runs them (default); a thread of the timed process;"
        " or played by the timed process between RPCs, timing the executor's own work alone",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        timings = measure(args.tp, args.rpcs, args.async_scheduling, args.ranks)
        print(json.dumps({tp: statistics.median(s) * 1e6 for tp, s in timings.items()}))
        return 0
    if not args.tree:
        parser.error("--tree is required (the patched tree to compare with pristine)")
    if args.ranks == "played" and args.async_scheduling:
        # With async scheduling the output thread, not the caller, writes the
        # reply: the RPC would wait on it.
        parser.error("--ranks played times sync scheduling only (drop --async-scheduling)")

    if args.pythonpath_of_trees and not args.pristine:
        parser.error("--pythonpath-of-trees needs --pristine (pristine's tree)")
    sides: list[tuple[str, str | None]] = [("pristine", args.pristine), ("patched", args.tree)]
    if args.before:
        sides.append(("before", args.before))
    # Pristine once more in every round: its differences from the first pristine run are the
    # machine's own noise, the yardstick "distinguishable" is read against below.
    sides.append(("control", args.pristine))
    results: dict[str, list[dict[int, float]]] = {side: [] for side, _ in sides}
    for rnd in range(args.rounds):
        for side, tree in sides:
            medians = run_side(
                args.python, tree, args.tp, args.rpcs, args.async_scheduling, args.pythonpath_of_trees, args.ranks
            )
            results[side].append(medians)
            shown = "  ".join(f"TP={tp} {us:7.1f} us" for tp, us in medians.items())
            print(f"round {rnd + 1} {side:8s} {shown}", flush=True)
    print(f"median per RPC over {args.rounds} rounds of {args.rpcs} sequential execute_model RPCs:")
    for tp in args.tp:
        pristine = statistics.median(r[tp] for r in results["pristine"])
        line = f"  TP={tp}: pristine {pristine:7.1f} us"
        for side in [s for s in results if s != "pristine"]:
            value = statistics.median(r[tp] for r in results[side])
            line += f"  {side} {value:7.1f} us ({value - pristine:+6.1f} us)"
        print(line)
    # Paired within each round (the sides ran one after the other): the
    # median difference, in how many rounds the side was slower, and the
    # two-sided sign test's p. "control" is pristine beside itself: what the
    # machine alone makes of two identical sides.
    print(f"paired by round ({args.rounds} rounds; distinguishable: sign test p < {SIGNIFICANCE}):")
    for tp in args.tp:
        line = f"  TP={tp}:"
        for side in [s for s in results if s != "pristine"]:
            diffs = [r[tp] - p[tp] for r, p in zip(results[side], results["pristine"], strict=True)]
            slower = sum(d > 0 for d in diffs)
            p_value = sign_test(slower, sum(d != 0 for d in diffs))
            verdict = "distinguishable" if p_value < SIGNIFICANCE else "not distinguishable"
            line += (
                f"  {side} {statistics.median(diffs):+6.1f} us, slower in {slower}/{len(diffs)} rounds"
                f" (p={p_value:.3f}, {verdict})"
            )
        print(line)
    # On a shared machine some rounds are slowed by other work; the least
    # disturbed round of each side is the closest to an idle machine.
    print(f"fastest round of {args.rounds}:")
    for tp in args.tp:
        pristine = min(r[tp] for r in results["pristine"])
        line = f"  TP={tp}: pristine {pristine:7.1f} us"
        for side in [s for s in results if s != "pristine"]:
            value = min(r[tp] for r in results[side])
            line += f"  {side} {value:7.1f} us ({value - pristine:+6.1f} us)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
