# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""An executor and its WorkerProc ranks (one or two), in one process.

Real: WorkerProc.__init__ (queues, output thread, message queues) for every
rank, each rank's WorkerProc.worker_busy_loop / _execute_worker_rpc /
handle_output / async_output_busy_loop in its own thread, the shared-memory
MessageQueues in both directions (one broadcast queue read by every rank, one
response queue per rank), and MultiprocExecutor.execute_model /
collective_rpc / FutureWrapper.

Stand-ins, and why:
- WorkerWrapperBase: the real one builds a GPU worker and loads a model. The
  stand-in answers each RPC with what the test's step function returns for
  (rank, method, batch).
- GpuOutput: an AsyncModelRunnerOutput whose get_output() blocks on a
  threading.Event where the real one waits for a device->host copy; an
  unreleased one is GPU work that hangs.
- A collective: NCCL needs GPUs, so a rank "blocked in a collective" with a
  failed peer is a step that waits on a threading.Event nobody sets (the
  all-reduce whose peer never arrives).
- WorkerProc.setup_proc_title_and_log_prefix and enable_envs_cache: they
  change the title, log prefix and env caching of the whole test process.
- The executor is built with __new__ (its __init__ spawns worker processes),
  as vLLM's own tests/v1/executor tests do; the VllmConfig is a view holding
  only the fields these paths read, with the real
  VllmConfig.max_concurrent_batches property (a full VllmConfig cannot be
  built on a machine without an accelerator).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import vllm.v1.executor.multiproc_executor as mp_executor
from vllm.config import VllmConfig
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc
from vllm.v1.outputs import AsyncModelRunnerOutput, KVConnectorOutput, ModelRunnerOutput

# Bound from the issue: a worker's failure must reach the caller within 1 s.
DELIVERY_BOUND_S = 1.0
# What the tests wait for it. On the 2-core CI machine, with the per-patch
# chain's other processes beside it, the ranks' threads can be starved for
# seconds (seen: a failure the series reports in ~0.1 s here missed 1.0 s
# there). What these tests tell apart is "within a bound" from "held until
# the earlier output's copy or VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS ends"
# (never, in these tests, before their cleanup); 5x the bound still does.
DELIVERY_WAIT_S = 5 * DELIVERY_BOUND_S


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


class StopWorkerLoop(BaseException):
    """Ends worker_busy_loop (it only catches Exception)."""


class ConfigView(SimpleNamespace):
    max_concurrent_batches = VllmConfig.max_concurrent_batches


def config_view(
    world_size: int, async_scheduling: bool, fault_tolerance: bool, pipeline_parallel_size: int = 1
) -> ConfigView:
    return ConfigView(
        parallel_config=SimpleNamespace(
            world_size=world_size,
            pipeline_parallel_size=pipeline_parallel_size,
            tensor_parallel_size=world_size // pipeline_parallel_size,
            prefill_context_parallel_size=1,
            enable_expert_parallel=False,
            nnodes_within_dp=1,
            enable_fault_tolerance=fault_tolerance,
            # Read by WorkerProc.make_worker_process / worker_main (a rank as
            # its own process): no NUMA binding, no GPU list to publish.
            numa_bind=False,
            assigned_physical_gpu_ids=None,
        ),
        watchdog_config=SimpleNamespace(dump_dir=None),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        use_v2_model_runner=False,
        model_config=None,
        cache_config=None,
    )


def _handshake(writer: MessageQueue, readers: list[MessageQueue]) -> None:
    threads = [threading.Thread(target=r.wait_until_ready, daemon=True) for r in readers]
    for t in threads:
        t.start()
    writer.wait_until_ready()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive(), "message queue handshake did not finish"


Step = Callable[[int, str, Any], Any]


def executor_over(config: ConfigView, broadcast: MessageQueue, response_readers: list[MessageQueue]) -> Any:
    """A MultiprocExecutor that sends on `broadcast` and reads the ranks'
    replies from `response_readers`, built with __new__ (its __init__ spawns
    worker processes)."""
    executor: Any = MultiprocExecutor.__new__(MultiprocExecutor)
    executor.vllm_config = config
    executor.is_failed = False
    executor.world_size = config.parallel_config.world_size
    executor.parallel_config = config.parallel_config
    executor.output_rank = executor._get_output_rank()
    executor.futures_queue = deque()
    executor.rpc_broadcast_mq = broadcast
    executor.response_mqs = response_readers
    executor.kv_output_aggregator = None
    executor.ec_output_aggregator = None
    return executor


def use_stand_in_worker(monkeypatch, step: Step) -> None:
    """Make every WorkerProc built from here on (in this process, or in a
    process forked from it) run the stand-in worker that answers with `step`."""

    class Worker:
        def __init__(self, rpc_rank: int = 0, global_rank: int = 0) -> None:
            self.rank = global_rank

        def init_worker(self, all_kwargs: list[dict]) -> None:
            pass

        def init_device(self) -> None:
            pass

        def load_model(self) -> None:
            pass

        def execute_model(self, batch: Any) -> Any:
            return step(self.rank, "execute_model", batch)

        def sample_tokens(self, grammar: Any) -> Any:
            return step(self.rank, "sample_tokens", grammar)

        def check_health(self) -> Any:
            return step(self.rank, "check_health", None)

        def add_lora(self, lora_request: Any) -> Any:
            return step(self.rank, "add_lora", lora_request)

        def profile(self, is_start: bool = True, profile_prefix: str | None = None) -> Any:
            return step(self.rank, "profile", is_start)

        def stop(self) -> None:
            raise StopWorkerLoop

        def shutdown(self) -> None:
            pass

    monkeypatch.setattr(mp_executor, "WorkerWrapperBase", Worker)
    monkeypatch.setattr(WorkerProc, "setup_proc_title_and_log_prefix", staticmethod(lambda enable_ep: None))
    monkeypatch.setattr(mp_executor, "enable_envs_cache", lambda: None)


