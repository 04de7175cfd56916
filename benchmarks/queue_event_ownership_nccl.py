#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Time until the executor's caller sees a worker failure on rank 1 while
rank 0 is blocked in an all-reduce rank 1 never joins (TP=2).

Two real worker processes started by the real WorkerProc.make_worker_process
/ WorkerProc.worker_main (fork), joined to the executor by the real
shared-memory MessageQueues, the executor's real collective_rpc /
execute_model path. The GPU worker (model, KV cache) is replaced by a worker
whose init_device sets up a real torch.distributed process group (NCCL on
GPUs, gloo on CPU) and whose execute_model does, on rank 0, a real
all_reduce of a device tensor followed by a synchronize (it blocks: rank 1
never joins), and on rank 1, raises.

Prints, per scheduling mode and RPC kind, the seconds until the caller got
an outcome and what it was. Before the failure-ahead patch the caller waits
for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (set with --timeout, default 20 s);
after it, under a second.

    python3 benchmarks/queue_event_ownership_nccl.py                  # NCCL, needs 2 GPUs
    python3 benchmarks/queue_event_ownership_nccl.py --backend gloo   # CPU check
    python3 benchmarks/queue_event_ownership_nccl.py --tree PRISTINE --tree PATCHED
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class CollectiveWorker:
    """Stands in for WorkerWrapperBase (no model); real process group."""

    backend = "nccl"
    init_method = ""

    def __init__(self, rpc_rank: int = 0, global_rank: int = 0) -> None:
        self.rank = global_rank

    def init_worker(self, all_kwargs: list[dict]) -> None:
        pass

    def init_device(self) -> None:
        import torch
        import torch.distributed as dist

        if self.backend == "nccl":
            torch.cuda.set_device(self.rank)
            self.device = torch.device("cuda", self.rank)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(self.backend, init_method=self.init_method, rank=self.rank, world_size=2)
        # One all-reduce both ranks join, so the communicator exists.
        t = torch.ones(1, device=self.device)
        dist.all_reduce(t)
        assert t.item() == 2

    def load_model(self) -> None:
        pass

    def execute_model(self, batch: Any) -> Any:
        return self._step(batch)

    def check_health(self) -> Any:
        return self._step("health")

    def _step(self, batch: Any) -> Any:
        import torch
        import torch.distributed as dist

        if self.rank == 1:
            raise RuntimeError(f"rank 1 failed in {batch} before the all-reduce")
        t = torch.ones(1024, device=self.device)
        dist.all_reduce(t)  # rank 1 never joins
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return "rank 0 finished (unexpected)"

    def shutdown(self) -> None:
        pass


def config(async_scheduling: bool) -> Any:
    from vllm.config import VllmConfig

    class ConfigView(SimpleNamespace):
        max_concurrent_batches = VllmConfig.max_concurrent_batches

    return ConfigView(
        parallel_config=SimpleNamespace(
            world_size=2,
            pipeline_parallel_size=1,
            enable_expert_parallel=False,
            nnodes_within_dp=1,
            enable_fault_tolerance=False,
            assigned_physical_gpu_ids=None,
            numa_bind=False,
        ),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        watchdog_config=SimpleNamespace(dump_dir=None),
        use_v2_model_runner=False,
        model_config=None,
        cache_config=None,
    )


def one_run(async_scheduling: bool, rpc: str, backend: str, port: int) -> tuple[float, str]:
    import multiprocessing

    import vllm.v1.executor.multiproc_executor as mp_executor
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc

    CollectiveWorker.backend = backend
    CollectiveWorker.init_method = f"tcp://127.0.0.1:{port}"
    mp_executor.WorkerWrapperBase = CollectiveWorker  # inherited by the forked workers
    cfg = config(async_scheduling)
    broadcast = MessageQueue(2, 2)
    lock = multiprocessing.get_context("fork").Lock()
    unready = [
        WorkerProc.make_worker_process(cfg, rank, rank, "", broadcast.export_handle(), lock, rank == 0)
        for rank in range(2)
    ]
    workers = WorkerProc.wait_for_ready(unready)
    executor: Any = MultiprocExecutor.__new__(MultiprocExecutor)
    executor.vllm_config = cfg
    executor.is_failed = False
    executor.output_rank = 0
    executor.futures_queue = deque()
    executor.rpc_broadcast_mq = broadcast
    executor.response_mqs = [w.worker_response_mq for w in workers]
    executor.kv_output_aggregator = None
    executor.ec_output_aggregator = None
    broadcast.wait_until_ready()
    for mq in executor.response_mqs:
        mq.wait_until_ready()

    start = time.monotonic()
    try:
        if rpc == "execute_model":
            executor.execute_model("batch B")
        else:
            executor.collective_rpc("check_health", timeout=float(os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]))
        outcome = "returned (unexpected)"
    except Exception as e:
        outcome = f"{type(e).__name__}: {str(e)[:90]}"
    elapsed = time.monotonic() - start
    for w in workers:
        w.proc.kill()
        w.proc.join(timeout=10)
    return elapsed, outcome


def measure(backend: str) -> None:
    import vllm

    print(f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}; backend {backend}")
    print(f"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS={os.environ['VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS']}")
    port = 29600 + os.getpid() % 1000
    for async_scheduling in (True, False):
        for rpc in ("execute_model", "check_health"):
            port += 1
            elapsed, outcome = one_run(async_scheduling, rpc, backend, port)
            mode = "async" if async_scheduling else "sync"
            print(f"{mode:>5} {rpc:<14} {elapsed:8.3f} s  {outcome}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--timeout", type=int, default=20, help="VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS")
    parser.add_argument("--tree", action="append", default=[], help="run once per vLLM tree")
    args = parser.parse_args()
    os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] = str(args.timeout)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    if not args.tree:
        measure(args.backend)
        return 0
    runner = str(REPO / "scripts" / "with-patched-vllm")
    for tree in args.tree:
        print(f"== {tree}", flush=True)
        cmd = [runner, "--tree", tree, "--", sys.executable, __file__, "--backend", args.backend]
        subprocess.run([*cmd, "--timeout", str(args.timeout)], check=True)
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda args: None  # a killed worker's queue threads
    sys.exit(main())
