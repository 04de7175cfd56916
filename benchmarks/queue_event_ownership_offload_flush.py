# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Preemption-flush latency of the disk KV offload backend with a write backlog.

When the scheduler preempts requests, every worker runs
SimpleCPUOffloadWorker.handle_preemptions before its next forward pass, so the
time the flush takes is time the model step stands still. In disk mode the
store IO thread writes each store to the file (pwritev) before it records the
store's completion event; a flush that waits for every queued store therefore
waits for the whole write backlog.

This drives the real SimpleCPUOffloadWorker and the real DiskBackend (its
store IO thread, its staging slots, pwritev to a real file, O_DIRECT
unless --page-cache) on whatever vLLM is importable (pristine or patched, e.g.
through scripts/with-patched-vllm --tree ...). Only what needs a GPU is
replaced: torch.Event / torch.cuda streams (CPU stand-ins whose record is a
no-op), cuMemcpyBatchAsync (a real CPU copy of the block's bytes into the
staging slot), pin_tensor (cudaHostRegister) and set_device. Per round:

1. The store thread is held while --stores stores of --blocks-per-store blocks
   are submitted through worker.wait_for_save: a backlog of queued stores, as
   eager offload builds it during long prefills.
2. The thread is released and the scheduler's flush (handle_preemptions,
   need_flush) is called at once. flush_s is how long it took to return.
