# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: a worker failure on any rank reaches the waiting caller
within 1 s when the other ranks are blocked in a collective, whether the
failed rank replies to the RPC or not; with fault tolerance on it has the
effect it has on vLLM 0.33.0 (the RPC fails with "One or more workers
failed", the executor stays usable, the KV connector's finished notices are
kept), without it the executor fails as before; replies keep their RPCs
afterwards, large ones included, and shutdown() and the reader's long-wait
warning behave as on 0.33.0.

Real executor RPC path, real WorkerProc ranks (each constructed by its
__init__, each busy loop in its own thread), output threads and shared-memory
message queues; the GPU worker and the collective (NCCL needs GPUs: a wait on
an event that never fires) are stand-ins, see qeo_worker_pipeline.py for each
seam and why.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import pytest
import vllm.distributed.device_communicators.shm_broadcast as shm_broadcast
from qeo_worker_pipeline import (
    DELIVERY_WAIT_S,
    GpuOutput,
    Pipeline,
    as_the_engine_core,
    outcome_within_bound,
    rank_output,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("method", ["execute_model", "check_health"])
def test_failure_on_rank_1_while_rank_0_blocks_in_collective(monkeypatch, method, async_scheduling):
    """TP=2: rank 1 raises while rank 0 waits in the collective rank 1 never
    joins. execute_model reads only the output rank (0); check_health reads
    every rank, rank 0 first. Either way the caller learns of rank 1's error
    within the bound, the executor ends as for a failure of the output rank
    (the RPC raised, the executor usable), and once rank 0 comes out of the
    collective its late reply is not taken for the next RPC's."""
    collective = threading.Event()  # the all-reduce rank 1 never joins
    health_checks = {0: iter(["B", "C"]), 1: iter(["B", "C"])}  # per rank

    def step(rank: int, m: str, batch: Any) -> Any:
        current = batch if m == "execute_model" else next(health_checks[rank])
        if current == "B":
            if rank == 1:
                raise RuntimeError("rank 1: CUDA error in batch B")
            assert collective.wait(timeout=30), "collective never completed"
            return f"rank {rank} late reply to B"
        return f"rank {rank} reply to {current}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=async_scheduling)
    try:
        future = (
            pipe.executor.execute_model("B", non_block=True)
            if method == "execute_model"
            else pipe.executor.collective_rpc("check_health", non_block=True)
        )
        kind, value = outcome_within_bound(pipe, future, "rank 1's failure")
        assert kind == "error"
        assert "rank 1: CUDA error in batch B" in str(value)
        assert not pipe.executor.is_failed

        collective.set()
        expected: Any = ["rank 0 reply to C", "rank 1 reply to C"]
        if method == "execute_model":
            assert pipe.executor.execute_model("C") == expected[0]
        else:
            assert pipe.executor.collective_rpc("check_health") == expected
    finally:
        collective.set()
        pipe.close()


def executor_heard(caplog: pytest.LogCaptureFixture, error: str) -> bool:
    """Whether the executor read a rank's announcement of ``error`` (the
    series logs it; 0.33.0 has no announcements, so this stays False)."""
    return any(
        r.name.endswith("multiproc_executor") and "failed on RPC" in r.getMessage() and error in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("order", ["announcement-first", "reply-first"])
@pytest.mark.parametrize("fault_tolerance", [False, True], ids=["no-ft", "ft"])
def test_non_output_rank_failure_with_every_reply_in_is_delivered(monkeypatch, caplog, fault_tolerance, order):
    """TP=2, rank 1 (not the output rank) raises in execute_model B while
    rank 0 completes B. 0.33.0 logs rank 1's exception and returns rank 0's
    output; so does the series, whichever the executor reads first:
    announcement-first, rank 1 raises at once and rank 0 replies 0.15 s
    later (the executor, waiting on rank 0, reads the announcement in its
    next 50 ms slice, well inside the grace); reply-first, rank 1 raises only
    after B was delivered (the announcement is read by a later RPC). Either
    way B is delivered, no later RPC fails and the executor is not failed.
    (An earlier revision failed B in the first order and the next RPC in the
    second.)"""
    error = "rank 1: CUDA error in batch B"
    rank_1_raised = threading.Event()
    rank_1_took_h = threading.Event()
    delivered = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        if batch == "H" and rank == 1:
            rank_1_took_h.set()
        if batch == "B" and rank == 1:
            if order == "reply-first":
                assert delivered.wait(timeout=30)
            rank_1_raised.set()
            raise RuntimeError(error)
        if batch == "B" and rank == 0 and order == "announcement-first":
            assert rank_1_raised.wait(timeout=30)
            time.sleep(0.15)
        return f"rank {rank} output of {batch}"

    caplog.set_level(logging.ERROR)
    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False, fault_tolerance=fault_tolerance)
    try:
        future = pipe.executor.execute_model("B", non_block=True)
        assert outcome_within_bound(pipe, future, "batch B") == ("result", "rank 0 output of B")
        delivered.set()
        assert rank_1_raised.wait(timeout=10)
        for batch in "CDEFGH":
            assert pipe.executor.execute_model(batch) == f"rank 0 output of {batch}"
        # Rank 1 takes its RPCs in order, so once it has taken H its
        # announcement of B is in its queue (under load it may lag far behind
        # rank 0, which alone replies); then enough RPCs that one of them
        # reads rank 1's queue.
        assert rank_1_took_h.wait(timeout=10)
        for batch in "IJKLMNOP":
            assert pipe.executor.execute_model(batch) == f"rank 0 output of {batch}"
        assert not pipe.executor.is_failed
        if hasattr(shm_broadcast.MessageQueue, "poll"):  # the series: its executor heard of it
            assert executor_heard(caplog, error)
    finally:
        delivered.set()
        pipe.close()


@pytest.mark.parametrize("fault_tolerance", [False, True], ids=["no-ft", "ft"])
def test_later_rpc_failing_on_another_rank_while_an_earlier_one_waits(monkeypatch, fault_tolerance):
    """TP=2, two batches in flight (as with pipeline parallelism): rank 0
    is still in batch A when rank 1, done with A, raises in batch B; rank 0
    completes A 0.7 s later (after any grace a failure gets) and then B. As
    on 0.33.0, A and B are both delivered and the executor is not failed:
    rank 1 does not reply to B, and its replying rank completed it. (An
    earlier revision failed A and B at once without fault tolerance, and B
    with it.)"""
    release_a = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        if batch == "B" and rank == 1:
            threading.Timer(0.7, release_a.set).start()
            raise RuntimeError("rank 1: CUDA error in batch B")
        if batch == "A" and rank == 0:
            assert release_a.wait(timeout=30), "batch A never released"
        return f"rank {rank} output of {batch}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False, fault_tolerance=fault_tolerance)
    try:
        future_a = pipe.executor.execute_model("A", non_block=True)
        future_b = pipe.executor.execute_model("B", non_block=True)
        assert pipe.resolve_in_background(future_a).get(timeout=10) == ("result", "rank 0 output of A")
        assert pipe.resolve_in_background(future_b).get(timeout=10) == ("result", "rank 0 output of B")
        assert not pipe.executor.is_failed
        assert pipe.executor.execute_model("C") == "rank 0 output of C"
    finally:
        release_a.set()
        pipe.close()


class DelayedPayloadSocket:
    """The writer's overflow socket, with its next send held back.

    MessageQueue.enqueue publishes the shared-memory slot of an overflow
    message (above max_chunk_bytes) first and then sends the payload over
    this socket; a busy or descheduled writer process sends it later. The
    delay is the only thing added: the real socket still carries the bytes.
    """

    def __init__(self, socket: Any, delay_s: float) -> None:
        self.socket = socket
        self.delay_s = delay_s
        self.delays_left = 1

    def send_multipart(self, *args: Any, **kwargs: Any) -> Any:
        if self.delays_left:
            self.delays_left -= 1
            time.sleep(self.delay_s)
        return self.socket.send_multipart(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.socket, name)


def test_large_reply_with_late_payload_reaches_its_rpc(monkeypatch):
    """TP=2: rank 0's 64 MiB reply (above the response queue's 24 MiB
    max_chunk_bytes, so it travels over the socket) is sent 0.2 s after its
    slot was published. As on 0.33.0 the RPC gets that payload, and the next
    large reply goes to the next RPC, not the previous one's payload."""
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "5")
    size = 64 * 1024 * 1024

    def step(rank: int, method: str, batch: Any) -> Any:
        return (batch, batch.encode()[:1] * size) if rank == 0 else None

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False)
    writer = pipe.procs[0].worker_response_mq
    writer.local_socket = DelayedPayloadSocket(writer.local_socket, delay_s=0.2)
    try:
        for batch in ("1", "2"):
            outcome = pipe.resolve_in_background(pipe.executor.execute_model(batch, non_block=True))
            kind, value = outcome.get(timeout=10)
            assert kind == "result", f"RPC {batch} failed: {value!r}"
            name, payload = value
            assert name == batch
            assert len(payload) == size and payload[:1] == payload[-1:] == batch.encode()
    finally:
        pipe.close()


