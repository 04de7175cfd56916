#!/usr/bin/env python3
"""Does a 64 MiB reply survive the way the executor reads a worker's response queue?

    <runtime python> benchmarks/shm_overflow_dequeue_timeout.py [--mib 64] [--poll-s 0.05]

vLLM's MessageQueue (distributed/device_communicators/shm_broadcast.py) sends an object larger
than a ring chunk (24 MiB) as an "overflow": a marker in the shared-memory ring, then the payload
over a zmq socket. ``dequeue(timeout)`` takes the ring slot first and then waits up to the same
timeout for the payload. This runs one real queue as MultiprocExecutor builds a worker's response
queue (``MessageQueue(1, 1)``, writer in a child process, reader here) and reads one overflow
message two ways:

- one read: ``dequeue(timeout=30)``, as 0.32.0's executor reads a reply (until its deadline);
- polling: ``dequeue(timeout=--poll-s)`` retried on TimeoutError, as the carried executor patch
  reads the replying rank's queue while it watches the other ranks (_read_queue with
  FAILURE_POLL_INTERVAL_S = 0.05).

Prints, for each, whether the payload arrived intact and after how long (bounded at 30 s).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def writer(handle_queue: mp.Queue, go: mp.Event, size: int) -> None:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    queue = MessageQueue(1, 1)
    handle_queue.put(queue.export_handle())
    queue.wait_until_ready()
    go.wait(60)
    queue.enqueue(bytes(range(256)) * (size // 256))
    time.sleep(40)  # keep the queue (and its socket) alive while the reader reads


def read_once(mode: str, size: int, poll_s: float) -> str:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    ctx = mp.get_context("spawn")
    handles, go = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=writer, args=(handles, go, size), daemon=True)
    child.start()
    try:
        reader = MessageQueue.create_from_handle(handles.get(timeout=120), 0)
        reader.wait_until_ready()
        go.set()
        started = time.monotonic()
        timeouts = 0
        while time.monotonic() - started < 30:
            try:
                obj = reader.dequeue(timeout=30.0 if mode == "one read" else poll_s)
            except TimeoutError:
                timeouts += 1
                continue
            right = obj == bytes(range(256)) * (size // 256)
            return (
                f"{mode}: arrived after {time.monotonic() - started:.2f}s, intact {right}, {timeouts} timeout(s) before"
            )
        return f"{mode}: NOT arrived within 30s ({timeouts} timeouts of {poll_s}s)"
    finally:
        child.kill()
        child.join(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--poll-s", type=float, default=0.05)
    args = parser.parse_args()
    size = args.mib << 20
    for mode in ("one read", "polling"):
        print(read_once(mode, size, args.poll_s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
