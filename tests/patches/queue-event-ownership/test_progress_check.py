# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: /health/progress fails when an engine is stuck inside a
step, and only then; /health keeps upstream's meaning unless
VLLM_HEALTH_CHECK_FAILS_ON_STALL is set.

Everything runs through the real path, laid out as `vllm serve
--api-server-count 2` lays it out: the engine-core process is launched for two
API servers by the real launcher (bind_engine_zmq_listeners,
launch_core_engines: EngineCoreProc with the real EngineCore, Scheduler and
busy loop, one output socket per API server), and each API server is a real
AsyncLLM (AsyncMPClient, its socket reader, the real instrumentator routers)
given its listeners, client_count and client_index, as an API server process
gets them. Both frontends live in the test process, on one event loop: the
API server processes of `vllm serve` would each import vLLM again (an engine
and two more vLLM processes cost minutes on a CI machine), and what the check
reads, the socket each frontend's reports arrive on, is the same.

Only two things are replaced. The model executor (qeo_fake_executor.
FakeExecutor): the real one needs a GPU. And the remote end of a
disaggregated prefill: a KV connector (qeo_remote_kv_connector), loaded by
vLLM's KVConnectorFactory from kv_transfer_config, whose transfers never
finish. Log stats are off, the case in which token-less steps send the
frontend nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

TIMEOUT_S = 1.0
TMP = f"/tmp/qeo-progress-{os.getpid()}"
HANG_FILE = os.path.join(TMP, "hang")
RPC_HANG_FILE = os.path.join(TMP, "rpc-hang")
SLOW_FILE = os.path.join(TMP, "slow")


NUM_FRONTENDS = 2
RECORD_FILE = os.path.join(TMP, "remote-kv.json")


class Server:
    """One engine core serving two API servers, each an AsyncLLM with the
    instrumentator app, on one event loop thread."""

    def __init__(self) -> None:
        from qeo_fake_executor import FakeExecutor, make_config, write_tiny_model
        from vllm.config import KVTransferConfig
        from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines

        config = make_config(
            write_tiny_model(os.path.join(TMP, "model")),
            # A decode instance of a disaggregated prefill deployment.
            kv_transfer_config=KVTransferConfig(
                kv_connector="NeverArrivingRemoteKVConnector",
                kv_connector_module_path="qeo_remote_kv_connector",
                kv_role="kv_consumer",
            ),
            max_num_batched_tokens=256,
            max_num_seqs=8,
            max_model_len=2048,
            is_encoder_decoder=False,
        )
        # As vllm.entrypoints.cli.serve.run_multi_api_server does.
        config.parallel_config._api_process_count = NUM_FRONTENDS
        self.listeners = bind_engine_zmq_listeners(config, NUM_FRONTENDS)
        with launch_core_engines(config, FakeExecutor, False, self.listeners.addresses) as launch:
            self.engine_manager = launch.engine_manager
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start(index: int) -> Any:
            from vllm.v1.engine.async_llm import AsyncLLM

            # The client_config APIServerProcessManager hands API server i.
            client_config = {
                "input_address": self.listeners.inputs[index].address,
                "output_address": self.listeners.outputs[index].address,
                "input_listener": self.listeners.inputs[index].socket,
                "output_listener": self.listeners.outputs[index].socket,
            }
            return AsyncLLM(
                config,
                executor_class=FakeExecutor,
                log_stats=False,
                client_addresses=client_config,
                client_count=NUM_FRONTENDS,
                client_index=index,
            )

        self.llms = [self.run(start(i)) for i in range(NUM_FRONTENDS)]
        self.apps = [self.make_app(llm) for llm in self.llms]

    @property
    def llm(self) -> Any:
        return self.llms[0]

    @staticmethod
    def make_app(llm: Any) -> FastAPI:
        from vllm.entrypoints.serve.elastic_ep.middleware import ScalingMiddleware
        from vllm.entrypoints.serve.instrumentator import register_instrumentator_api_routers

        app = FastAPI()
        register_instrumentator_api_routers(app)
        # As init_entrypoints_middleware does for every "generate" server.
        app.add_middleware(ScalingMiddleware)
        app.state.engine_client = llm
        return app

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def get(self, path: str, frontend: int = 0) -> int:
        return self.get_response(path, frontend).status_code

    def get_response(self, path: str, frontend: int = 0) -> httpx.Response:
        async def get() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.apps[frontend])
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                response = await c.get(path)
                await response.aread()
                return response

        return self.run(get())

    async def generate(self, prompt: Any, max_tokens: int, request_id: str, **extra_args: Any) -> list[int]:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args or None,
        )
        tokens: list[int] = []
        async for out in self.llm.generate(prompt, params, request_id):
            tokens += out.outputs[0].token_ids
        return tokens

    def shutdown(self) -> None:
        for llm in self.llms:
            llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.engine_manager is not None:
            self.engine_manager.shutdown()
        self.listeners.cleanup()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    os.makedirs(TMP, exist_ok=True)
    mp = pytest.MonkeyPatch()
    # Read by the engine-core process (forked with this environment) and the
    # frontend alike.
    mp.setenv("VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS", str(TIMEOUT_S))
    mp.setenv("QEO_PROGRESS_HANG_FILE", HANG_FILE)
    mp.setenv("QEO_PROGRESS_RPC_HANG_FILE", RPC_HANG_FILE)
    mp.setenv("QEO_PROGRESS_SLOW_FILE", SLOW_FILE)
    mp.setenv("QEO_REMOTE_KV_RECORD", RECORD_FILE)
    mp.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    s = Server()
    try:
        yield s
    finally:
        for f in (HANG_FILE, RPC_HANG_FILE, SLOW_FILE, RECORD_FILE):
            if os.path.exists(f):
                os.unlink(f)
        s.shutdown()
        mp.undo()