class Pipeline:
    """`step(rank, method, batch)` answers every rank's RPCs.

    With ``pipeline_parallel_size`` > 1 the ranks are the stages (one rank
    each) and the output rank is the last stage's, as the real executor's
    _get_output_rank makes it. Utility RPCs the engine core sends between
    steps reach the stand-in worker as add_lora(request) and
    profile(is_start) (the real Worker's signatures); ``step`` answers them
    too, with the request (or is_start) as its batch argument.
    """

    def __init__(
        self,
        monkeypatch,
        step: Step,
        *,
        world_size: int = 1,
        async_scheduling: bool = True,
        fault_tolerance: bool = False,
        pipeline_parallel_size: int = 1,
        serve: bool = True,
    ) -> None:
        use_stand_in_worker(monkeypatch, step)
        self.config = config_view(world_size, async_scheduling, fault_tolerance, pipeline_parallel_size)
        broadcast = MessageQueue(world_size, world_size)
        self.procs = [
            WorkerProc(
                self.config,
                local_rank=rank,
                rank=rank,
                distributed_init_method="",
                input_shm_handle=broadcast.export_handle(),
                shared_worker_lock=threading.Lock(),
                is_driver_worker=rank == 0,
            )
            for rank in range(world_size)
        ]
        _handshake(broadcast, [p.rpc_broadcast_mq for p in self.procs])
        self.response_readers = []
        for proc in self.procs:
            reader = MessageQueue.create_from_handle(proc.worker_response_mq.export_handle(), 0)
            _handshake(proc.worker_response_mq, [reader])
            self.response_readers.append(reader)
        self.proc = self.procs[0]
        self.response_reader = self.response_readers[0]

        self.executor = executor_over(self.config, broadcast, self.response_readers)

        # serve=False: no rank runs its busy loop (a caller plays the ranks).
        self.rpc_threads = [
            threading.Thread(target=self._serve, args=(p,), daemon=True) for p in (self.procs if serve else [])
        ]
        for t in self.rpc_threads:
            t.start()

    @staticmethod
    def _serve(proc: WorkerProc) -> None:
        try:
            proc.worker_busy_loop()
        except StopWorkerLoop:
            pass
        except RuntimeError as e:
            # The rank's broadcast reader was shut down (close() after the
            # executor's shutdown()): MessageQueue.dequeue says "cancelled".
            if str(e) != "cancelled":
                raise

    @staticmethod
    def resolve_in_background(future) -> queue.Queue:
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
        # Through the real broadcast path, whatever state the executor is in;
        # "stop" ends each rank's loop without a reply. A rank still blocked
        # (a test's collective that never completes) is a daemon thread.
        if self.executor.rpc_broadcast_mq is None:
            # The test shut the executor down: end each rank's wait for the
            # next RPC the way a worker's death monitor does.
            for proc in self.procs:
                proc.rpc_broadcast_mq.shutdown()
            for t in self.rpc_threads:
                t.join(timeout=2)
            return
        self.executor.is_failed = False
        self.executor.futures_queue.clear()
        try:
            # A rank blocked on its full response queue no longer reads the
            # broadcast queue, which then fills too: never wait on it here.
            self.executor.rpc_broadcast_mq.enqueue(("stop", (), {}, None), timeout=2)
        except TimeoutError:
            for proc in self.procs:
                proc.rpc_broadcast_mq.shutdown()
        for t in self.rpc_threads:
            t.join(timeout=2)


def outcome_within_bound(pipe: Pipeline, future, what: str) -> tuple[str, Any]:
    """The future's outcome, which must reach the caller within the bound
    (DELIVERY_WAIT_S: DELIVERY_BOUND_S with room for a loaded machine)."""
    try:
        return pipe.resolve_in_background(future).get(timeout=DELIVERY_WAIT_S)
    except queue.Empty:
        pytest.fail(f"{what} did not reach the caller within {DELIVERY_WAIT_S}s")


def rank_output(rank: int, batch: Any, finished: set[str] | None) -> ModelRunnerOutput:
    """A rank's real ModelRunnerOutput for ``batch``, with the KV transfers it finished sending."""
    return ModelRunnerOutput(
        req_ids=[f"rank {rank} {batch}"],
        req_id_to_index={f"rank {rank} {batch}": 0},
        kv_connector_output=KVConnectorOutput(finished_sending=finished),
    )


def as_the_engine_core(what: Callable[[], Any], bound_s: float = 10.0) -> Any:
    """Run `what` on one thread, as the engine core's busy loop runs its
    steps and utility calls (a blocking RPC first waits for the futures ahead
    of it), and return what it returns within `bound_s` seconds."""
    outcome: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            outcome.put(("result", what()))
        except BaseException as e:
            outcome.put(("error", e))

    threading.Thread(target=run, daemon=True).start()
    try:
        kind, value = outcome.get(timeout=bound_s)
    except queue.Empty:
        pytest.fail(f"the engine core's thread did not come back within {bound_s}s")
    if kind == "error":
        raise value
    return value
