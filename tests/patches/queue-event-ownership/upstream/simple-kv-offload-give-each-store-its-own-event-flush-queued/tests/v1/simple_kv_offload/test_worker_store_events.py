# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU tests of the store ordering and preemption flush of SimpleCPUOffloadWorker.

Each store must wait on a compute-done event of its own: the copy thread makes
the store stream wait on the event only when it dequeues the store, and CUDA
binds that wait to the event's most recent record, so one event re-recorded
every step orders a lagging store after a later step's compute. A preemption
flush in CPU mode must also cover stores still queued for the copy thread, and
fail within ``flush_timeout_s`` when that thread is stuck.

The real worker and DmaCopyBackend (its copy thread and queue) run here. Only
the CUDA calls are replaced, so the tests run without a GPU: ``torch.Event``
and the streams by a model that keeps cudaStreamWaitEvent's binding to the
latest record, the cuMemcpyBatchAsync launch by a recorder, and the copy
thread's ``set_device`` by a gate that holds the thread, which makes "the copy
thread lags behind the model steps" deterministic.
"""

import threading

import pytest
import torch

import vllm.v1.simple_kv_offload.copy_backend as copy_backend
from vllm.v1.simple_kv_offload.copy_backend import DmaCopyBackend
from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata
from vllm.v1.simple_kv_offload.worker import SimpleCPUOffloadWorker


class FakeStream:
    """A stream whose wait binds to the event's latest record, as in CUDA."""

    def __init__(self, step: str = "") -> None:
        self.step = step
        self.waits: list[str | None] = []

    def wait_event(self, event: "FakeEvent") -> None:
        self.waits.append(event.recorded_step)


class FakeEvent:
    """An event whose record() replaces its previous record."""

    def __init__(self, *args, **kwargs) -> None:
        self.recorded_step: str | None = None
        self.synchronized = False

    def record(self, stream: FakeStream) -> None:
        self.recorded_step = stream.step

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.synchronized = True


class CopyThreadGate:
    """Holds the copy thread at its first CUDA call until opened."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    def set_device(self, device: torch.device) -> None:
        assert self.opened.wait(timeout=30), "the test never opened the gate"


class Offload:
    """A worker with a DmaCopyBackend whose copy thread is held by a gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **worker_kwargs) -> None:
        self.compute = FakeStream()
        self.gate = CopyThreadGate()
        # (source blocks, compute steps the copy's stream waited on)
        self.copies: list[tuple[list[int], list[str | None]]] = []
        monkeypatch.setattr(torch, "Event", FakeEvent)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: self.compute)
        monkeypatch.setattr(copy_backend, "current_platform", self.gate)
        monkeypatch.setattr(copy_backend, "build_params", self._build_params)
        monkeypatch.setattr(copy_backend, "copy_blocks", self._copy_blocks)
        self.backend = DmaCopyBackend()
        self.backend.init(
            {"k": torch.zeros(8, 16, dtype=torch.int8)},
            {"k": torch.zeros(8, 16, dtype=torch.int8)},
            torch.device("cpu"),
            FakeStream(),
            FakeStream(),
        )
        self.worker = SimpleCPUOffloadWorker(None, None, 0, **worker_kwargs)
        self.worker._backend = self.backend

    @staticmethod
    def _build_params(src_caches, dst_caches, stream: FakeStream, **kwargs):
        # A copy's launch parameters are just the stream it runs on here.
        return stream

    def _copy_blocks(self, src_blocks, dst_blocks, stream: FakeStream) -> None:
        self.copies.append((list(src_blocks), list(stream.waits)))
        stream.waits.clear()

    def store(self, step: str, event_idx: int, gpu_block: int) -> None:
        """One model step whose KV writes, on the compute stream, get stored."""
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

    def flush(self) -> None:
        self.worker.handle_preemptions(SimpleCPUOffloadMetadata(need_flush=True))

    def close(self) -> None:
        self.gate.opened.set()
        self.backend.shutdown()


@pytest.fixture
def offload(monkeypatch: pytest.MonkeyPatch):
    offload = Offload(monkeypatch)
    yield offload
    offload.close()


def test_each_store_waits_on_its_own_compute(offload: Offload) -> None:
    """Steps A and B both record before the copy thread dequeues A's store."""
    offload.store("A", event_idx=0, gpu_block=1)
    offload.store("B", event_idx=1, gpu_block=2)
    offload.gate.opened.set()
    offload.backend.shutdown()  # FIFO: returns once both copies ran

    assert offload.copies == [([1], ["A"]), ([2], ["B"])]


def test_flush_waits_for_a_queued_store(offload: Offload) -> None:
    """The preempted blocks are reused once the flush returns, so a store
    still queued for the copy thread must be launched and synced first."""
    offload.store("A", event_idx=0, gpu_block=3)
    flusher = threading.Thread(target=offload.flush, daemon=True)
    flusher.start()
    flusher.join(timeout=0.5)
    assert flusher.is_alive(), "the flush returned with the store still queued"

    offload.gate.opened.set()
    flusher.join(timeout=10)
    assert not flusher.is_alive()
    assert offload.copies == [([3], ["A"])]
    assert offload.worker._store_hwm == 0
    assert offload.worker._store_events == []


def test_flush_fails_within_its_bound_on_a_stuck_copy_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A copy thread that is alive but never launches fails the flush with
    an error naming the setting, instead of hanging the model step."""
    offload = Offload(monkeypatch, flush_timeout_s=0.5)
    try:
        offload.store("A", event_idx=0, gpu_block=3)
        with pytest.raises(TimeoutError, match="flush_timeout_s"):
            offload.flush()
        assert offload.copies == []
        assert offload.worker._store_hwm == -1
    finally:
        offload.close()