@pytest.mark.parametrize("moment", ["during-a-wait", "between-two-waits"])
def test_shutdown_cancels_a_waiting_rpc(monkeypatch, moment):
    """TP=2: shutdown() while execute_model waits on rank 0 makes the waiting
    call raise 0.33.0's RuntimeError("cancelled") (what EngineCore's shutdown
    path expects), within the bound, whenever shutdown() lands.

    during-a-wait: shutdown() from another thread 0.3 s into the wait.
    between-two-waits: shutdown() lands right after the caller looked at rank
    1's queue and before it waits on rank 0's again (made deterministic by
    running it at the end of that look, MessageQueue.poll, which a caller
    that polls the other ranks has; 0.33.0 has no poll and never looks at
    rank 1's queue for this RPC, so there it is the same as during-a-wait).
    """
    release = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        if rank == 0:
            assert release.wait(timeout=30)
        return f"rank {rank} output of {batch}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False)
    shut_down = threading.Lock()

    def shutdown_once() -> None:
        if shut_down.acquire(blocking=False):
            pipe.executor.shutdown()

    reader = pipe.response_readers[1]
    if moment == "between-two-waits" and hasattr(reader, "poll"):
        real_poll = reader.poll

        def poll(*args: Any, **kwargs: Any) -> bool:
            ready = real_poll(*args, **kwargs)
            shutdown_once()
            return ready

        monkeypatch.setattr(reader, "poll", poll)
    try:
        outcome: queue.Queue = queue.Queue()

        def call() -> None:
            try:
                outcome.put(("result", pipe.executor.execute_model("A")))
            except Exception as e:
                outcome.put(("error", e))

        threading.Thread(target=call, daemon=True).start()
        time.sleep(0.3)
        shutdown_once()
        kind, value = outcome.get(timeout=DELIVERY_WAIT_S)
        assert kind == "error"
        assert type(value) is RuntimeError and str(value) == "cancelled", repr(value)
    finally:
        release.set()
        pipe.close()


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_long_wait_logs_the_ring_buffer_warning(monkeypatch):
    """TP=2: while execute_model waits longer than
    VLLM_RINGBUFFER_WARNING_INTERVAL (1 s here) for rank 0's reply, the
    reader logs "No available shared memory broadcast block found", as on
    0.33.0: operators read hung ranks from it."""
    monkeypatch.setattr(shm_broadcast, "VLLM_RINGBUFFER_WARNING_INTERVAL", 1)
    records = Records()
    shm_logger = logging.getLogger(shm_broadcast.__name__)
    shm_logger.addHandler(records)
    monkeypatch.setattr(shm_logger, "level", logging.INFO)

    def step(rank: int, method: str, batch: Any) -> Any:
        if rank == 0:
            time.sleep(2.5)
        return f"rank {rank} output of {batch}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False)
    try:
        assert pipe.executor.execute_model("A") == "rank 0 output of A"
        warnings = [m for m in records.messages if "No available shared memory broadcast block" in m]
        assert warnings, f"no long-wait warning in {records.messages!r}"
    finally:
        shm_logger.removeHandler(records)
        pipe.close()


