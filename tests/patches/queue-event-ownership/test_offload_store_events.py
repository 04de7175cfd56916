# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: each offload store owns its compute-done event; a
preemption flush in CPU mode also waits for stores that are still queued, for
at most flush_timeout_s; a flush in disk mode does not wait for the write
backlog (as in 0.33.0).

The real SimpleCPUOffloadWorker runs here with each real backend: the
DmaCopyBackend (its copy thread and queue) and the DiskBackend (its store and
load IO threads, staging buffers and a real file written with pwritev). Only
what needs a GPU is replaced, at the narrowest seam (see qeo_cuda_model.py):
``torch.Event``, ``torch.cuda.current_stream`` and the backends' streams
(CUDA events and streams), the backend modules' ``build_params`` /
``copy_blocks`` (the cuMemcpyBatchAsync launch) and ``pin_tensor``
(cudaHostRegister), and ``current_platform.set_device`` (the IO thread's first
CUDA call, used as the gate that delays the copy thread deterministically).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import vllm.v1.simple_kv_offload.copy_backend as copy_backend
import vllm.v1.simple_kv_offload.disk_backend as disk_backend
from qeo_cuda_model import FakeCopyEngine, FakeEvent, FakeStream, Gate, OrderingLog
from vllm.v1.simple_kv_offload.copy_backend import DmaCopyBackend
from vllm.v1.simple_kv_offload.disk_backend import DiskBackend
from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata
from vllm.v1.simple_kv_offload.worker import SimpleCPUOffloadWorker


class Harness:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: str, tmp_path) -> None:
        self.log = OrderingLog()
        self.compute = FakeStream(self.log, "compute")
        self.copies = FakeCopyEngine(self.log)
        self.gate = Gate()
        monkeypatch.setattr(torch, "Event", lambda *a, **k: FakeEvent(self.log))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: self.compute)
        module = copy_backend if kind == "dma" else disk_backend
        monkeypatch.setattr(module, "build_params", self.copies.build_params)
        monkeypatch.setattr(module, "copy_blocks", self.copies.copy_blocks)
        monkeypatch.setattr(module, "current_platform", self.gate)

        gpu_cache = {"k": torch.zeros(8, 16, dtype=torch.int8)}
        load_stream = FakeStream(self.log, "load")
        store_stream = FakeStream(self.log, "store")
        self.worker = SimpleCPUOffloadWorker(None, None, 0)
        self.backend: DmaCopyBackend | DiskBackend
        if kind == "dma":
            self.backend = DmaCopyBackend()
            self.backend.init(
                gpu_cache,
                {"k": torch.zeros(8, 16, dtype=torch.int8)},
                torch.device("cpu"),
                load_stream,
                store_stream,
            )
        else:
            monkeypatch.setattr(disk_backend, "pin_tensor", lambda t: None)
            self.backend = DiskBackend()
            self.backend.init(
                gpu_cache,
                torch.device("cpu"),
                load_stream,
                store_stream,
                str(tmp_path / "kv-offload"),
                num_disk_slots=8,
                total_block_bytes=16,
                num_buffer_slots=2,
                use_page_cache=True,
            )
        self.worker._backend = self.backend

    def step_store(self, step: str, event_idx: int, gpu_block: int) -> None:
        """One model step whose KV writes (on the compute stream) get stored."""
        self.compute.step = step
        self.worker.bind_connector_metadata(
            SimpleCPUOffloadMetadata(
                store_event=event_idx,
                store_gpu_blocks=[gpu_block],
                store_cpu_blocks=[gpu_block],
            )
        )
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()

    def close(self) -> None:
        self.gate.open()
        self.backend.shutdown()


@pytest.fixture(params=["dma", "disk"])
def harness(request, monkeypatch, tmp_path):
    h = Harness(monkeypatch, request.param, tmp_path)
    yield h
    h.close()


def test_each_store_waits_on_its_own_step(harness):
    """A records, B records, then the copy thread runs: A's store must be
    ordered after A's compute, not after whatever was recorded last."""
    harness.step_store("A", event_idx=0, gpu_block=1)
    harness.step_store("B", event_idx=1, gpu_block=2)
    harness.gate.open()

    store_a, store_b = harness.copies.wait_for_copies(2)
    assert store_a.src_blocks == [1] and store_b.src_blocks == [2]
    waited_a = [r.step for r in store_a.waited_on if r is not None]
    waited_b = [r.step for r in store_b.waited_on if r is not None]
    assert waited_a == ["A"], (
        f"store of step A was ordered after the compute-done record of step(s) "
        f"{waited_a}, not its own (shared event re-recorded by step B)"
    )
    assert waited_b == ["B"]


def test_failed_launch_leaves_queued_store_event_alone(harness, monkeypatch):
    """A store that fails to submit must not touch the event of a store that
    was already accepted and is still queued."""
    harness.step_store("A", event_idx=0, gpu_block=1)

    def refuse(*args, **kwargs):
        raise RuntimeError("copy queue refused the store")

    monkeypatch.setattr(harness.backend, "launch_copy", refuse)
    with pytest.raises(RuntimeError, match="refused"):
        harness.step_store("B", event_idx=1, gpu_block=2)
    harness.gate.open()

    (store_a,) = harness.copies.wait_for_copies(1)
    assert [r.step for r in store_a.waited_on if r is not None] == ["A"]


