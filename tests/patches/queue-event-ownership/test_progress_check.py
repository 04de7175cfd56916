# SPDX-License-Identifier: Apache-2.0
"""Regression tests: /health/progress fails when an engine is stuck inside a
step, and only then; /health keeps upstream's meaning unless
VLLM_HEALTH_CHECK_FAILS_ON_STALL is set.

Everything runs through the real path: AsyncLLM, the real engine-core process
(EngineCoreProc with the real EngineCore, Scheduler and busy loop, forked by
the real launcher), the real ZMQ output sockets and AsyncMPClient, the real
instrumentator routers. Only the model executor is replaced
(qeo_fake_executor.FakeExecutor, handed to AsyncLLM as executor_class): the
real one needs a GPU. Log stats are off, the case in which token-less steps
send the frontend nothing.
"""

from __future__ import annotations

import asyncio
import os
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
SLOW_FILE = os.path.join(TMP, "slow")


class Server:
    """An AsyncLLM and the instrumentator app on one event loop thread."""

    def __init__(self) -> None:
        from qeo_fake_executor import FakeExecutor, make_config, write_tiny_model
        from vllm.entrypoints.serve.instrumentator import register_instrumentator_api_routers
        from vllm.v1.engine.async_llm import AsyncLLM

        config = make_config(
            write_tiny_model(os.path.join(TMP, "model")),
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

        self.llm = self.run(start())
        self.app = FastAPI()
        register_instrumentator_api_routers(self.app)
        self.app.state.engine_client = self.llm

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def get(self, path: str) -> int:
        async def get() -> int:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return (await c.get(path)).status_code

        return self.run(get())

    async def generate(self, prompt: Any, max_tokens: int, request_id: str) -> list[int]:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        tokens: list[int] = []
        async for out in self.llm.generate(prompt, params, request_id):
            tokens += out.outputs[0].token_ids
        return tokens

    def shutdown(self) -> None:
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    os.makedirs(TMP, exist_ok=True)
    mp = pytest.MonkeyPatch()
    # Read by the engine-core process (forked with this environment) and the
    # frontend alike.
    mp.setenv("VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS", str(TIMEOUT_S))
    mp.setenv("QEO_PROGRESS_HANG_FILE", HANG_FILE)
    mp.setenv("QEO_PROGRESS_SLOW_FILE", SLOW_FILE)
    mp.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    s = Server()
    try:
        yield s
    finally:
        for f in (HANG_FILE, SLOW_FILE):
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
    assert server.get("/health/progress") == 200
    assert server.get("/health") == 200
    assert server.llm.progress_status().seconds_without_progress < TIMEOUT_S


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