3. backlog_s is how long the IO thread took to write the whole backlog (from
   its release until the last store's event completed): what a flush that
   waits for every queued store costs.

Prints one line per round and the medians. No GPU needed; no figure is made
up: everything printed is measured here.

Usage:  python benchmarks/queue_event_ownership_offload_flush.py \
            [--stores 16] [--blocks-per-store 16] [--block-kib 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from typing import Any

import torch


class CpuEvent:
    """torch.Event stand-in: the copies it would follow ran synchronously."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class CpuStream:
    """torch.cuda.Stream stand-in."""

    def wait_event(self, event: Any) -> None:
        pass


class HeldDevice:
    """current_platform stand-in: set_device (the IO thread's first CUDA call)
    blocks until released, which is how the backlog is queued up front."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released_at = 0.0

    def set_device(self, device: Any) -> None:
        if not self.released.wait(timeout=600):
            raise RuntimeError("benchmark never released the IO thread")

    def release(self) -> None:
        self.released_at = time.monotonic()
        self.released.set()


def build_params(src: dict, dst: dict, stream: Any, **kwargs: Any) -> tuple[dict, dict]:
    return (src, dst)


def copy_blocks(src_blocks: list[int], dst_blocks: list[int], params: tuple[dict, dict]) -> None:
    # The GPU -> staging DMA, done as a CPU copy of the same bytes.
    src, dst = params
    for name, src_t in src.items():
        for s, d in zip(src_blocks, dst_blocks, strict=True):
            dst[name][d].copy_(src_t[s])


def one_round(args: argparse.Namespace, directory: str, round_no: int) -> tuple[float, float]:
    import vllm.v1.simple_kv_offload.disk_backend as disk_backend
    from vllm.v1.simple_kv_offload.disk_backend import DiskBackend
    from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata
    from vllm.v1.simple_kv_offload.worker import SimpleCPUOffloadWorker

    held = HeldDevice()
    disk_backend.current_platform = held  # type: ignore[assignment]
    num_blocks = args.stores * args.blocks_per_store
    block_bytes = args.block_kib * 1024
    gpu_cache = {"kv": torch.randint(-128, 127, (num_blocks, block_bytes), dtype=torch.int8)}

    worker = SimpleCPUOffloadWorker(None, None, 0, kv_offload_backend="disk")  # type: ignore[arg-type]
    backend = DiskBackend()
    backend.init(
        gpu_cache,
        torch.device("cpu"),
        CpuStream(),  # type: ignore[arg-type]
        CpuStream(),  # type: ignore[arg-type]
        f"{directory}/kv-offload-{round_no}",
        num_disk_slots=num_blocks,
        total_block_bytes=block_bytes,
        num_buffer_slots=args.buffer_slots,
        use_page_cache=args.page_cache,
    )
    worker._backend = backend
    try:
        blocks = list(range(num_blocks))
        for i in range(args.stores):
            chunk = blocks[i * args.blocks_per_store : (i + 1) * args.blocks_per_store]
            worker.bind_connector_metadata(
                SimpleCPUOffloadMetadata(store_event=i, store_gpu_blocks=chunk, store_cpu_blocks=chunk)
            )
            worker.wait_for_save()
            worker.clear_connector_metadata()

        held.release()
        start = time.monotonic()
        worker.handle_preemptions(SimpleCPUOffloadMetadata(need_flush=True))
        flush_s = time.monotonic() - start

        last = args.stores - 1
        deadline = time.monotonic() + 600
        while worker._poll_stream_events(is_store=True) < last:
            if time.monotonic() > deadline:
                raise RuntimeError("the write backlog did not drain in 600 s")
            time.sleep(0.0005)
        backlog_s = time.monotonic() - held.released_at
        return flush_s, backlog_s
    finally:
        held.release()
        backend.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=16, help="queued stores in the backlog")
    parser.add_argument("--blocks-per-store", type=int, default=16)
    parser.add_argument(
        "--block-kib",
        type=int,
        default=2048,
        help="bytes per KV block in KiB (2048: 16 tokens of an 8B Llama, 32 layers x K,V x 8 KV heads x 128 x bf16)",
    )
    parser.add_argument("--buffer-slots", type=int, default=2, help="disk_buffer_slots")
    parser.add_argument("--page-cache", action="store_true", help="use_page_cache (default: O_DIRECT)")
    parser.add_argument("--dir", default=None, help="directory of the offload file (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import vllm
    import vllm.v1.simple_kv_offload.copy_backend as copy_backend
    import vllm.v1.simple_kv_offload.disk_backend as disk_backend
    import vllm.v1.simple_kv_offload.worker as worker_module

    torch.Event = CpuEvent  # type: ignore[assignment, misc]
    torch.cuda.current_stream = lambda *a, **k: CpuStream()  # type: ignore[assignment]
    for module in (disk_backend, copy_backend):
        module.build_params = build_params  # type: ignore[assignment]
        module.copy_blocks = copy_blocks  # type: ignore[assignment]
    disk_backend.pin_tensor = lambda t: None  # type: ignore[assignment]

    flavour = (
        "waits for queued transfers"
        if "wait_until_launched" in vars(disk_backend.DiskBackend)
        else ("syncs launched transfers only")
    )
    backlog_mib = args.stores * args.blocks_per_store * args.block_kib / 1024
    print(f"vllm {vllm.__version__} from {vllm.__file__}")
    print(f"worker module: {worker_module.__file__}")
    print(f"DiskBackend flush: {flavour}")
    print(
        f"backlog: {args.stores} stores x {args.blocks_per_store} blocks x {args.block_kib} KiB "
        f"= {backlog_mib:.0f} MiB, {args.buffer_slots} staging slots, "
        f"{'page cache' if args.page_cache else 'O_DIRECT'}"
    )
    flushes: list[float] = []
    backlogs: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for r in range(args.rounds):
            flush_s, backlog_s = one_round(args, directory, r)
            flushes.append(flush_s)
            backlogs.append(backlog_s)
            print(
                f"round {r}: flush {flush_s * 1e3:9.2f} ms   backlog written in {backlog_s * 1e3:9.2f} ms "
                f"({backlog_mib / backlog_s:7.0f} MiB/s)"
            )
    print(
        f"median: flush {statistics.median(flushes) * 1e3:.2f} ms, "
        f"whole write backlog {statistics.median(backlogs) * 1e3:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
