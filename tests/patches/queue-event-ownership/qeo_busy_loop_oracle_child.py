# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One side of the busy-loop oracle: run operation sequences against a real
engine-core process of whichever vllm this process imports, and answer each
with its trace.

Started once per side (pristine, patched) by oracle_busy_loop.py and kept for
the whole run: one JSON request per line on stdin, one JSON trace per line on
the stdout it was started with (vLLM's logger and everything else go to
stderr).

Every sequence starts a fresh engine core the way `LLM` starts one: the real
SyncMPClient (EngineCoreClient.make_client, multiprocess mode) launches the
real EngineCoreProc in its own process (forked) with the real EngineCore,
Scheduler, KV cache manager, busy loop, input and output threads, ZMQ
sockets, and (patched tree) the progress reporter thread. The driver is the
frontend: it sends requests (add, abort) and utility calls through that
client, reads the outputs from the client's output queue, and (patched tree)
samples the client's EngineProgressView every SAMPLE_S as AsyncLLM.
progress_status does.

Replaced, because it needs a GPU: the model executor (BusyLoopExecutor, the
FakeExecutor of the progress check's own tests with two more utility methods):
it answers a step with one sampled token per decoding request, and a step or a
collective_rpc can be made slow or held (a wedged GPU, a stuck collective)
through files the driver creates. It logs, in the engine process, when a step
or utility call really was held, so the judge knows when the engine was
stuck.

The trace says what each caller got: each request's tokens and finish reason;
each utility call's result or error (class and text), or nothing within
UTILITY_BOUND_S; whether the engine is alive at the end (a request and a
utility call after the last operation must complete); the held intervals; and
on the patched tree the progress samples and the reports received while the
engine was idle.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

# Progress timeout the patched engine and frontend read (VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS).
TIMEOUT_S = 0.4
# How often the driver samples the patched progress view.
SAMPLE_S = 0.05
# A slow step (well under the timeout: progress).
SLOW_STEP_S = 0.05
# How long a held step or utility call is held (well past the timeout).
HOLD_S = 1.1
# An idle period: longer than the timeout.
IDLE_S = 0.7
# The most a utility call, a request's completion or the end check may take.
UTILITY_BOUND_S = 4.0
REQUEST_BOUND_S = 6.0

# Only the real model executor needs a GPU: this one is the progress check's
# FakeExecutor, with a utility that raises in the worker and a log of holds.
_EXECUTOR: type | None = None


def executor_class() -> type:
    global _EXECUTOR
    if _EXECUTOR is not None:
        return _EXECUTOR
    from qeo_fake_executor import FakeExecutor

    class BusyLoopExecutor(FakeExecutor):
        """Logs (engine process) when a step or a collective_rpc was really held."""

        def _held(self, what: str, path: str) -> None:
            if not os.path.exists(path):
                return
            start = time.monotonic()
            while os.path.exists(path):
                time.sleep(0.005)
            with open(os.environ["QEO_BUSY_LOOP_HOLD_LOG"], "a") as f:
                f.write(json.dumps([what, start, time.monotonic()]) + "\n")

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):  # type: ignore[override]
            if method == "raise_like_a_failed_rpc":
                raise RuntimeError(f"boom {args[0] if args else ''}")
            if method == "hang_like_a_stuck_collective":
                self._held("utility", os.environ["QEO_PROGRESS_RPC_HANG_FILE"])
                return ["done"]
            return super().collective_rpc(method, timeout, args, kwargs, non_block)

        def execute_model(self, scheduler_output, non_block=False):  # type: ignore[override]
            self._held("step", self.hang_file)
            return super().execute_model(scheduler_output, non_block)

    _EXECUTOR = BusyLoopExecutor
    return _EXECUTOR


UTILITIES = {
    # name: (method, args) as EngineCoreClient sends them
    "reset_prefix_cache": ("reset_prefix_cache", ()),
    "is_sleeping": ("is_sleeping", ()),
    "collective_rpc": ("collective_rpc", ("echo_like_a_worker", None, (), None)),
    "collective_rpc_raises": ("collective_rpc", ("raise_like_a_failed_rpc", None, ("util",), None)),
    "no_such_method": ("no_such_utility_method", ()),
}


