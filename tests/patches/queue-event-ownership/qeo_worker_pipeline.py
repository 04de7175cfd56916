# SPDX-License-Identifier: Apache-2.0
"""An executor and one async-scheduling worker, in one process.

Real: WorkerProc.__init__ (queues, output thread, message queues),
WorkerProc.worker_busy_loop / _execute_worker_rpc / handle_output /
async_output_busy_loop, the shared-memory MessageQueues in both directions,
and MultiprocExecutor.execute_model / collective_rpc / FutureWrapper.

Stand-ins, and why:
- WorkerWrapperBase: the real one builds a GPU worker and loads a model. The
  stand-in answers execute_model with what the test's step function returns.
- GpuOutput: an AsyncModelRunnerOutput whose get_output() blocks on a
  threading.Event where the real one waits for a device->host copy; an
  unreleased one is GPU work that hangs.
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

import vllm.v1.executor.multiproc_executor as mp_executor
from vllm.config import VllmConfig
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc
from vllm.v1.outputs import AsyncModelRunnerOutput


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


def config_view(async_scheduling: bool = True) -> ConfigView:
    return ConfigView(
        parallel_config=SimpleNamespace(
            world_size=1,
            pipeline_parallel_size=1,
            enable_expert_parallel=False,
            nnodes_within_dp=1,
            enable_fault_tolerance=False,
        ),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        use_v2_model_runner=False,
        model_config=None,
        cache_config=None,
    )


def _handshake(writer: MessageQueue, reader: MessageQueue) -> None:
    t = threading.Thread(target=writer.wait_until_ready, daemon=True)
    t.start()
    reader.wait_until_ready()
    t.join(timeout=10)
    assert not t.is_alive(), "message queue handshake did not finish"


class Pipeline:
    def __init__(self, monkeypatch, step: Callable[[str], Any]) -> None:
        class Worker:
            rank = 0

            def __init__(self, rpc_rank: int = 0, global_rank: int = 0) -> None:
                pass

            def init_worker(self, all_kwargs: list[dict]) -> None:
                pass

            def init_device(self) -> None:
                pass

            def load_model(self) -> None:
                pass

            def execute_model(self, batch: str) -> Any:
                return step(batch)

            def stop(self) -> None:
                raise StopWorkerLoop

        monkeypatch.setattr(mp_executor, "WorkerWrapperBase", Worker)
        monkeypatch.setattr(WorkerProc, "setup_proc_title_and_log_prefix", staticmethod(lambda enable_ep: None))
        monkeypatch.setattr(mp_executor, "enable_envs_cache", lambda: None)

        self.config = config_view()
        broadcast = MessageQueue(1, 1)
        proc = WorkerProc(
            self.config,
            local_rank=0,
            rank=0,
            distributed_init_method="",
            input_shm_handle=broadcast.export_handle(),
            shared_worker_lock=threading.Lock(),
            is_driver_worker=True,
        )
        _handshake(broadcast, proc.rpc_broadcast_mq)
        self.response_reader = MessageQueue.create_from_handle(proc.worker_response_mq.export_handle(), 0)
        _handshake(proc.worker_response_mq, self.response_reader)
        self.proc = proc

        executor: Any = MultiprocExecutor.__new__(MultiprocExecutor)
        executor.vllm_config = self.config
        executor.is_failed = False
        executor.output_rank = 0
        executor.futures_queue = deque()
        executor.rpc_broadcast_mq = broadcast
        executor.response_mqs = [self.response_reader]
        executor.kv_output_aggregator = None
        executor.ec_output_aggregator = None
        self.executor = executor

        self.rpc_thread = threading.Thread(target=self._serve, daemon=True)
        self.rpc_thread.start()

    def _serve(self) -> None:
        try:
            self.proc.worker_busy_loop()
        except StopWorkerLoop:
            pass

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
        # Bypass collective_rpc: the executor may have failed on purpose.
        self.executor.rpc_broadcast_mq.enqueue(("stop", (), {}, None))
        self.rpc_thread.join(timeout=10)