def poll_healthy_while(server: Server, work: Future) -> int:
    """/health/progress answers while work runs; returns how many polls."""
    polls = 0
    while not work.done():
        assert server.get("/health/progress") == 200
        polls += 1
        time.sleep(0.1)
    work.result()
    return polls


def test_idle_server_is_healthy(server):
    time.sleep(3 * TIMEOUT_S)
    for frontend in range(NUM_FRONTENDS):
        assert server.get("/health/progress", frontend) == 200
        assert server.get("/health", frontend) == 200
    assert server.llm.progress_status().seconds_without_progress < TIMEOUT_S


def test_idle_engine_sends_its_frontends_nothing(server):
    """Passes on 0.33.0, which sends an idle engine's frontends nothing (log
    stats off). A user who never asks for /health/progress must not pay for
    it on an idle server: the engine, once it waits for work, sends each
    frontend at most the one report saying so, then nothing; so a frontend
    whose socket reader starts late finds at most that one queued. (That the
    silence is no stall: test_idle_server_is_healthy.)"""
    time.sleep(TIMEOUT_S)  # idle since the previous test: its report is sent
    received = [0] * NUM_FRONTENDS
    decoders = [llm.engine_core.decoder for llm in server.llms]
    for frontend, decoder in enumerate(decoders):

        def counting(frames: Any, decode: Any = decoder.decode, frontend: int = frontend) -> Any:
            received[frontend] += 1
            return decode(frames)

        decoder.decode = counting
    try:
        time.sleep(3 * TIMEOUT_S)
    finally:
        for decoder in decoders:
            del decoder.decode
    assert received == [0] * NUM_FRONTENDS, f"an idle engine sent its frontends {received} messages in {3 * TIMEOUT_S}s"


def test_long_prefill_of_tokenless_steps_is_healthy(server):
    """A 1,500-token prompt in 256-token chunks, 0.4 s a step: 2.4 s of steps
    that produce no token, more than twice the timeout."""
    with open(SLOW_FILE, "w") as f:
        f.write("0.4")
    try:
        from vllm.inputs import TokensPrompt

        work = server.submit(server.generate(TokensPrompt(prompt_token_ids=[5] * 1500), 2, "long-prefill"))
        assert poll_healthy_while(server, work) >= 15
    finally:
        os.unlink(SLOW_FILE)


def test_idle_streaming_input_session_is_healthy(server):
    """A streaming-input session whose next chunk comes 3 timeouts later."""
    from vllm.engine.protocol import StreamingInput
    from vllm.inputs import TokensPrompt

    next_chunk = asyncio.Event()

    async def chunks() -> AsyncGenerator[StreamingInput, None]:
        yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=[1, 2, 3]))
        await next_chunk.wait()
        yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=[4, 5]))

    work = server.submit(server.generate(chunks(), 2, "stream"))
    deadline = time.monotonic() + 3 * TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.get("/health/progress") == 200
        time.sleep(0.1)
    assert server.llm.output_processor.get_num_unfinished_requests() == 1
    server.loop.call_soon_threadsafe(next_chunk.set)
    assert work.result(30)