def test_fault_tolerance_keeps_kv_notices_of_a_failed_rpc(monkeypatch):
    """Fault tolerance and a KV connector, TP=2: rank 1 fails batch B while
    rank 0, in the collective, finishes its step 1 s later with a finished
    sending notice for req-0 (rank 1 reported its own in batch A). As on
    0.33.0, B fails with "One or more workers failed" and rank 0's notice is
    kept for the next aggregate: batch C reports req-0 finished sending."""
    late = threading.Event()

    def step(rank: int, method: str, batch: Any) -> Any:
        finished: set[str] | None = None
        if batch == "A" and rank == 1:
            finished = {"req-0"}
        if batch == "B":
            if rank == 1:
                threading.Timer(1.0, late.set).start()
                raise RuntimeError("rank 1: CUDA error in batch B")
            assert late.wait(timeout=30)
            finished = {"req-0"}
        return rank_output(rank, batch, finished)

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False, fault_tolerance=True)
    pipe.executor.kv_output_aggregator = KVOutputAggregator(expected_finished_count=2)
    try:
        a = pipe.executor.execute_model("A")
        assert a.req_ids == ["rank 0 A"] and not a.kv_connector_output.finished_sending
        future_b = pipe.executor.execute_model("B", non_block=True)
        kind, value = pipe.resolve_in_background(future_b).get(timeout=10)
        assert (kind, str(value)) == ("error", "One or more workers failed")
        c = pipe.executor.execute_model("C")
        assert c.req_ids == ["rank 0 C"]
        assert c.kv_connector_output.finished_sending == {"req-0"}
        assert not pipe.executor.is_failed
    finally:
        late.set()
        pipe.close()


