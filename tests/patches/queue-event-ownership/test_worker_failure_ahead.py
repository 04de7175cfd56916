# SPDX-License-Identifier: Apache-2.0
"""Regression tests: with async scheduling, a worker failure reaches the
executor while an earlier batch's output is stuck, and successful outputs keep
their order.

The real MultiprocExecutor RPC path (collective_rpc, FutureWrapper), the real
WorkerProc busy loop, output thread and output handling, and a real
shared-memory MessageQueue between them all run in this process. Only two
things are stand-ins, because they need a GPU or a second process:
- the model runner's AsyncModelRunnerOutput, whose get_output() blocks on a
  threading.Event instead of a CUDA event that never completes (hung GPU work);
- the RPC broadcast queue, replaced by an in-process inbox that hands the
  executor's request to the worker loop (the worker is not a separate
  process here).
Objects are built with __new__ plus the attributes __init__ sets for async
scheduling, as vLLM's own tests/v1/executor tests do, because WorkerProc's
__init__ loads a model.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc
from vllm.v1.outputs import AsyncModelRunnerOutput

# Bound from the issue: the failure must reach the executor within 1 s.
DELIVERY_BOUND_S = 1.0


class GpuOutput(AsyncModelRunnerOutput):
    """An async output whose device->host copy completes when released."""

    def __init__(self, name: str, release: threading.Event) -> None:
        self.name = name
        self.release = release

    def get_output(self) -> Any:
        assert self.release.wait(timeout=60), f"{self.name} never released"
        return f"output of {self.name}"

    def get_kv_connector_output(self) -> None:
        return None


class StopLoop(BaseException):
    pass


class Pipeline:
    """Executor and one async-scheduling worker joined by a real MessageQueue."""

    def __init__(self, step) -> None:
        writer = MessageQueue(1, 1)
        reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
        ready = threading.Thread(target=writer.wait_until_ready, daemon=True)
        ready.start()
        reader.wait_until_ready()
        ready.join(timeout=10)

        inbox: queue.Queue = queue.Queue()

        def next_rpc(indefinite: bool) -> Any:
            item = inbox.get(timeout=120)
            if item is None:
                raise StopLoop
            return item

        proc: Any = WorkerProc.__new__(WorkerProc)
        proc.rank = 0
        proc.worker = SimpleNamespace(execute_model=step)
        proc.rpc_broadcast_mq = SimpleNamespace(dequeue=next_rpc)
        proc.worker_response_mq = writer
        # What WorkerProc.__init__ sets up when async scheduling is on.
        proc.use_async_scheduling = True
        proc.async_output_queue = queue.Queue()
        proc.num_unsent_async_outputs = 0
        proc.response_mq_lock = threading.Lock()
        self.proc = proc
        self.inbox = inbox

        executor: Any = MultiprocExecutor.__new__(MultiprocExecutor)
        executor.is_failed = False
        executor.output_rank = 0
        executor.futures_queue = deque()
        executor.rpc_broadcast_mq = SimpleNamespace(enqueue=inbox.put)
        executor.response_mqs = [reader]
        executor.kv_output_aggregator = None
        executor.ec_output_aggregator = None
        executor.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(enable_fault_tolerance=False))
        self.executor = executor
        self.mqs = (writer, reader)

        threading.Thread(target=proc.async_output_busy_loop, daemon=True, name="test-output").start()
        self.rpc_thread = threading.Thread(target=self._serve, daemon=True, name="test-worker")
        self.rpc_thread.start()

    def _serve(self) -> None:
        try:
            self.proc.worker_busy_loop()
        except StopLoop:
            pass

    def resolve_in_background(self, future) -> queue.Queue:
        """Wait on future.result() in a thread; its outcome lands in a queue."""
        outcome: queue.Queue = queue.Queue()

        def wait() -> None:
            try:
                outcome.put(("result", future.result()))
            except Exception as e:
                outcome.put(("error", e))

        threading.Thread(target=wait, daemon=True).start()
        return outcome

    def close(self) -> None:
        self.inbox.put(None)
        self.rpc_thread.join(timeout=10)


def test_failure_not_held_behind_stuck_output():
    """Batch A's output is stuck on the GPU; batch B raised. The executor,
    waiting on A, must learn of the failure within the bound, not at
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS."""
    release_a = threading.Event()

    def step(batch: str) -> Any:
        if batch == "A":
            return GpuOutput("A", release_a)
        raise RuntimeError(f"illegal memory access in batch {batch}")

    pipe = Pipeline(step)
    try:
        future_a = pipe.executor.execute_model("A", non_block=True)
        future_b = pipe.executor.execute_model("B", non_block=True)
        outcome = pipe.resolve_in_background(future_a)
        try:
            kind, value = outcome.get(timeout=DELIVERY_BOUND_S)
        except queue.Empty:
            pytest.fail(
                "batch B's failure did not reach the executor within "
                f"{DELIVERY_BOUND_S}s while batch A's output was stuck"
            )
        assert kind == "error"
        assert "illegal memory access in batch B" in str(value)
        # B's own future is failed too, and the executor takes no new work:
        # responses after an out-of-order failure cannot be attributed.
        assert future_b.done()
        with pytest.raises(RuntimeError, match="batch B"):
            future_b.result()
        assert pipe.executor.is_failed
    finally:
        release_a.set()
        pipe.close()


def test_successful_outputs_keep_order():
    """Ordering guard: a slow earlier output is still delivered before a
    fast later one, each to its own RPC."""
    release = {"A": threading.Event(), "B": threading.Event()}
    release["B"].set()

    pipe = Pipeline(lambda batch: GpuOutput(batch, release[batch]))
    try:
        future_a = pipe.executor.execute_model("A", non_block=True)
        future_b = pipe.executor.execute_model("B", non_block=True)
        outcome_b = pipe.resolve_in_background(future_b)
        release["A"].set()
        assert outcome_b.get(timeout=10) == ("result", "output of B")
        assert future_a.result() == "output of A"
        assert not pipe.executor.is_failed
    finally:
        for ev in release.values():
            ev.set()
        pipe.close()


def test_failure_with_nothing_pending_keeps_rpc_order():
    """Guard: with no earlier output unsent, a failure takes its place in
    order and the executor stays usable, as before."""
    pipe = Pipeline(lambda batch: (_ for _ in ()).throw(RuntimeError("bad batch")))
    try:
        with pytest.raises(RuntimeError, match="bad batch"):
            pipe.executor.execute_model("A")
        assert not pipe.executor.is_failed
    finally:
        pipe.close()
