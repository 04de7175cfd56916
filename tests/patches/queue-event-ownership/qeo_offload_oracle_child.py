# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One side of the KV offload oracle: run operation sequences on the simple KV
offload worker of whichever vllm this process imports, and answer each with
its trace.

Started once per side (pristine, patched) by oracle_offload.py and kept for
the whole run: one JSON request per line on stdin, one JSON trace per line on
the stdout it was started with (vLLM's logger and everything else go to
stderr).

Every sequence builds a fresh SimpleCPUOffloadConnector in the worker role
from a real VllmConfig (kv_connector_extra_config: backend "cpu" or "disk",
num_cpu_blocks, flush_timeout_s), registers a real KV cache layout with it
(SimpleCPUOffloadWorker.register_kv_caches builds the real DmaCopyBackend and
its copy thread, or the real DiskBackend, its two IO threads, its staging
buffers and a real file written with pwritev and read with preadv), and then
drives the connector as the model runner does each step: handle_preemptions,
bind_connector_metadata, the forward pass, start_load_kv, wait_for_save,
get_transfer_results (get_finished), build_connector_worker_meta,
clear_connector_metadata. The driver plays the scheduler: store and load
events numbered by the step that issues them, a fresh GPU block for every
block a step computes or loads into and a fresh CPU block (disk slot) for
every block it stores (the scheduler pins the blocks of queued transfers, so
nothing here reuses a block a transfer may still touch), loads offered only
for stores the worker has reported done, every in-flight load in each step's
load_event_to_reqs (as SimpleCPUOffloadScheduler.build_connector_meta).

Replaced, because each needs a GPU, at the narrowest seam (qeo_cuda_model.py
describes the ordering model): ``torch.Event``, ``torch.cuda.Stream`` and
``torch.cuda.current_stream`` (CUDA events and streams; a stream wait binds to
the event's most recent record, as cudaStreamWaitEvent does), the backend
modules' ``build_params`` / ``copy_blocks`` (cuMemcpyBatchAsync: here a
synchronous CPU copy of the same blocks, so bytes really move), ``pin_tensor``
(cudaHostRegister) and ``current_platform.set_device`` (the IO thread's first
CUDA call, a no-op here). A copy launch can be held (a launch that does not
return) or lag (held until LAG_S after the next flush starts: a slow copy
engine the flush must wait for, the same queue at the flush on both trees):
ops "hold", "lag", "release".

The trace says what each caller got: each step's outcome and, for a step that
asked for a preemption flush, how the flush ended (returned, raised, or
nothing within WAIT_BOUND_S), how long it took, and whether every transfer
submitted before it was reported done by that step; for each store, the
step whose compute-done record its copy was ordered after and whether it was
reported done (once); for each load, whether it was reported done and the
bytes it brought back. A sequence that completes ends with a drain (every
transfer reported) and a final step that loads back every stored block.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from types import SimpleNamespace
from typing import Any

# A caller that gets nothing within WAIT_BOUND_S has hung. flush_timeout_s (the
# patched tree's bound on a CPU-mode flush) is well inside it.
WAIT_BOUND_S = 2.5
FLUSH_TIMEOUT_S = 0.5
# "lag": the copy engine's launches are held until this long after the next flush
# starts (a slow copy engine that a flush has to wait for).
LAG_S = 0.3
# A launch held with no release gives up after this (only so no thread outlives the child).
HOLD_MAX_S = 30.0
# How long the driver waits for the worker to report a store before it offers a
# load of it, while launches are held (nothing more can complete) or not.
OFFER_HELD_S = 0.2
OFFER_FREE_S = 2.0
# Waits for the copy threads to reach a quiet point before a launch is held.
IDLE_BOUND_S = 2.0
IDLE_SETTLE_S = 0.05
DRAIN_BOUND_S = 3.0

LAYERS = 2
PAGE_BYTES = 64
NUM_GPU_BLOCKS = 48
NUM_CPU_BLOCKS = 48