def test_fault_tolerance_keeps_kv_notices_read_before_the_failure(monkeypatch):
    """Fault tolerance and a KV connector, TP=3: in batch B rank 0 replies at
    once with a finished sending notice for req-0 (read first), rank 1, in
    the collective, replies 1 s later with one for req-1, and rank 2 fails.
    As on 0.33.0, B fails with "One or more workers failed" and both
    notices, the one read before the failure and the one that comes after
    it, reach the next aggregate: batch C reports req-0 and req-1 finished
    sending (each needs all three ranks; the others reported in batch A)."""
    late = threading.Event()
    notices_in_a = {0: {"req-1"}, 1: {"req-0"}, 2: {"req-0", "req-1"}}
    notices_in_b = {0: {"req-0"}, 1: {"req-1"}}

    def step(rank: int, method: str, batch: Any) -> Any:
        finished: set[str] | None = None
        if batch == "A":
            finished = notices_in_a[rank]
        if batch == "B":
            if rank == 2:
                threading.Timer(1.0, late.set).start()
                raise RuntimeError("rank 2: CUDA error in batch B")
            if rank == 1:
                assert late.wait(timeout=30)
            finished = notices_in_b[rank]
        return rank_output(rank, batch, finished)

    pipe = Pipeline(monkeypatch, step, world_size=3, async_scheduling=False, fault_tolerance=True)
    pipe.executor.kv_output_aggregator = KVOutputAggregator(expected_finished_count=3)
    try:
        a = pipe.executor.execute_model("A")
        assert a.req_ids == ["rank 0 A"] and not a.kv_connector_output.finished_sending
        future_b = pipe.executor.execute_model("B", non_block=True)
        kind, value = pipe.resolve_in_background(future_b).get(timeout=10)
        assert (kind, str(value)) == ("error", "One or more workers failed")
        c = pipe.executor.execute_model("C")
        assert c.req_ids == ["rank 0 C"]
        assert c.kv_connector_output.finished_sending == {"req-0", "req-1"}
        assert not pipe.executor.is_failed
    finally:
        late.set()
        pipe.close()


