# SPDX-License-Identifier: Apache-2.0
"""GPU qualification of the CPU-offload store path (series queue-event-ownership).

Drives the real SimpleCPUOffloadWorker and DmaCopyBackend with real CUDA
streams and events and a real cuMemcpyBatchAsync copy, on whatever vLLM is
importable (pristine or patched), and prints what it observed:

1. Own-event ordering. Two overlapping steps A and B write distinct KV blocks
   on the compute stream (A short, B long) and each calls wait_for_save while
   the copy thread is held back, so both stores are queued before the copy
   thread issues its first stream wait. A store ordered after its own step
   finishes while B's compute is still running; a store ordered after a
   shared, re-recorded event finishes only after B's compute.
2. Bytes. Every stored CPU block must equal, byte for byte, the random data
   its step wrote into the GPU block.
3. Flush after preemption. A store is queued behind the held copy thread, then
   the scheduler asks for a flush (handle_preemptions). The flush must not
   return before the store has been copied; right after it returns the block
   is overwritten (reuse of a freed block) and the CPU copy must still hold
   the value written before the flush.

Exit status: 0 when every check passed, 1 when one failed, 0 with a SKIPPED
line when CUDA is absent (nothing is measured then).

Usage:  python benchmarks/queue_event_ownership_gpu.py [--rounds N]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="rounds run first and printed but not counted: the first store "
        "of a process resolves cuMemcpyBatchAsync and warms the copy path",
    )
    parser.add_argument(
        "--long-cycles",
        type=int,
        default=400_000_000,
        help="torch.cuda._sleep cycles of step B's compute (about 0.2-0.3 s)",
    )
    parser.add_argument("--short-cycles", type=int, default=10_000_000)
    parser.add_argument(
        "--copy-delay-s",
        type=float,
        default=0.3,
        help="how long the copy thread is held before it may run",
    )
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("SKIPPED: CUDA is not available on this machine; nothing was measured.")
        return 0

    import vllm.v1.simple_kv_offload.copy_backend as copy_backend
    from vllm.v1.simple_kv_offload.copy_backend import DmaCopyBackend
    from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata
    from vllm.v1.simple_kv_offload.worker import SimpleCPUOffloadWorker

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"worker has wait_until_launched on backend: {hasattr(DmaCopyBackend, 'wait_until_launched')}")

    num_blocks, block_bytes = 64, 1 << 16
    real_platform = copy_backend.current_platform

    class HeldPlatform:
        """Delays the copy thread: its first CUDA call waits for a gate."""

        def __init__(self) -> None:
            self.gate = threading.Event()

        def set_device(self, device: torch.device) -> None:
            self.gate.wait(timeout=60)
            real_platform.set_device(device)

        def __getattr__(self, name: str):
            return getattr(real_platform, name)

    def make() -> tuple[SimpleCPUOffloadWorker, DmaCopyBackend, HeldPlatform]:
        held = HeldPlatform()
        copy_backend.current_platform = held
        gpu = torch.zeros((num_blocks, block_bytes), dtype=torch.int8, device="cuda")
        cpu = torch.zeros((num_blocks, block_bytes), dtype=torch.int8, device="cpu", pin_memory=True)
        low_pri, _ = torch.cuda.Stream.priority_range()
        backend = DmaCopyBackend()
        backend.init(
            {"k": gpu},
            {"k": cpu},
            gpu.device,
            torch.cuda.Stream(priority=low_pri),
            torch.cuda.Stream(priority=low_pri),
        )
        worker = SimpleCPUOffloadWorker(None, None, 0)
        worker._backend = backend
        worker.gpu = gpu  # type: ignore[attr-defined]
        worker.cpu = cpu  # type: ignore[attr-defined]
        # The caches are zeroed on the default stream; the steps below write
        # them on another stream, so finish the zeroing first.
        torch.cuda.synchronize()
        return worker, backend, held

    def random_block(seed: int) -> torch.Tensor:
        # Random bytes (not a constant fill), so data identity is checked
        # byte for byte against the source.
        gen = torch.Generator(device="cuda").manual_seed(seed)
        t = torch.randint(-128, 128, (block_bytes,), dtype=torch.int8, device="cuda", generator=gen)
        torch.cuda.synchronize()
        return t

    def store(worker, event_idx: int, block: int) -> None:
        worker.bind_connector_metadata(
            SimpleCPUOffloadMetadata(store_event=event_idx, store_gpu_blocks=[block], store_cpu_blocks=[block])
        )
        worker.wait_for_save()
        worker.clear_connector_metadata()

    def wait_store_event(worker, event_idx: int, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for idx, ev in list(worker._store_events):
                if idx == event_idx:
                    return ev
            time.sleep(0.0005)
        raise TimeoutError(f"store {event_idx} never launched")

    if 3 * (args.rounds + args.warmup_rounds) > num_blocks:
        parser.error(f"--rounds + --warmup-rounds must be at most {num_blocks // 3}")
    failures = 0
    compute = torch.cuda.Stream()
    for r in range(args.rounds + args.warmup_rounds):
        counted = r >= args.warmup_rounds
        label = f"round {r - args.warmup_rounds}" if counted else f"warm-up {r} (not counted)"
        worker, backend, held = make()
        gpu, cpu = worker.gpu, worker.cpu  # type: ignore[attr-defined]
        a_block, b_block, c_block = 3 * r, 3 * r + 1, 3 * r + 2
        a_src, b_src, c_src = random_block(3 * r), random_block(3 * r + 1), random_block(3 * r + 2)
        reuse_val = -7
        try:
            with torch.cuda.stream(compute):
                # Step A: short compute writing A's block, then its store.
                torch.cuda._sleep(args.short_cycles)
                gpu[a_block].copy_(a_src)
                store(worker, 2 * r, a_block)
                # Step B overlaps: long compute writing B's block.
                torch.cuda._sleep(args.long_cycles)
                gpu[b_block].copy_(b_src)
                b_done = torch.cuda.Event()
                b_done.record()
                store(worker, 2 * r + 1, b_block)
            # Both stores queued; now let the copy thread run.
            held.gate.set()
            a_ev = wait_store_event(worker, 2 * r)
            while not a_ev.query():
                time.sleep(0.0002)
            a_before_b = not b_done.query()
            b_ev = wait_store_event(worker, 2 * r + 1)
            b_ev.synchronize()
            a_ok = torch.equal(cpu[a_block], a_src.cpu())
            b_ok = torch.equal(cpu[b_block], b_src.cpu())
            print(
                f"{label}: store A finished while B's compute still ran: "
                f"{a_before_b}; bytes A ok: {a_ok}; bytes B ok: {b_ok}"
            )
            if counted:
                failures += (not a_before_b) + (not a_ok) + (not b_ok)
        finally:
            held.gate.set()
            backend.shutdown()

        # Flush after preemption with a store still queued.
        worker, backend, held = make()
        gpu, cpu = worker.gpu, worker.cpu  # type: ignore[attr-defined]
        try:
            with torch.cuda.stream(compute):
                torch.cuda._sleep(args.short_cycles)
                gpu[c_block].copy_(c_src)
                store(worker, 0, c_block)
            opened_at: list[float] = []

            def open_gate_later(gate: threading.Event, log: list[float]) -> None:
                time.sleep(args.copy_delay_s)
                log.append(time.monotonic())
                gate.set()

            opener = threading.Thread(target=open_gate_later, args=(held.gate, opened_at))
            opener.start()
            t0 = time.monotonic()
            worker.handle_preemptions(SimpleCPUOffloadMetadata(need_flush=True))
            returned_at = time.monotonic()
            # The scheduler reuses the freed block right away.
            with torch.cuda.stream(compute):
                gpu[c_block].fill_(reuse_val)
            compute.synchronize()
            opener.join()
            # Let the store finish either way: a flush that waited has synced
            # it already (and cleared the list); one that did not leaves it to
            # the copy thread, which launches it after the gate opened.
            deadline = time.monotonic() + 10
            while worker._store_hwm < 0 and not any(idx == 0 for idx, _ in list(worker._store_events)):
                if time.monotonic() > deadline:
                    raise TimeoutError("queued store never launched")
                time.sleep(0.0005)
            torch.cuda.synchronize()
            waited = bool(opened_at) and returned_at >= opened_at[0]
            c_ok = torch.equal(cpu[c_block], c_src.cpu())
            print(
                f"{label}: flush returned after {returned_at - t0:.3f} s, "
                f"after the copy thread was released: {waited}; CPU copy holds "
                f"the pre-flush value (not the reused block's): {c_ok}"
            )
            if counted:
                failures += (not waited) + (not c_ok)
        finally:
            held.gate.set()
            backend.shutdown()

    copy_backend.current_platform = real_platform
    print(f"checks failed: {failures} of {5 * args.rounds} (counted rounds: {args.rounds})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