class CopyEngine:
    """cuMemcpyBatchAsync as a synchronous CPU copy; a launch can be held.

    build_params keeps the source and destination caches and the stream;
    copy_blocks copies each block of each layer, then notes which compute-done
    recordings the stream was ordered after (the waits issued on it since its
    last copy) against the first source block.
    """

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released.set()
        self.timer: threading.Timer | None = None
        self.lag_pending = False
        self.lock = threading.Lock()
        self.blocks_copied = 0
        # gpu block -> steps of the compute-done records its store waited on
        self.store_waits: dict[int, list[str]] = {}

    def build_params(self, src: dict, dst: dict, stream: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(src=src, dst=dst, stream=stream)

    def copy_blocks(self, src_blocks: list[int], dst_blocks: list[int], params: Any) -> None:
        if not src_blocks:
            return
        self.released.wait(timeout=HOLD_MAX_S)
        for name, src in params.src.items():
            dst = params.dst[name]
            for s, d in zip(src_blocks, dst_blocks, strict=True):
                dst[d].copy_(src[s])
        stream = params.stream
        if stream.name == "store" and stream.pending_waits:
            steps = [r.step for r in stream.pending_waits if r is not None]
            with self.lock:
                self.store_waits.setdefault(int(src_blocks[0]), steps)
        stream.pending_waits.clear()
        stream.last_copy = f"copy:{stream.name}:{src_blocks[0]}"
        with self.lock:
            self.blocks_copied += len(src_blocks)

    def hold(self, lag: bool) -> None:
        """Hold launches; a lag ends LAG_S after the next flush starts (so both trees flush with the same queue)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.released.clear()
        self.lag_pending = lag

    def flush_starts(self) -> None:
        if self.lag_pending and self.held:
            self.lag_pending = False
            self.timer = threading.Timer(LAG_S, self.released.set)
            self.timer.daemon = True
            self.timer.start()

    def release(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.lag_pending = False
        self.released.set()

    @property
    def held(self) -> bool:
        return not self.released.is_set()


class Seams:
    """The GPU-only objects, replaced once per child; each sequence points them at its own state."""

    def __init__(self) -> None:
        import torch
        import vllm.v1.simple_kv_offload.copy_backend as copy_backend
        import vllm.v1.simple_kv_offload.disk_backend as disk_backend
        import vllm.v1.simple_kv_offload.worker as worker
        from qeo_cuda_model import FakeEvent, FakeStream, OrderingLog

        self.log = OrderingLog()
        self.engine = CopyEngine()
        self.compute = FakeStream(self.log, "compute")
        self.stream_names: Any = iter(())
        seams = self

        class Stream(FakeStream):
            """torch.cuda.Stream: the worker creates the load stream, then the store stream."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(seams.log, next(seams.stream_names, "other"))

        torch.Event = lambda *a, **k: FakeEvent(seams.log)  # type: ignore[assignment]
        torch.cuda.Stream = Stream  # type: ignore[assignment,misc]
        torch.cuda.current_stream = lambda *a, **k: seams.compute  # type: ignore[assignment]
        platform = SimpleNamespace(set_device=lambda device: None)
        for module in (copy_backend, disk_backend):
            module.build_params = lambda *a, **k: seams.engine.build_params(*a, **k)
            module.copy_blocks = lambda *a, **k: seams.engine.copy_blocks(*a, **k)
            module.current_platform = platform
        disk_backend.pin_tensor = lambda tensor: None
        worker.pin_tensor = lambda tensor: None

    def fresh(self) -> None:
        from qeo_cuda_model import FakeStream, OrderingLog

        self.log = OrderingLog()
        self.engine = CopyEngine()
        self.compute = FakeStream(self.log, "compute")
        self.stream_names = iter(("load", "store"))


def error_class(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and "flush_timeout_s" in str(exc):
        return "flush-timeout"
    return "other:" + type(exc).__name__


def bounded(call: Any, bound: float) -> dict[str, Any]:
    """Run ``call`` in a thread: its outcome and duration, or a hang after ``bound`` seconds."""
    box: queue.Queue = queue.Queue()

    def run() -> None:
        started = time.monotonic()
        try:
            value = call()
            box.put({"kind": "result", "value": value, "seconds": time.monotonic() - started})
        except Exception as e:
            box.put(
                {
                    "kind": "error",
                    "class": error_class(e),
                    "text": str(e)[:300],
                    "seconds": time.monotonic() - started,
                }
            )

    threading.Thread(target=run, daemon=True).start()
    try:
        return box.get(timeout=bound)
    except queue.Empty:
        return {"kind": "hang", "text": f"nothing within {bound} s", "seconds": bound}


class Sequence:
    """One operation sequence on one fresh connector."""

    def __init__(self, seams: Seams, config: dict[str, Any], ops: list[dict[str, Any]]) -> None:
        import torch
        from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import (
            SimpleCPUOffloadConnector,
        )
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor

        self.torch = torch
        self.seams = seams
        seams.fresh()
        self.engine = seams.engine
        self.config = config
        self.ops = ops
        self.backend = config["backend"]
        self.tmp = tempfile.mkdtemp(prefix="qeo-offload-")
        extra: dict[str, Any] = {
            "kv_offload_backend": self.backend,
            "num_cpu_blocks": NUM_CPU_BLOCKS,
            "cpu_bytes_to_use": 1 << 20,
            # Read only by the patched tree (the CPU-mode flush's bound).
            "flush_timeout_s": FLUSH_TIMEOUT_S,
        }
        if self.backend == "disk":
            extra.update(
                disk_path=os.path.join(self.tmp, "kv"),
                disk_capacity_bytes=1 << 20,
                disk_buffer_slots=2,
                # O_DIRECT needs 4 KiB-aligned blocks and a file system that takes it.
                use_page_cache=True,
            )
        vllm_config = VllmConfig(
            device_config=DeviceConfig(device="cpu"),
            cache_config=CacheConfig(enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="SimpleCPUOffloadConnector",
                kv_role="kv_both",
                kv_connector_extra_config=extra,
            ),
        )
        span = NUM_GPU_BLOCKS * PAGE_BYTES
        names = [f"layer{i}" for i in range(LAYERS)]
        kv_cache_config = KVCacheConfig(
            num_blocks=NUM_GPU_BLOCKS,
            kv_cache_tensors=[
                KVCacheTensor(size=LAYERS * span, layers=names, layer_stride=span, block_stride=PAGE_BYTES)
            ],
            kv_cache_groups=[],
        )
        self.connector = SimpleCPUOffloadConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        self.gpu = torch.zeros(LAYERS, NUM_GPU_BLOCKS, PAGE_BYTES, dtype=torch.int8)
        self.connector.register_kv_caches({name: self.gpu[i] for i, name in enumerate(names)})
        self.worker = self.connector.worker_handler
        self.next_gpu = itertools.count()
        self.next_cpu = itertools.count()
        # What the driver (the scheduler) knows.
        self.stores: dict[int, dict[str, Any]] = {}  # op index -> gpu/cpu blocks, bytes, reports
        self.loads: dict[int, dict[str, Any]] = {}
        self.reported_stores: list[int] = []
        self.reported_loads: list[int] = []
        self.blocks_submitted = 0
        self.final_index = len(ops)

    # --- the scheduler's and the model runner's side -------------------------

    def block_bytes(self, step: int, block: int) -> Any:
        generator = self.torch.Generator().manual_seed(step * 1000 + block)
        return self.torch.randint(-128, 128, (LAYERS, PAGE_BYTES), dtype=self.torch.int8, generator=generator)

    def in_flight_loads(self) -> dict[int, list[str]]:
        return {i: [f"req{i}"] for i in self.loads if i not in self.reported_loads and self.loads[i]["issued"]}

    def model_step(self, index: int, store_blocks: int = 0, load_of: int | None = None, flush: bool = False) -> Any:
        """One execute_model as the model runner drives the connector; the flush outcome if any."""
        from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata

        meta = SimpleCPUOffloadMetadata(need_flush=flush)
        if store_blocks:
            gpu = [next(self.next_gpu) for _ in range(store_blocks)]
            cpu = [next(self.next_cpu) for _ in range(store_blocks)]
            meta.store_event, meta.store_gpu_blocks, meta.store_cpu_blocks = index, gpu, cpu
            self.stores[index] = {"gpu": gpu, "cpu": cpu, "reports": 0}
        if load_of is not None:
            source = self.stores[load_of]
            gpu = [next(self.next_gpu) for _ in source["cpu"]]
            meta.load_event, meta.load_gpu_blocks, meta.load_cpu_blocks = index, gpu, list(source["cpu"])
            self.loads[index] = {"gpu": gpu, "of": load_of, "issued": True, "reports": 0}
        meta.load_event_to_reqs = self.in_flight_loads()
        flush_outcome = None
        if flush:
            submitted = set(self.stores) | {i for i in self.loads if self.loads[i]["issued"]}
            submitted.discard(index)
            held = self.engine.held
            self.engine.flush_starts()
            flush_outcome = bounded(lambda: self.connector.handle_preemptions(meta), WAIT_BOUND_S)
            flush_outcome.pop("value", None)
            flush_outcome["held"] = held
            if flush_outcome["kind"] != "result":
                return flush_outcome
        self.connector.bind_connector_metadata(meta)
        # The forward pass: the compute stream writes this step's KV into its blocks.
        self.seams.compute.step = f"op{index}"
        if store_blocks:
            for block in self.stores[index]["gpu"]:
                self.gpu[:, block] = self.block_bytes(index, block)
            self.stores[index]["bytes"] = [self.gpu[:, b].clone() for b in self.stores[index]["gpu"]]
        self.connector.start_load_kv(None)
        self.connector.wait_for_save()
        results = self.connector.get_transfer_results(set())
        worker_meta = self.connector.build_connector_worker_meta()
        self.connector.clear_connector_metadata()
        for req in results.finished_recving or ():
            i = int(req.removeprefix("req"))
            self.loads[i]["reports"] += 1
            self.reported_loads.append(i)
        if worker_meta is not None:
            for i in worker_meta.completed_store_events:
                if i in self.stores:
                    self.stores[i]["reports"] += 1
                self.reported_stores.append(i)
        if flush_outcome is not None:
            done = set(self.reported_stores) | set(self.reported_loads)
            flush_outcome["synced"] = submitted <= done
        return flush_outcome

    def empty_steps_until(self, done: Any, bound: float, index: int) -> bool:
        deadline = time.monotonic() + bound
        while not done():
            if time.monotonic() > deadline:
                return False
            self.model_step(index)
            time.sleep(0.005)
        return True

    def wait_idle(self) -> None:
        """Before a launch is held: let the copy threads finish what was submitted (bounded).

        Already held, nothing more can finish, and what is queued is known.
        """
        if self.engine.held:
            return
        deadline = time.monotonic() + IDLE_BOUND_S
        while self.engine.blocks_copied < self.blocks_submitted and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(IDLE_SETTLE_S)

    def run(self) -> dict[str, Any]:
        outcomes: list[dict[str, Any]] = [{"kind": "skipped"} for _ in self.ops]
        end = "completed"
        final = None
        try:
            for i, op in enumerate(self.ops):
                kind = op["op"]
                if kind == "step":
                    load_of = None
                    store_ops = sorted(self.stores)
                    if op.get("load") is not None and store_ops:
                        load_of = store_ops[op["load"] % len(store_ops)]
                        # Held (or lagging until a flush): nothing more completes meanwhile.
                        bound = OFFER_HELD_S if self.engine.held and self.engine.timer is None else OFFER_FREE_S
                        if not self.empty_steps_until(lambda j=load_of: self.stores[j]["reports"] > 0, bound, i):
                            # The scheduler offers only stores the worker reported done.
                            load_of = None
                    stepped = bounded(
                        lambda op=op, i=i, load_of=load_of: self.model_step(
                            i, op.get("store", 0), load_of, op.get("flush", False)
                        ),
                        WAIT_BOUND_S + 1.0,
                    )
                    flush = stepped.pop("value", None)
                    if flush is not None and flush["kind"] != "result":
                        outcomes[i] = {"kind": flush["kind"], "class": flush.get("class", ""), "flush": flush}
                    else:
                        outcomes[i] = {
                            "kind": stepped["kind"],
                            "class": stepped.get("class", ""),
                            "text": stepped.get("text", ""),
                            "flush": flush,
                            "load_of": load_of,
                        }
                    if outcomes[i]["kind"] == "hang":
                        end = "hung"
                        break
                    if outcomes[i]["kind"] == "error":
                        end = "stopped"  # a model step that raises stops the engine
                        break
                    self.blocks_submitted += op.get("store", 0) + (
                        len(self.stores[load_of]["cpu"]) if load_of is not None else 0
                    )
                elif kind in ("hold", "lag"):
                    self.wait_idle()
                    self.engine.hold(lag=kind == "lag")
                    outcomes[i] = {"kind": "none"}
                elif kind == "release":
                    self.engine.release()
                    outcomes[i] = {"kind": "none"}
                elif kind == "shutdown":
                    # A launch held forever would make both trees wait out the
                    # backend's join timeouts alike: it returns as shutdown starts.
                    threading.Timer(0.05, self.engine.release).start()
                    shut = bounded(self.worker._backend.shutdown, WAIT_BOUND_S * 4)
                    outcomes[i] = {"kind": "none" if shut["kind"] == "result" else shut["kind"]}
                    end = "shutdown"
                    break
            if end == "completed":
                final = self.finish()
        finally:
            self.close()
        return {
            "outcomes": outcomes,
            "end": end,
            "final": final,
            "stores": {
                str(i): {
                    "waited_on": self.engine.store_waits.get(s["gpu"][0]),
                    "reports": s["reports"],
                }
                for i, s in self.stores.items()
            },
            "phantom_reports": sorted(
                {i for i in self.reported_stores if i not in self.stores}
                | {i for i in self.reported_loads if i not in self.loads}
            ),
        }

    def finish(self) -> dict[str, Any]:
        """Drain (every transfer reported), then load back every stored block."""
        self.engine.release()
        index = self.final_index

        def everything_reported() -> bool:
            return all(s["reports"] for s in self.stores.values()) and all(ld["reports"] for ld in self.loads.values())

        drained = self.empty_steps_until(everything_reported, DRAIN_BOUND_S, index)
        loads_ok = {}
        for i, ld in self.loads.items():
            expected = self.stores[ld["of"]]["bytes"]
            loads_ok[str(i)] = all(bool((self.gpu[:, g] == e).all()) for g, e in zip(ld["gpu"], expected, strict=True))
        # The final step: every completed store loaded back into fresh blocks.
        back: dict[int, dict[str, Any]] = {}
        for i, s in self.stores.items():
            if s["reports"]:
                back[i] = {"gpu": [next(self.next_gpu) for _ in s["cpu"]], "cpu": s["cpu"]}
        readback_ok: dict[str, bool] = {}
        if back:
            from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata

            meta = SimpleCPUOffloadMetadata(
                load_event=index + 1,
                load_gpu_blocks=[g for b in back.values() for g in b["gpu"]],
                load_cpu_blocks=[c for b in back.values() for c in b["cpu"]],
                load_event_to_reqs={index + 1: ["final"]},
            )
            got: set[str] = set()
            deadline = time.monotonic() + DRAIN_BOUND_S
            self.connector.bind_connector_metadata(meta)
            self.connector.start_load_kv(None)
            while "final" not in got and time.monotonic() < deadline:
                got |= self.connector.get_transfer_results(set()).finished_recving or set()
                time.sleep(0.005)
            self.connector.clear_connector_metadata()
            for i, b in back.items():
                readback_ok[str(i)] = "final" in got and all(
                    bool((self.gpu[:, g] == e).all()) for g, e in zip(b["gpu"], self.stores[i]["bytes"], strict=True)
                )
        return {"drained": drained, "loads_ok": loads_ok, "readback_ok": readback_ok}

    def close(self) -> None:
        self.engine.release()
        backend = self.worker._backend if self.worker is not None else None
        if backend is not None:
            bounded(backend.shutdown, 25.0)
        shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm
    import vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector

    seams = Seams()
    out.write(json.dumps({"vllm": os.path.dirname(vllm.__file__)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        started = time.monotonic()
        try:
            trace = Sequence(seams, request["config"], request["ops"]).run()
        except Exception:
            trace = {"crash": traceback.format_exc()}
        trace["seconds"] = round(time.monotonic() - started, 3)
        with contextlib.suppress(Exception):
            out.write(json.dumps(trace) + "\n")


if __name__ == "__main__":
    main()