# A LoRA adapter the workers reject: Worker.add_lora raises on every rank
# (the rank is above max_lora_rank), and the engine core returns the error to
# the add_lora caller (EngineCoreProc._invoke_utility_method) and keeps serving.
LORA_REJECTED = "LoRA rank 64 is greater than max_lora_rank 16"


def _utility_outcome(pipe: Pipeline, method: str) -> tuple[str, Any]:
    """The utility RPC's outcome as its caller sees it."""
    try:
        return "result", pipe.executor.collective_rpc(method, args=("lora",))
    except Exception as e:
        return "error", e


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param({"world_size": 2, "async_scheduling": True}, id="tp2-async"),
        pytest.param({"world_size": 2, "pipeline_parallel_size": 2, "async_scheduling": False}, id="pp2"),
    ],
)
def test_failed_utility_call_while_a_batch_is_in_flight_keeps_the_executor(monkeypatch, layout):
    """Passes on 0.33.0: fault tolerance off, a batch in flight (async
    scheduling at TP=2; the batch queue at PP=2, two batches), and a utility
    RPC that raises on every rank (a LoRA adapter the workers reject). The
    batches are delivered, the error reaches the add_lora caller, the
    executor is not failed and the next batch gets its own output. Only a
    failed model step may end the executor early."""
    output_rank = layout["world_size"] - 1 if layout.get("pipeline_parallel_size", 1) > 1 else 0
    release = threading.Event()
    batches = ["A", "B"] if layout.get("pipeline_parallel_size", 1) > 1 else ["A"]

    def step(rank: int, method: str, batch: Any) -> Any:
        if method == "add_lora":
            threading.Timer(0.3, release.set).start()
            raise ValueError(LORA_REJECTED)
        if batch in batches and rank == output_rank:
            if layout["async_scheduling"]:
                return GpuOutput(batch, release)
            assert release.wait(timeout=30), f"batch {batch} never released"
            return f"output of {batch}"
        if batch == "C" and layout["async_scheduling"]:
            return GpuOutput(batch, release)
        return f"output of {batch}"

    pipe = Pipeline(monkeypatch, step, **layout)
    try:

        def engine_core() -> tuple[list[Any], tuple[str, Any]]:
            futures = [pipe.executor.execute_model(b, non_block=True) for b in batches]
            utility = _utility_outcome(pipe, "add_lora")
            return [f.exception() or f.result() for f in futures], utility

        delivered, (kind, value) = as_the_engine_core(engine_core)
        assert delivered == [f"output of {b}" for b in batches]
        assert kind == "error" and LORA_REJECTED in str(value), (kind, value)
        assert not pipe.executor.is_failed
        if layout.get("pipeline_parallel_size", 1) == 1:
            # At PP=2 0.33.0 takes the output rank's stale reply to add_lora
            # for the next batch's; test_replies_keep_their_rpc.py has that.
            assert as_the_engine_core(lambda: pipe.executor.execute_model("C")) == "output of C"
    finally:
        release.set()
        pipe.close()


PROFILER_OFF = "Profiling is not enabled"


@pytest.mark.parametrize("calls, then_a_model_step", [(20, False), (100, True)], ids=["20", "100-then-step"])
def test_back_to_back_failing_collective_calls_never_fill_a_queue(monkeypatch, calls, then_a_model_step):
    """An idle TP=2 engine gets back-to-back collective RPCs that raise on
    every rank (start_profile with no profiler configured, through the
    dev-mode /collective_rpc endpoint); each must reach its caller as an
    error, and a model step that needs both ranks (a collective between
    them) must then return its own output. What a failed RPC owes must be
    read when that RPC ends, so no number of such calls fills rank 1's
    response queue (10 slots): a full one blocks rank 1, which then stops
    reading the broadcast queue (10 slots), and once that is full the next
    call blocks the engine core. 0.33.0 leaves one stale reply per call
    there and hangs at the 22nd call (20 pass, 100 fail); leaving the
    failure's announcement too makes it two per call (hang at the 17th)."""
    collective = threading.Barrier(2)

    def step(rank: int, method: str, batch: Any) -> Any:
        if method == "profile":
            if rank == 1:
                time.sleep(0.02)  # rank 1's error comes after rank 0's was read
            raise RuntimeError(PROFILER_OFF)
        collective.wait(timeout=5)  # the step's all-reduce: both ranks must come
        return f"rank {rank} output of {batch}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False)
    try:
        for _ in range(calls):
            kind, value = as_the_engine_core(lambda: _utility_outcome(pipe, "profile"))
            assert kind == "error" and PROFILER_OFF in str(value), (kind, value)
        if then_a_model_step:
            assert as_the_engine_core(lambda: pipe.executor.execute_model("B")) == "rank 0 output of B"
        assert not pipe.executor.is_failed
    finally:
        collective.abort()
        pipe.close()