@pytest.mark.parametrize("health_fails_on_stall", [False, True])
def test_stuck_step_detected_within_timeout(server, monkeypatch, health_fails_on_stall):
    if health_fails_on_stall:
        monkeypatch.setenv("VLLM_HEALTH_CHECK_FAILS_ON_STALL", "1")
    from vllm.inputs import TokensPrompt

    open(HANG_FILE, "w").close()
    try:
        start = time.monotonic()
        prompt = TokensPrompt(prompt_token_ids=[1, 2, 3])
        work = server.submit(server.generate(prompt, 2, f"stuck-{health_fails_on_stall}"))
        while server.get("/health/progress") == 200:
            assert time.monotonic() - start < 10 * TIMEOUT_S, "stall never reported"
            time.sleep(0.05)
        detected_s = time.monotonic() - start
        # Timeout plus one report interval (timeout / 4) plus scheduling slack.
        assert TIMEOUT_S < detected_s < TIMEOUT_S + TIMEOUT_S / 4 + 0.5, detected_s
        assert server.get("/health") == (503 if health_fails_on_stall else 200)
    finally:
        os.unlink(HANG_FILE)
    assert work.result(30) == [7, 7]
    # Healthy again from the engine's next report (one interval, timeout / 4).
    time.sleep(2 * TIMEOUT_S / 4)
    assert server.get("/health/progress") == 200
    assert server.get("/health") == 200


def test_request_waiting_for_remote_kv_is_healthy(server):
    """A decode request whose prompt KV the prefill instance never sends: the
    scheduler holds it in WAITING_FOR_REMOTE_KVS, polling it every step, for
    three timeouts."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=list(range(1, 34)))
    remote = {"do_remote_prefill": True}
    work = server.submit(server.generate(prompt, 2, "remote-kv", kv_transfer_params=remote))
    deadline = time.monotonic() + 3 * TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.get("/health/progress") == 200
        time.sleep(0.1)
    # What the engine's scheduler did with it, as its connector saw it on
    # the latest step.
    with open(RECORD_FILE) as f:
        record = json.load(f)
    assert record["status"] == "WAITING_FOR_REMOTE_KVS", record
    assert record["seconds_waiting"] > 2 * TIMEOUT_S, record
    assert not work.done()

    work.cancel()
    # The abort reaches the scheduler, which releases the request through
    # its connector.
    deadline = time.monotonic() + 30
    while not record["finished"]:
        assert time.monotonic() < deadline, record
        time.sleep(0.05)
        with open(RECORD_FILE) as f:
            record = json.load(f)
    assert record["status"] == "FINISHED_ABORTED", record


def test_every_frontend_sees_a_stuck_step(server):
    """Reports go to every API server: frontend 1, with no request of its
    own, detects a step hung on frontend 0's request as soon as frontend 0."""
    from vllm.inputs import TokensPrompt

    open(HANG_FILE, "w").close()
    try:
        start = time.monotonic()
        work = server.submit(server.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), 2, "stuck-all"))
        while server.get("/health/progress", frontend=1) == 200:
            assert time.monotonic() - start < 10 * TIMEOUT_S, "stall never reported to frontend 1"
            time.sleep(0.05)
        detected_s = time.monotonic() - start
        assert TIMEOUT_S < detected_s < TIMEOUT_S + TIMEOUT_S / 4 + 0.5, detected_s
        assert server.get("/health/progress", frontend=0) == 503
        assert server.llms[1].output_processor.get_num_unfinished_requests() == 0
    finally:
        os.unlink(HANG_FILE)
    assert work.result(30) == [7, 7]
    time.sleep(2 * TIMEOUT_S / 4)
    for frontend in range(NUM_FRONTENDS):
        assert server.get("/health/progress", frontend) == 200


@pytest.mark.parametrize("health_fails_on_stall", [False, True])
def test_hung_utility_call_is_detected(server, monkeypatch, health_fails_on_stall):
    """A utility call runs in the engine's busy loop like a step: one that
    hangs in the worker (LLM.collective_rpc, as a stuck collective) stops
    every request and must read as stuck, with what it is stuck in."""
    if health_fails_on_stall:
        monkeypatch.setenv("VLLM_HEALTH_CHECK_FAILS_ON_STALL", "1")
    open(RPC_HANG_FILE, "w").close()
    try:
        start = time.monotonic()
        work = server.submit(server.llm.collective_rpc("hang_like_a_stuck_collective"))
        while server.get("/health/progress") == 200:
            assert time.monotonic() - start < 10 * TIMEOUT_S, "hung utility call never reported"
            time.sleep(0.05)
        detected_s = time.monotonic() - start
        assert TIMEOUT_S < detected_s < TIMEOUT_S + TIMEOUT_S / 4 + 0.5, detected_s
        body = server.get_response("/health/progress").json()
        assert body["stalled"] and body["stuck_in"] == "utility:collective_rpc", body
        assert server.get("/health") == (503 if health_fails_on_stall else 200)
        assert server.get("/health/progress", frontend=1) == 503
    finally:
        os.unlink(RPC_HANG_FILE)
    assert work.result(30) == ["done"]
    time.sleep(2 * TIMEOUT_S / 4)
    assert server.get("/health/progress") == 200
    assert server.get("/health") == 200


