# SPDX-License-Identifier: Apache-2.0
"""Regression tests: the worker's async output queue is bounded by what
EngineCore can have in flight (max_concurrent_batches), overload is reported
to the executor at once, and a rejected output leaves accepted ones intact.

Real executor RPC path, real WorkerProc (constructed by its __init__), output
thread and shared-memory message queues; the GPU worker and the hung GPU copy
are stand-ins (see qeo_worker_pipeline.py for each seam and why).
"""

from __future__ import annotations

import queue
import threading

import pytest
from qeo_worker_pipeline import GpuOutput, Pipeline
from vllm.v1.executor.multiproc_executor import WorkerProc

DELIVERY_BOUND_S = 1.0


def test_overload_is_rejected_and_reported_without_touching_accepted(monkeypatch):
    """Outputs stop draining (the first one's GPU work hangs) while RPCs keep
    arriving. Past the bound that max_concurrent_batches gives, the next
    output is rejected and the executor hears of it within the bound; the
    accepted outputs are neither dropped nor reordered."""
    release = threading.Event()
    pipe = Pipeline(monkeypatch, lambda batch: GpuOutput(batch, release))
    try:
        # async scheduling, no PP: EngineCore keeps 2 batches in flight, each
        # with at most two replies (execute_model, sample_tokens), plus one
        # blocking RPC.
        assert pipe.config.max_concurrent_batches == 2
        bound = 2 * 2 + 1
        batches = [f"b{i}" for i in range(bound + 1)]
        futures = [pipe.executor.execute_model(b, non_block=True) for b in batches]
        outcome = pipe.resolve_in_background(futures[0])
        try:
            kind, value = outcome.get(timeout=DELIVERY_BOUND_S)
        except queue.Empty:
            pytest.fail(
                f"{len(batches)} outputs piled up behind a stuck one and the "
                f"executor heard nothing within {DELIVERY_BOUND_S}s"
            )
        assert kind == "error"
        assert "unsent outputs" in str(value)
        assert all(f.done() for f in futures)
        assert pipe.executor.is_failed

        # The rejected output was not counted or queued; the accepted ones
        # are all still owned by the output thread.
        assert pipe.proc.num_unsent_async_outputs == bound
        release.set()
        got = [pipe.response_reader.dequeue(timeout=10) for _ in range(bound)]
        assert got == [(WorkerProc.ResponseStatus.SUCCESS, f"output of {b}") for b in batches[:bound]]
    finally:
        release.set()
        pipe.close()


def test_within_bound_everything_is_delivered(monkeypatch):
    """Guard: up to the bound, a slow first output only delays the others."""
    release = threading.Event()
    pipe = Pipeline(monkeypatch, lambda batch: GpuOutput(batch, release))
    try:
        batches = [f"b{i}" for i in range(2 * pipe.config.max_concurrent_batches + 1)]
        futures = [pipe.executor.execute_model(b, non_block=True) for b in batches]
        release.set()
        assert [f.result() for f in futures] == [f"output of {b}" for b in batches]
        assert not pipe.executor.is_failed
    finally:
        release.set()
        pipe.close()
