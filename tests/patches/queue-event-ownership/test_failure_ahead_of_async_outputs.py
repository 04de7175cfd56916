# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: with async scheduling, a worker failure reaches the
waiting caller within 1 s while an earlier batch's output is stuck on the
GPU; with fault tolerance on, earlier outputs that do arrive are delivered
however slow (as on vLLM 0.33.0), without it the executor fails at once;
outputs keep their order, and a failure with nothing unsent keeps its place.

Real executor RPC path, real WorkerProc (constructed by its __init__, its
busy loop in its own thread), output thread and shared-memory message
queues; the GPU worker and the hung GPU copy are stand-ins, see
qeo_worker_pipeline.py for each seam and why.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from qeo_worker_pipeline import GpuOutput, Pipeline, as_the_engine_core, outcome_within_bound


def test_failure_not_held_behind_stuck_output(monkeypatch):
    """Fault tolerance off, async scheduling: batch A's output is stuck on the
    GPU, batch B raised. The caller, waiting on A, learns of B's failure
    within the bound, not at VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; the
    executor fails, as the failure ends the engine anyway."""
    release_a = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        if batch == "A":
            return GpuOutput("A", release_a)
        raise RuntimeError(f"illegal memory access in batch {batch}")

    pipe = Pipeline(monkeypatch, step)
    try:
        future_a = pipe.executor.execute_model("A", non_block=True)
        future_b = pipe.executor.execute_model("B", non_block=True)
        kind, value = outcome_within_bound(pipe, future_a, "batch B's failure")
        assert kind == "error"
        assert "illegal memory access in batch B" in str(value)
        assert future_b.done()
        with pytest.raises(RuntimeError, match="batch B"):
            future_b.result()
        assert pipe.executor.is_failed
    finally:
        release_a.set()
        pipe.close()


def test_fault_tolerance_delivers_earlier_output_slower_than_a_grace(monkeypatch):
    """Fault tolerance on, as on 0.33.0: batch B fails while batch A's copy
    is healthy but slow (it completes 1.5 s after B failed, longer than any
    fixed grace a failure could be given). A is delivered, B fails with "One
    or more workers failed", the executor stays usable and the next batch
    gets its own output."""
    release_a = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        if batch in ("A", "C"):
            return GpuOutput(batch, release_a)
        threading.Timer(1.5, release_a.set).start()
        raise RuntimeError(f"illegal memory access in batch {batch}")

    pipe = Pipeline(monkeypatch, step, fault_tolerance=True)
    try:
        future_a = pipe.executor.execute_model("A", non_block=True)
        future_b = pipe.executor.execute_model("B", non_block=True)
        outcome_a = pipe.resolve_in_background(future_a)
        assert outcome_a.get(timeout=10) == ("result", "output of A")
        with pytest.raises(RuntimeError, match="One or more workers failed"):
            future_b.result()
        assert not pipe.executor.is_failed
        assert pipe.executor.execute_model("C") == "output of C"
    finally:
        release_a.set()
        pipe.close()


def test_fault_tolerance_keeps_earlier_output_that_arrives(monkeypatch):
    """Fault tolerance on, as on 0.33.0: B fails while A's copy is merely
    slow (it completes 0.2 s later). A is delivered, B fails with "One or
    more workers failed", the executor stays usable."""
    release_a = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        if batch in ("A", "C"):
            return GpuOutput(batch, release_a)
        threading.Timer(0.2, release_a.set).start()
        raise RuntimeError(f"illegal memory access in batch {batch}")

    pipe = Pipeline(monkeypatch, step, fault_tolerance=True)
    try:
        future_a = pipe.executor.execute_model("A", non_block=True)
        future_b = pipe.executor.execute_model("B", non_block=True)
        assert outcome_within_bound(pipe, future_a, "batch A") == ("result", "output of A")
        with pytest.raises(RuntimeError, match="One or more workers failed"):
            future_b.result()
        assert not pipe.executor.is_failed
        assert pipe.executor.execute_model("C") == "output of C"
    finally:
        release_a.set()
        pipe.close()


def test_successful_outputs_keep_order(monkeypatch):
    """Ordering guard: a slow earlier output is still delivered before a
    fast later one, each to its own RPC."""
    release = {"A": threading.Event(), "B": threading.Event()}
    release["B"].set()

    pipe = Pipeline(monkeypatch, lambda rank, method, batch: GpuOutput(batch, release[batch]))
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


def test_failure_with_nothing_pending_keeps_rpc_order(monkeypatch):
    """Guard: with no earlier output unsent, a failure takes its place in
    order and the executor stays usable, as before."""

    def step(rank: int, method: str, batch: Any) -> Any:
        if batch == "A":
            raise RuntimeError("bad batch")
        return f"output of {batch}"

    pipe = Pipeline(monkeypatch, step)
    try:
        with pytest.raises(RuntimeError, match="bad batch"):
            pipe.executor.execute_model("A")
        assert not pipe.executor.is_failed
        assert pipe.executor.execute_model("B") == "output of B"
    finally:
        pipe.close()


def test_failed_utility_call_behind_an_unsent_output_keeps_the_executor(monkeypatch):
    """Passes on 0.33.0: TP=1, async scheduling (vLLM's default), fault
    tolerance off. Batch A's output is still on its way to the host when a
    utility RPC raises on the worker (add_lora of an adapter the worker
    rejects). A is delivered, the error reaches the add_lora caller, the
    executor is not failed and the next batch gets its own output: a failed
    utility call fails only itself, only a failed model step ends the
    executor."""
    release_a = threading.Event()
    rejected = "LoRA rank 64 is greater than max_lora_rank 16"

    def step(rank: int, method: str, batch: Any) -> Any:
        if method == "add_lora":
            threading.Timer(0.3, release_a.set).start()
            raise ValueError(rejected)
        return GpuOutput(batch, release_a)

    pipe = Pipeline(monkeypatch, step)
    try:

        def engine_core() -> tuple[Any, Any]:
            # One thread, as the engine core's busy loop: the blocking
            # utility RPC first waits for batch A's future.
            future_a = pipe.executor.execute_model("A", non_block=True)
            try:
                pipe.executor.collective_rpc("add_lora", args=("lora",))
            except Exception as e:
                return future_a.exception() or future_a.result(), e
            pytest.fail("add_lora returned although the worker rejected the adapter")

        output_a, error = as_the_engine_core(engine_core)
        assert output_a == "output of A"
        assert rejected in str(error)
        assert not pipe.executor.is_failed
        assert pipe.executor.execute_model("B") == "output of B"
    finally:
        release_a.set()
        pipe.close()