@pytest.mark.parametrize("path", ["/health", "/health/progress"])
def test_retired_rank_after_elastic_ep_scale_down_stays_healthy(server, monkeypatch, path):
    """External-LB elastic EP: a scale down retires this API server's rank
    (AsyncLLM._scale_elastic_ep sets the retired flag); its engine exits and
    the orchestrator removes the process. 0.33.0's /health answers 200 for
    the retired rank; so must /health with VLLM_HEALTH_CHECK_FAILS_ON_STALL
    and /health/progress, also while scaling is in progress, and no matter
    how long the engine has been silent.

    Replaced: the engine's exit. The engine core is stopped (SIGSTOP), so it
    sends nothing, as an exited one; an exited process would end the engine
    the other tests of this module share."""
    from vllm.entrypoints.serve.elastic_ep import middleware

    monkeypatch.setenv("VLLM_HEALTH_CHECK_FAILS_ON_STALL", "1")
    (pid,) = [p.pid for p in server.engine_manager.processes]
    # Engines pause while scaling: that is not a stall.
    middleware.set_scaling_elastic_ep(True)
    try:
        assert server.get(path) == 200
        middleware.set_elastic_ep_rank_retired(True)
        os.kill(pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 3 * TIMEOUT_S
            while time.monotonic() < deadline:
                assert server.get(path) == 200
                time.sleep(0.1)
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        middleware.set_elastic_ep_rank_retired(False)
        middleware.set_scaling_elastic_ep(False)
    # Serving again, and the resumed engine reports again.
    time.sleep(2 * TIMEOUT_S / 4)
    assert server.get(path) == 200


class DPServer:
    """Two real engine cores (DP=2, internal load balancing: the
    DPLBAsyncMPClient and its DP coordinator) behind one AsyncLLM."""

    def __init__(self) -> None:
        from qeo_fake_executor import FakeExecutor, make_config, write_tiny_model
        from vllm.config import ParallelConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        config = make_config(
            write_tiny_model(os.path.join(TMP, "model")),
            parallel_config=ParallelConfig(data_parallel_size=2, data_parallel_size_local=2),
            max_num_batched_tokens=256,
            max_num_seqs=8,
            max_model_len=2048,
            is_encoder_decoder=False,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> Any:
            return AsyncLLM(config, executor_class=FakeExecutor, log_stats=False)

        self.llm = asyncio.run_coroutine_threadsafe(start(), self.loop).result(120)
        self.app = Server.make_app(self.llm)

    def get(self, path: str) -> int:
        async def get() -> int:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return (await c.get(path)).status_code

        return asyncio.run_coroutine_threadsafe(get(), self.loop).result(60)

    def shutdown(self) -> None:
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def dp_server() -> Iterator[DPServer]:
    os.makedirs(TMP, exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS", str(TIMEOUT_S))
    mp.setenv("QEO_PROGRESS_HANG_FILE", HANG_FILE)
    mp.setenv("QEO_PROGRESS_RPC_HANG_FILE", RPC_HANG_FILE)
    mp.setenv("QEO_PROGRESS_SLOW_FILE", SLOW_FILE)
    mp.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    s = DPServer()
    try:
        yield s
    finally:
        s.shutdown()
        mp.undo()


@pytest.mark.parametrize("path", ["/health", "/health/progress"])
def test_engine_removed_by_elastic_ep_scale_down_is_not_a_stall(dp_server, monkeypatch, path):
    """Internal-LB elastic EP scale down from 2 engines to 1:
    DPLBAsyncMPClient._commit_scale_down_elastic_ep drops the removed engine
    from core_engines (the engines requests are routed to), then the engine
    exits. It stops reporting; the check must not count it as stalled.

    Replaced: the Ray actor manager that scale down needs (the test machine
    has no Ray cluster): its effect on the frontend is applied here, the
    client's core_engines truncated to the surviving engine as the real
    commit does, and the removed engine core is stopped (SIGSTOP, silent as
    an exited one; an exited process would trip the multiprocessing engine
    monitor, which Ray's actor manager does not have)."""
    monkeypatch.setenv("VLLM_HEALTH_CHECK_FAILS_ON_STALL", "1")
    client = dp_server.llm.engine_core
    assert len(client.core_engines) == 2
    # Both engines report first.
    time.sleep(2 * TIMEOUT_S)
    assert dp_server.get(path) == 200
    removed = dp_server.llm.engine_core.resources.engine_manager.processes[1]
    old_core_engines = client.core_engines
    client.core_engines = old_core_engines[:1]
    os.kill(removed.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 3 * TIMEOUT_S
        while time.monotonic() < deadline:
            assert dp_server.get(path) == 200
            time.sleep(0.1)
    finally:
        os.kill(removed.pid, signal.SIGCONT)
        client.core_engines = old_core_engines
