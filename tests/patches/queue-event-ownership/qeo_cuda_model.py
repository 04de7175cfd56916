# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A deterministic CPU model of the CUDA ordering the offload store path uses.

The machine running these tests has no GPU, so ``torch.Event`` and
``torch.cuda.Stream`` cannot be created. This module is the narrowest seam for
them: it records, in one shared log, what the real vLLM code asks CUDA to do,
with the one semantic that matters here kept exact: ``stream.wait_event(ev)``
captures the *most recent* ``ev.record()`` at the moment the wait is issued
(cudaStreamWaitEvent semantics), not the record that was current when the
event was handed to another thread.

Each record is tagged with the label of the step the compute stream is
running (the test sets ``ComputeStream.step``), so a later copy can be checked
against the step whose KV writes it must follow.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Recording:
    """One event.record(stream): which stream, during which step, in what order."""

    seq: int
    stream: str
    step: str


class OrderingLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self.entries: list[tuple[Any, ...]] = []

    def next_seq(self) -> int:
        with self._lock:
            return next(self._seq)

    def add(self, *entry: Any) -> None:
        with self._lock:
            self.entries.append(entry)

    def snapshot(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self.entries)


class FakeStream:
    """Stands in for torch.cuda.Stream: remembers the waits issued on it."""

    def __init__(self, log: OrderingLog, name: str, step: str = "") -> None:
        self.log = log
        self.name = name
        self.step = step
        # Recordings this stream was ordered after since its last copy.
        self.pending_waits: list[Recording | None] = []
        self.last_copy: str = ""

    def wait_event(self, event: FakeEvent) -> None:
        # The wait binds to the event's current recording, right now.
        self.pending_waits.append(event.recording)
        self.log.add("wait", self.name, event.recording)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return (0, -1)


class FakeEvent:
    """Stands in for torch.Event: record() overwrites the previous record."""

    def __init__(self, log: OrderingLog, *args: Any, **kwargs: Any) -> None:
        self.log = log
        self.recording: Recording | None = None
        # For completion events recorded on a copy stream: the copy they cover.
        self.covers: str = ""

    def record(self, stream: FakeStream | None = None) -> None:
        assert stream is not None, "the offload path always names a stream"
        self.recording = Recording(self.log.next_seq(), stream.name, stream.step)
        self.covers = stream.last_copy
        self.log.add("record", stream.name, self.recording)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.log.add("synchronize", self.covers)


@dataclass
class CopyRecord:
    label: str
    src_blocks: list[int]
    dst_blocks: list[int]
    stream: str
    waited_on: list[Recording | None] = field(default_factory=list)


class FakeCopyEngine:
    """Stands in for cuda_mem_ops.build_params/copy_blocks (cuMemcpyBatchAsync).

    A copy is labelled by its first source block so tests can name it.
    """

    def __init__(self, log: OrderingLog) -> None:
        self.log = log
        self.copies: list[CopyRecord] = []
        self.copied = threading.Condition()

    def build_params(self, src: Any, dst: Any, stream: FakeStream, **kw: Any) -> Any:
        return stream

    def copy_blocks(self, src_blocks: list[int], dst_blocks: list[int], params: FakeStream) -> None:
        stream = params
        label = f"copy:{stream.name}:{src_blocks[0]}"
        rec = CopyRecord(
            label,
            list(src_blocks),
            list(dst_blocks),
            stream.name,
            list(stream.pending_waits),
        )
        stream.pending_waits.clear()
        stream.last_copy = label
        self.log.add("copy", label)
        with self.copied:
            self.copies.append(rec)
            self.copied.notify_all()

    def wait_for_copies(self, n: int, timeout: float = 5.0) -> list[CopyRecord]:
        with self.copied:
            ok = self.copied.wait_for(lambda: len(self.copies) >= n, timeout)
        assert ok, f"copy thread launched {len(self.copies)} of {n} copies in {timeout}s"
        return list(self.copies)


class Gate:
    """Stands in for current_platform.set_device in the copy thread.

    Setting the device is the copy thread's first CUDA call; holding it here is
    how the tests delay the copy thread deterministically (the "slow copy
    thread" interleaving) without sleeping.
    """

    def __init__(self) -> None:
        self.opened = threading.Event()

    def set_device(self, device: Any) -> None:
        assert self.opened.wait(timeout=30), "test never opened the copy gate"

    def open(self) -> None:
        self.opened.set()
