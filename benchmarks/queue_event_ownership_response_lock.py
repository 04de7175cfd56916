#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How long the worker's RPC thread waits in handle_output while the output
thread sends large outputs (async scheduling).

With async scheduling the output thread serializes and writes each
ModelRunnerOutput into the shared-memory response queue. If handle_output
takes the lock the output thread holds for that (the first version of the
failure-ahead patch did), the RPC thread, which calls handle_output right
after each execute_model / sample_tokens, waits for a whole serialization
before it can take the next RPC.

This prints, per batch size (ModelRunnerOutput with one sampled token and
top-20 logprobs per request, the arrays as the sampler returns them):

* the serialized size and the time of one MessageQueue.enqueue of it on a
  real shared-memory queue with a reader draining it (the time the lock is
  held per output);
* the time of each WorkerProc.handle_output call on the RPC thread of a real
  WorkerProc (built through tests/patches/queue-event-ownership/
  qeo_worker_pipeline.py, real output thread and queues) while the executor
  keeps two batches in flight, as EngineCore does: median, p99, max.

Pass ``--tree OLD_TREE --tree NEW_TREE`` to run the measurement once per tree
through ``scripts/with-patched-vllm`` (each tree's vllm files laid over the
installed package). CPU only; no GPU needed.

    python3 benchmarks/queue_event_ownership_response_lock.py
    python3 benchmarks/queue_event_ownership_response_lock.py --tree A --tree B
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "patches" / "queue-event-ownership"))

NUM_LOGPROBS = 20


def model_runner_output(batch: int) -> Any:
    import numpy as np
    from vllm.v1.outputs import LogprobsLists, ModelRunnerOutput

    rng = np.random.default_rng(0)
    req_ids = [f"cmpl-{i:032x}-0" for i in range(batch)]
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[int(t)] for t in rng.integers(0, 151_000, batch)],
        logprobs=LogprobsLists(
            logprob_token_ids=rng.integers(0, 151_000, (batch, NUM_LOGPROBS + 1), dtype=np.int32),
            logprobs=rng.standard_normal((batch, NUM_LOGPROBS + 1), dtype=np.float32),
            sampled_token_ranks=rng.integers(0, 20, batch, dtype=np.int32),
        ),
    )


def enqueue_cost(output: Any, rounds: int) -> tuple[int, float]:
    import pickle

    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    writer = MessageQueue(1, 1)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
    t = threading.Thread(target=reader.wait_until_ready, daemon=True)
    t.start()
    writer.wait_until_ready()
    t.join()
    drain = threading.Thread(target=lambda: [reader.dequeue(timeout=30) for _ in range(rounds)], daemon=True)
    drain.start()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        writer.enqueue(("SUCCESS", output))
        times.append(time.perf_counter() - start)
    drain.join()
    return len(pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)), statistics.median(times)


def handle_output_waits(output: Any, steps: int) -> list[float]:
    import pytest
    from qeo_worker_pipeline import GpuOutput, Pipeline
    from vllm.v1.executor.multiproc_executor import WorkerProc

    done = threading.Event()
    done.set()

    class Ready(GpuOutput):
        def get_output(self) -> Any:
            return output

    waits: list[float] = []
    mp = pytest.MonkeyPatch()
    try:
        pipe = Pipeline(mp, lambda rank, method, batch: Ready(batch, done))
        original = WorkerProc.handle_output

        def timed(out: Any) -> None:
            start = time.perf_counter()
            original(pipe.proc, out)
            waits.append(time.perf_counter() - start)

        pipe.proc.handle_output = timed  # type: ignore[method-assign]
        in_flight: list[Any] = []
        for i in range(steps):
            in_flight.append(pipe.executor.execute_model(f"b{i}", non_block=True))
            if len(in_flight) == 2:  # EngineCore's batch queue with async scheduling
                in_flight.pop(0).result()
        for f in in_flight:
            f.result()
        pipe.close()
    finally:
        mp.undo()
    return waits


def measure(batches: list[int], steps: int) -> None:
    import vllm

    print(f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}; {os.cpu_count()} CPUs")
    print(f"{'batch':>6} {'bytes':>10} {'enqueue ms':>11} {'handle_output ms: p50':>22} {'p99':>8} {'max':>8}")
    for batch in batches:
        output = model_runner_output(batch)
        size, cost = enqueue_cost(output, rounds=50)
        waits = sorted(handle_output_waits(output, steps))
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        print(
            f"{batch:>6} {size:>10,} {cost * 1e3:>11.3f} {statistics.median(waits) * 1e3:>22.3f}"
            f" {p99 * 1e3:>8.3f} {waits[-1] * 1e3:>8.3f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 256, 1024)")
    parser.add_argument("--steps", type=int, default=400, help="execute_model RPCs per batch size")
    parser.add_argument("--tree", action="append", default=[], help="run once per vLLM tree")
    args = parser.parse_args()
    batches = args.batch or [256, 1024]
    if not args.tree:
        measure(batches, args.steps)
        return 0
    for tree in args.tree:
        print(f"== {tree}", flush=True)
        runner = str(REPO / "scripts" / "with-patched-vllm")
        cmd = [runner, "--tree", tree, "--", sys.executable, __file__, "--steps", str(args.steps)]
        for b in batches:
            cmd += ["--batch", str(b)]
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