@pytest.fixture
def dma_harness(monkeypatch, tmp_path):
    h = Harness(monkeypatch, "dma", tmp_path)
    yield h
    h.close()


@pytest.fixture
def disk_harness(monkeypatch, tmp_path):
    h = Harness(monkeypatch, "disk", tmp_path)
    yield h
    h.close()


def start_flush(harness: Harness) -> tuple[threading.Thread, dict]:
    """handle_preemptions on a thread of its own: (thread, outcome)."""
    outcome: dict = {}

    def flush() -> None:
        try:
            harness.worker.handle_preemptions(SimpleCPUOffloadMetadata(need_flush=True))
            outcome["returned"] = time.monotonic()
        except Exception as e:
            outcome["raised"] = e
        harness.log.add("flush returned")

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    return flusher, outcome


def test_flush_after_preemption_waits_for_queued_store(dma_harness):
    """The copy thread is delayed, so A's store is still queued when the
    scheduler asks for a flush. The flush must not return before that store
    was launched and its completion event synchronized: the preempted blocks
    are reused as soon as it returns."""
    dma_harness.step_store("A", event_idx=0, gpu_block=3)

    flushed = threading.Event()

    def flush() -> None:
        dma_harness.worker.handle_preemptions(SimpleCPUOffloadMetadata(need_flush=True))
        dma_harness.log.add("flush returned")
        flushed.set()

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    # Give a flush that ignores queued stores the chance to return while the
    # store is still queued; a correct flush cannot return in this window.
    flushed.wait(timeout=0.5)
    dma_harness.gate.open()
    flusher.join(timeout=10)
    assert not flusher.is_alive(), "flush never returned after the gate opened"

    order = [e for e in dma_harness.log.snapshot() if e[0] != "wait" and e[0] != "record"]
    returned_at = order.index(("flush returned",))
    before = order[:returned_at]
    assert ("synchronize", "copy:store:3") in before, (
        f"flush returned before the queued store was launched and synced: {order}"
    )
    # The synced store is no longer reported as in flight.
    assert dma_harness.worker._store_events == []
    assert dma_harness.worker._store_hwm == 0


def test_flush_with_a_stuck_copy_thread_fails_within_its_bound(dma_harness):
    """The copy thread is alive but never launches (a launch that does not
    return; here it is held at its first CUDA call). The flush must fail
    within flush_timeout_s with an error that says what is stuck and names
    the setting, not block the model step forever."""
    dma_harness.worker.flush_timeout_s = 0.5
    dma_harness.step_store("A", event_idx=0, gpu_block=3)
    start = time.monotonic()
    flusher, outcome = start_flush(dma_harness)
    flusher.join(timeout=5)
    assert not flusher.is_alive(), "flush still waiting on a stuck copy thread after 5 s"
    assert isinstance(outcome.get("raised"), TimeoutError), outcome
    assert 0.5 <= time.monotonic() - start < 2.5
    message = str(outcome["raised"])
    assert "alive" in message and "flush_timeout_s" in message, message
    # Nothing was synced or reported as done: the store is still in flight.
    assert dma_harness.worker._store_hwm == -1


def test_flush_never_hangs_on_a_stuck_io_thread(harness):
    """Kept from 0.33.0: a preemption flush returns (or fails) in bounded
    time even when the IO thread is alive but stuck, in both modes."""
    harness.worker.flush_timeout_s = 0.5
    harness.step_store("A", event_idx=0, gpu_block=3)
    flusher, outcome = start_flush(harness)
    flusher.join(timeout=5)
    assert not flusher.is_alive(), "flush still waiting on a stuck IO thread after 5 s"
    # Returned (as 0.33.0 does) or failed with the bounded wait's error.
    assert "returned" in outcome or isinstance(outcome.get("raised"), TimeoutError), outcome


def test_disk_flush_does_not_wait_for_the_write_backlog(disk_harness):
    """Kept from 0.33.0: in disk mode the store IO thread appends a store's
    event only after its pwritev, so a flush that waited for queued stores
    would hold the model step for the whole write backlog. With the store
    thread held behind a backlog of queued stores, the flush returns at once
    and the stores are still written afterwards."""
    for i in range(4):
        disk_harness.step_store(f"S{i}", event_idx=i, gpu_block=i)
    start = time.monotonic()
    flusher, outcome = start_flush(disk_harness)
    flusher.join(timeout=2)
    assert not flusher.is_alive(), "disk flush waited for the queued write backlog"
    assert "returned" in outcome, outcome
    assert outcome["returned"] - start < 1.0
    # The backlog is still written, and reported done, once the thread runs.
    disk_harness.gate.open()
    assert [c.src_blocks for c in disk_harness.copies.wait_for_copies(4)] == [[0], [1], [2], [3]]
    deadline = time.monotonic() + 5
    while disk_harness.worker._poll_stream_events(is_store=True) < 3:
        assert time.monotonic() < deadline, "queued stores never completed"
        time.sleep(0.01)
