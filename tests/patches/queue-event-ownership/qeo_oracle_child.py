# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One side of the executor oracle: run operation sequences on the executor RPC
path of whichever vllm this process imports, and answer each with its trace.

Started once per side (pristine, patched) by oracle_executor.py and kept for
the whole run, because importing vLLM costs seconds: one JSON request per line
on stdin, one JSON trace per line on the stdout it was started with (anything
else that writes to stdout, vLLM's logger included, goes to stderr).

Every sequence runs on a fresh qeo_worker_pipeline.Pipeline: the real
MultiprocExecutor RPC path, real WorkerProc ranks (each built by its
__init__, its busy loop and output thread in threads) and real shared-memory
MessageQueues; the GPU worker and the collective are the stand-ins that
module describes. The driver here plays EngineCore: model steps go out
non-blocking and are waited for in order (the batch queue of async
scheduling and PP), utility and collective RPCs are blocking calls between
steps, and a model step that fails stops the engine. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import threading
import time
import traceback
from collections import deque
from functools import partial
from typing import Any

# Bounds. A caller that gets nothing within WAIT_BOUND_S has hung; a rank
# "blocked in a collective" with a failed peer waits BLOCK_S (longer than any
# caller waits), then raises as an NCCL timeout would.
WAIT_BOUND_S = 3.0
BLOCK_S = 8.0
SLOW_S = 0.1
DELAY_S = 0.3
LARGE_DELAY_S = 0.2
# Above the response queue's max_chunk_bytes (24 MiB): the reply travels
# over the overflow socket.
LARGE_BYTES = 25 * 1024 * 1024
OP_TOKEN = re.compile(r"\bop(\d+)\b")


def error_outcome(exc: BaseException) -> dict[str, Any]:
    """What a caller learns from an exception: its class of failure and the ops it names."""
    text = str(exc)
    if isinstance(exc, TimeoutError):
        cls = "timeout"
    elif text == "cancelled":
        cls = "cancelled"
    elif text.startswith("Executor failed"):
        cls = "executor-failed"
    elif "One or more workers failed" in text:
        cls = "workers-failed"
    elif "Worker failed with error" in text:
        cls = "worker-error"
    else:
        cls = "other:" + type(exc).__name__
    return {"kind": "error", "class": cls, "ops": sorted({int(n) for n in OP_TOKEN.findall(text)}), "text": text[:300]}


def result_outcome(value: Any) -> dict[str, Any]:
    """What a caller got back, reduced to the ops it names (a large payload checked whole)."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], bytes):
        tag, payload = value
        fill = tag.encode()[-1:]
        whole = len(payload) == LARGE_BYTES and payload[:1] == payload[-1:] == fill
        value = tag if whole else f"{tag} with a payload that is not its own ({len(payload)} bytes)"
    text = json.dumps(value, default=repr)
    return {"kind": "result", "ops": sorted({int(n) for n in OP_TOKEN.findall(text)}), "text": text[:300]}


def bounded(call, bound: float) -> dict[str, Any]:
    """Run ``call`` in a thread; its outcome, or a hang after ``bound`` seconds."""
    box: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            box.put(result_outcome(call()))
        except Exception as e:
            box.put(error_outcome(e))

    threading.Thread(target=run, daemon=True).start()
    try:
        return box.get(timeout=bound)
    except queue.Empty:
        return {"kind": "hang", "ops": [], "text": f"nothing within {bound} s"}


def call_utility(worker: Any, op: dict[str, Any]) -> Any:
    """A collective_rpc callable (sent cloudpickled, as RL frameworks send theirs)."""
    return worker.utility(op)


class Sequence:
    """One operation sequence on one fresh pipeline."""

    def __init__(self, config: dict[str, Any], ops: list[dict[str, Any]]) -> None:
        import pytest
        import qeo_worker_pipeline as qwp
        from test_worker_failure_ahead import DelayedPayloadSocket

        self.config = config
        self.ops = ops
        self.tp, self.pp = config["tp"], config["pp"]
        self.world = self.tp * self.pp
        self.output_rank = self.world - self.tp  # MultiprocExecutor._get_output_rank
        self.async_scheduling = config["async_scheduling"]
        self.monkeypatch = pytest.MonkeyPatch()
        # A collective whose peer failed: nobody sets it, a blocked rank gives up after BLOCK_S.
        self.collective = threading.Event()
        # Device-to-host copies still running: released at teardown, so no output thread outlives its sequence long.
        self.copies: list[threading.Event] = []

        real_view = qwp.config_view
        tp, pp = self.tp, self.pp

        def config_view(*args: Any, **kwargs: Any) -> Any:
            view = real_view(*args, **kwargs)
            view.parallel_config.pipeline_parallel_size = pp
            view.parallel_config.tensor_parallel_size = tp
            view.parallel_config.prefill_context_parallel_size = 1
            return view

        self.monkeypatch.setattr(qwp, "config_view", config_view)
        self.monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300")
        self.pipe = qwp.Pipeline(
            self.monkeypatch,
            self.step,
            world_size=self.world,
            async_scheduling=self.async_scheduling,
            fault_tolerance=config["fault_tolerance"],
        )
        self.pipe.executor.output_rank = self.output_rank
        for rank, proc in enumerate(self.pipe.procs):
            proc.worker.utility = partial(self.step, rank, "utility")
        writer = self.pipe.procs[self.output_rank].worker_response_mq
        self.delayed_socket = DelayedPayloadSocket(writer.local_socket, delay_s=LARGE_DELAY_S)
        self.delayed_socket.delays_left = 0
        writer.local_socket = self.delayed_socket
        self.gpu_output = qwp.GpuOutput
        self.max_in_flight = self.pipe.config.max_concurrent_batches

    # --- the workers' side -------------------------------------------------

    def failing_ranks(self, op: dict[str, Any]) -> set[int]:
        where = op.get("fail")
        if not where:
            return set()
        others = [r for r in range(self.world) if r != self.output_rank] or [self.output_rank]
        if where == "output":
            return {self.output_rank}
        if where == "other":
            return {others[-1]}
        return set(range(self.world))  # "all"

    def step(self, rank: int, method: str, op: Any) -> Any:
        """Every rank's answer to every RPC, as the op describes it."""
        if not isinstance(op, dict):
            # The final check's step and utility call.
            return f"{method} {op} rank{rank}"
        i = op["i"]
        failing = self.failing_ranks(op)
        if rank in failing:
            raise RuntimeError(f"boom op{i} rank{rank}")
        if failing and op.get("peers") == "block":
            if not self.collective.wait(timeout=BLOCK_S):
                raise RuntimeError(f"collective timed out op{i} rank{rank}")
        if method == "utility":
            return f"util op{i} rank{rank}"
        if rank != self.output_rank:
            return None
        kind = op.get("kind", "fast")
        if kind == "slow":
            time.sleep(SLOW_S)
        elif kind == "large":
            self.delayed_socket.delays_left = 1
            return (f"out op{i}", f"out op{i}".encode()[-1:] * LARGE_BYTES)
        elif kind == "delayed":
            if not self.async_scheduling:
                time.sleep(DELAY_S)
            else:
                release = threading.Event()
                timer = threading.Timer(DELAY_S, release.set)
                timer.daemon = True
                timer.start()
                self.copies.append(release)
                return self.gpu_output(f"op{i}", release)
        if self.async_scheduling:
            released = threading.Event()
            released.set()
            return self.gpu_output(f"op{i}", released)
        return f"out op{i}"

    # --- the engine's side -------------------------------------------------

    def run(self) -> dict[str, Any]:
        executor = self.pipe.executor
        outcomes: list[dict[str, Any] | None] = [None] * len(self.ops)
        pending: deque[tuple[int, Any]] = deque()
        end = "completed"

        def wait_oldest() -> str | None:
            """Wait for the oldest step in flight: how the run ends if the engine stops here."""
            i, future = pending.popleft()
            outcomes[i] = bounded(future.result, WAIT_BOUND_S)
            # A model step that fails stops the engine (EngineCore raises).
            return {"result": None, "hang": "hung"}.get(outcomes[i]["kind"], "stopped")

        try:
            for i, op in enumerate(self.ops):
                kind = op["op"]
                if kind == "step":
                    if len(pending) >= self.max_in_flight and (stop := wait_oldest()):
                        end = stop
                        break
                    try:
                        pending.append((i, executor.execute_model(op, non_block=True)))
                    except Exception as e:
                        outcomes[i] = error_outcome(e)
                        end = "stopped"
                        break
                    # A rank that fails while its peers block in the collective
                    # wedges them: nothing more is sent until the engine has
                    # waited for that step (it stops there, as on any vLLM).
                    wedged = bool(op.get("fail")) and op.get("peers") == "block"
                    while pending and (len(pending) >= self.max_in_flight or wedged):
                        if stop := wait_oldest():
                            end = stop
                            break
                    if end != "completed":
                        break
                elif kind == "wait":
                    outcomes[i] = {"kind": "none", "ops": [], "text": ""}
                    if pending and (stop := wait_oldest()):
                        end = stop
                        break
                elif kind == "rpc":
                    if op["via"] == "callable":
                        method: Any = call_utility
                        args: tuple = (op,)
                    else:
                        method, args = "utility", (op,)
                    reply_rank = 0 if op["reply"] == "unique" else None
                    rpc = partial(executor.collective_rpc, method, args=args, unique_reply_rank=reply_rank)
                    outcomes[i] = bounded(rpc, WAIT_BOUND_S)
                    if outcomes[i]["kind"] == "hang":
                        end = "hung"
                        break
                elif kind == "shutdown":
                    waiting = [(j, f, self.resolve_in_background(f)) for j, f in pending]
                    pending.clear()
                    time.sleep(0.05)
                    outcomes[i] = bounded(executor.shutdown, WAIT_BOUND_S)
                    if outcomes[i]["kind"] == "result":
                        outcomes[i] = {"kind": "none", "ops": [], "text": ""}
                    for j, _, box in waiting:
                        outcomes[j] = self.take(box)
                        outcomes[j]["after_shutdown"] = True
                    end = "shutdown"
                    break
            if end == "completed":
                while pending:
                    if stop := wait_oldest():
                        end = stop
                        break
            final = None
            if end == "completed":
                final = {
                    "step": bounded(lambda: executor.execute_model("final"), WAIT_BOUND_S),
                    "rpc": bounded(lambda: executor.collective_rpc("utility", args=("final",)), WAIT_BOUND_S),
                }
            for i, outcome in enumerate(outcomes):
                if outcome is None:
                    in_flight = any(j == i for j, _ in pending)
                    outcomes[i] = {"kind": "abandoned" if in_flight else "skipped", "ops": [], "text": ""}
            return {
                "outcomes": outcomes,
                "end": end,
                "final": final,
                "is_failed": bool(executor.is_failed),
            }
        finally:
            self.close()

    @staticmethod
    def resolve_in_background(future: Any) -> queue.Queue:
        box: queue.Queue = queue.Queue()

        def wait() -> None:
            try:
                box.put(result_outcome(future.result()))
            except Exception as e:
                box.put(error_outcome(e))

        threading.Thread(target=wait, daemon=True).start()
        return box

    @staticmethod
    def take(box: queue.Queue) -> dict[str, Any]:
        try:
            return box.get(timeout=WAIT_BOUND_S)
        except queue.Empty:
            return {"kind": "hang", "ops": [], "text": f"nothing within {WAIT_BOUND_S} s"}

    def close(self) -> None:
        """End the ranks' loops whatever state the executor is in, bounded."""
        self.collective.set()
        for release in self.copies:
            release.set()
        executor = self.pipe.executor
        try:
            if executor.rpc_broadcast_mq is not None:
                bounded(executor.shutdown, WAIT_BOUND_S)
            bounded(self.pipe.close, WAIT_BOUND_S)
        finally:
            self.monkeypatch.undo()


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # The executor modules import torch and most of vLLM: once, before saying ready.
    import qeo_worker_pipeline  # noqa: F401
    import test_worker_failure_ahead  # noqa: F401
    import vllm

    out.write(json.dumps({"vllm": os.path.dirname(vllm.__file__)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        started = time.monotonic()
        try:
            trace = Sequence(request["config"], request["ops"]).run()
        except Exception:
            trace = {"crash": traceback.format_exc()}
        trace["seconds"] = round(time.monotonic() - started, 3)
        out.write(json.dumps(trace) + "\n")


if __name__ == "__main__":
    main()