def connected_queue(n_local_reader: int, **kwargs: Any) -> tuple[Any, Any]:
    """A real MessageQueue with one reader (local, or remote when
    n_local_reader is 0), its handshake done."""
    writer = shm_broadcast.MessageQueue(1, n_local_reader, **kwargs)
    reader = shm_broadcast.MessageQueue.create_from_handle(writer.export_handle(), 0)
    handshake = threading.Thread(target=reader.wait_until_ready, daemon=True)
    handshake.start()
    writer.wait_until_ready()
    handshake.join(timeout=10)
    assert not handshake.is_alive(), "message queue handshake did not finish"
    return writer, reader


def test_shutdown_ends_a_remote_readers_poll():
    """A caller waiting on a rank of another node (a remote reader of its
    response queue, as the leader reads remote ranks with nnodes_within_dp >
    1) polls that rank's socket; shutdown() from another thread must end the
    wait with 0.33.0's RuntimeError("cancelled"), as it ends a local reader's,
    also before any message came. Loopback only."""
    _writer, reader = connected_queue(n_local_reader=0, connect_ip="127.0.0.1")

    outcome: queue.Queue = queue.Queue()

    def wait() -> None:
        try:
            outcome.put(("result", reader.poll(None)))
        except RuntimeError as e:
            outcome.put(("error", str(e)))

    threading.Thread(target=wait, daemon=True).start()
    time.sleep(0.2)  # the poll is waiting on the socket
    reader.shutdown()
    try:
        assert outcome.get(timeout=DELIVERY_WAIT_S) == ("error", "cancelled")
    except queue.Empty:
        pytest.fail(f"poll() still waited {DELIVERY_WAIT_S}s after shutdown()")
    with pytest.raises(RuntimeError, match="cancelled"):
        reader.poll(0.0)


def test_overflow_payload_later_than_the_timeout_is_read_whole():
    """A reader's dequeue(timeout=0.1) takes the slot of a 32 MiB message
    (above the queue's max_chunk_bytes, so its payload travels over the
    socket) whose payload comes 0.4 s after the slot. 0.33.0 raises
    TimeoutError with the slot consumed: the message is lost and the next
    large message's reader gets its payload. The series waits for the
    payload once the slot is taken, so each message reaches its own dequeue.
    (The executor's first 50 ms of a wait are such a dequeue.) Local reader,
    real shared memory and socket; the delay is the only thing added."""
    size = 32 * 1024 * 1024
    writer, reader = connected_queue(n_local_reader=1)
    delayed = DelayedPayloadSocket(writer.local_socket, delay_s=0.4)
    delayed.delays_left = 2
    writer.local_socket = delayed
    try:
        for name in ("first", "second"):
            threading.Thread(target=writer.enqueue, args=((name, b"x" * size),), daemon=True).start()
            got = None
            deadline = time.monotonic() + 3
            while got is None and time.monotonic() < deadline:
                try:
                    got = reader.dequeue(timeout=0.1)
                except TimeoutError:
                    continue
            assert got is not None, f"{name}: nothing read within 3 s"
            assert got[0] == name and len(got[1]) == size, f"{name}: got the message {got[0]!r}"
    finally:
        writer.local_socket = writer.local_socket.socket