class Sequence:
    def __init__(self, config: dict, ops: list[dict], model_dir: str) -> None:
        self.config = config
        self.ops = ops
        self.model_dir = model_dir
        self.tmp = tempfile.mkdtemp(prefix="qeo-busy-loop-")
        self.files = {k: os.path.join(self.tmp, k) for k in ("hang", "rpc-hang", "slow", "holds")}
        self.requests: dict[str, dict] = {}
        self.utilities: list[dict] = []
        self.samples: list[list] = []
        self.report_times: list[list] = []
        self.idle_windows: list[list[float]] = []
        self.stop = threading.Event()
        self.sampling = threading.Event()

    # -- the frontend's side ---------------------------------------------------
    def start(self) -> Any:
        from qeo_fake_executor import make_config
        from vllm.v1.engine.core_client import EngineCoreClient

        os.environ.update(
            VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS=str(TIMEOUT_S),
            QEO_PROGRESS_HANG_FILE=self.files["hang"],
            QEO_PROGRESS_RPC_HANG_FILE=self.files["rpc-hang"],
            QEO_PROGRESS_SLOW_FILE=self.files["slow"],
            QEO_BUSY_LOOP_HOLD_LOG=self.files["holds"],
        )
        config = make_config(
            self.model_dir,
            max_num_batched_tokens=64,
            max_num_seqs=self.config["max_num_seqs"],
            max_model_len=2048,
            is_encoder_decoder=False,
        )
        client = EngineCoreClient.make_client(
            multiprocess_mode=True,
            asyncio_mode=False,
            vllm_config=config,
            executor_class=executor_class(),
            log_stats=False,
        )
        view = getattr(client, "engine_progress", None)
        if view is not None:
            record = view.record

            def counting(engine_index: int, report: Any) -> None:
                self.report_times.append([time.monotonic(), bool(getattr(report, "waiting_for_work", False))])
                record(engine_index, report)

            view.record = counting
        return client

    def collect(self, client: Any) -> None:
        """The output handler: each request's outputs, as AsyncLLM's reads them."""
        while not self.stop.is_set():
            try:
                outputs = client.outputs_queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(outputs, Exception):
                self.engine_error = repr(outputs)[:200]
                continue
            for out in outputs.outputs:
                r = self.requests.get(out.request_id)
                if r is None:
                    continue
                r["tokens"] += list(out.new_token_ids)
                if out.finish_reason is not None:
                    r["finish"] = str(out.finish_reason)

    def sample(self, client: Any) -> None:
        """Patched only: the progress check's answer, as AsyncLLM.progress_status computes it."""
        view = client.engine_progress
        kwargs: dict[str, Any] = {"num_active_requests": 0, "stall_timeout_s": TIMEOUT_S}
        if "engine_indices" in inspect.signature(view.status).parameters:
            # The engines requests are routed to (the patch's revisions before
            # the elastic EP scale down judged every engine heard from).
            kwargs["engine_indices"] = [int.from_bytes(identity, "little") for identity in client.core_engines]
        try:
            while not self.stop.is_set() and not self.sampling.is_set():
                s = view.status(**kwargs)
                self.samples.append(
                    [time.monotonic(), s.stalled, round(s.seconds_without_progress, 3), getattr(s, "stuck_in", "")]
                )
                time.sleep(SAMPLE_S)
        except Exception:
            self.sample_error = traceback.format_exc()[-1000:]

    def call(self, client: Any, name: str, bound: float = UTILITY_BOUND_S) -> dict:
        method, args = UTILITIES.get(name, (name, ()))
        box: queue.Queue = queue.Queue()

        def run() -> None:
            try:
                box.put({"kind": "result", "value": repr(client.call_utility(method, *args))[:200]})
            except BaseException as e:
                box.put({"kind": "error", "class": type(e).__name__, "text": str(e)[:200]})

        threading.Thread(target=run, daemon=True).start()
        try:
            return box.get(timeout=bound)
        except queue.Empty:
            return {"kind": "hang"}

    def add(self, client: Any, rid: str, op: dict) -> None:
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine import EngineCoreRequest

        params = SamplingParams(max_tokens=op["max_tokens"], ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        self.requests[rid] = {"tokens": [], "finish": None, "max_tokens": op["max_tokens"], "aborted": False}
        client.add_request(
            EngineCoreRequest(
                request_id=rid,
                prompt_token_ids=[3] * op["prompt_len"],
                mm_features=None,
                sampling_params=params,
                pooling_params=None,
                arrival_time=time.time(),
                lora_request=None,
                cache_salt=None,
                data_parallel_rank=None,
            )
        )

    def wait_finished(self, rids: list[str], bound: float = REQUEST_BOUND_S) -> None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if all(self.requests[r]["finish"] is not None or self.requests[r]["aborted"] for r in rids):
                return
            time.sleep(0.01)

    def run(self) -> dict:
        client = self.start()
        threads = [threading.Thread(target=self.collect, args=(client,), daemon=True)]
        if getattr(client, "engine_progress", None) is not None:
            threads.append(threading.Thread(target=self.sample, args=(client,), daemon=True))
        for t in threads:
            t.start()
        outcomes: list[dict] = []
        end = "completed"
        started = time.monotonic()
        try:
            for i, op in enumerate(self.ops):
                outcomes.append(self.do(client, i, op))
                if op["op"] == "shutdown":
                    end = "shutdown"
                    break
            final: dict = {}
            if end != "shutdown":
                # Still alive: a request and a utility call get their answers.
                self.add(client, "final", {"max_tokens": 2, "prompt_len": 4})
                self.wait_finished([r for r in self.requests if not self.requests[r]["aborted"]])
                final = {"request": dict(self.requests["final"]), "utility": self.call(client, "reset_prefix_cache")}
                final["engine_dead"] = bool(client.resources.engine_dead)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=2)
            if end != "shutdown":
                with contextlib.suppress(Exception):
                    client.shutdown()
        holds = []
        if os.path.exists(self.files["holds"]):
            with open(self.files["holds"]) as f:
                holds = [json.loads(line) for line in f if line.strip()]
        shutil.rmtree(self.tmp, ignore_errors=True)
        return {
            "outcomes": outcomes,
            "requests": {k: v for k, v in self.requests.items() if k != "final"},
            "final": final,
            "end": end,
            "t0": started,
            "holds": holds,
            "progress": None if len(threads) == 1 else {"samples": self.samples, "reports": self.report_times},
            "idle_windows": self.idle_windows,
            "timeout_s": TIMEOUT_S,
            "engine_error": getattr(self, "engine_error", None),
            "sample_error": getattr(self, "sample_error", None),
        }

    def do(self, client: Any, i: int, op: dict) -> dict:
        kind = op["op"]
        if kind == "add":
            self.add(client, f"r{i}", op)
            return {"kind": "sent"}
        if kind == "abort":
            added = [r for r in self.requests if r != "final"]
            if not added:
                return {"kind": "nothing"}
            rid = added[op["target"] % len(added)]
            if self.requests[rid]["finish"] is None:
                self.requests[rid]["aborted"] = True
            client.abort_requests([rid])
            return {"kind": "sent", "request": rid}
        if kind == "utility":
            return self.call(client, op["call"])
        if kind == "steps":
            if op["speed"] == "slow":
                with open(self.files["slow"], "w") as f:
                    f.write(str(SLOW_STEP_S))
            elif os.path.exists(self.files["slow"]):
                os.unlink(self.files["slow"])
            return {"kind": "set"}
        if kind == "idle":
            # The frontend sends nothing for a while; first the requests in
            # flight finish (an engine with none waits for work).
            self.wait_finished([r for r in self.requests if not self.requests[r]["aborted"]])
            start = time.monotonic()
            time.sleep(IDLE_S)
            self.idle_windows.append([start, time.monotonic()])
            return {"kind": "idle"}
        if kind == "hold":
            if op["what"] == "step":
                open(self.files["hang"], "w").close()
                self.add(client, f"r{i}", {"max_tokens": 1, "prompt_len": 2})
                time.sleep(HOLD_S)
                os.unlink(self.files["hang"])
                return {"kind": "released"}
            open(self.files["rpc-hang"], "w").close()
            box: queue.Queue = queue.Queue()
            threading.Thread(
                target=lambda: box.put(self.call(client, "hang_like_a_stuck_collective", HOLD_S + UTILITY_BOUND_S)),
                daemon=True,
            ).start()
            time.sleep(HOLD_S)
            os.unlink(self.files["rpc-hang"])
            return box.get()
        if kind == "shutdown":
            # The frontend stops asking for progress once it shuts its engine down.
            self.sampling.set()
            client.shutdown()
            return {"kind": "shutdown"}
        raise ValueError(f"unknown operation {op}")


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import vllm
    import vllm.v1.engine.core_client
    from qeo_fake_executor import write_tiny_model

    model_dir = write_tiny_model(tempfile.mkdtemp(prefix="qeo-busy-loop-model-"))
    UTILITIES["hang_like_a_stuck_collective"] = ("collective_rpc", ("hang_like_a_stuck_collective", None, (), None))
    out.write(json.dumps({"vllm": os.path.dirname(vllm.__file__)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        started = time.monotonic()
        try:
            trace = Sequence(request["config"], request["ops"], model_dir).run()
        except Exception:
            trace = {"crash": traceback.format_exc()}
        trace["seconds"] = round(time.monotonic() - started, 3)
        with contextlib.suppress(Exception):
            out.write(json.dumps(trace) + "\n")


if __name__ == "__main__":
    main()
