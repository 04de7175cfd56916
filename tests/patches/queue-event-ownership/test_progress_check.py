# SPDX-License-Identifier: Apache-2.0
"""Regression tests: a progress check (endpoint and metric) that fails when
requests are active and no engine step completed for a configurable time,
and stays healthy when idle or while a long prefill keeps completing steps.

The real FastAPI app routes (instrumentator routers, /metrics included), the
real AsyncLLM output handler and the real OutputProcessor run here. The
engine core process is not started (it needs a model and a device): the
AsyncLLM is built with __new__ as in vLLM's own tests/v1/engine tests, and
its engine-core client is an in-process asyncio queue of EngineCoreOutputs,
one batch per completed engine step. Time is a fake clock handed to the
tracker so no test sleeps.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from unittest.mock import AsyncMock

import httpx
import pytest
from fastapi import FastAPI
from vllm.entrypoints.serve.instrumentator import register_instrumentator_api_routers
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.output_processor import OutputProcessor

MODEL = "qeo-progress-model"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_llm() -> tuple[AsyncLLM, asyncio.Queue]:
    steps: asyncio.Queue = asyncio.Queue()
    llm = AsyncLLM.__new__(AsyncLLM)
    llm.output_processor = OutputProcessor(None, log_stats=False)
    llm.engine_core = SimpleNamespace(
        resources=SimpleNamespace(engine_dead=False),
        get_output_async=steps.get,
        abort_requests_async=AsyncMock(),
        shutdown=lambda timeout=None: None,
    )
    llm.log_stats = False
    llm.logger_manager = None
    llm.renderer = SimpleNamespace(mm_processor_cache=None, stat_mm_cache=lambda: None, shutdown=lambda: None)
    llm.model_config = SimpleNamespace(served_model_name=MODEL)
    llm.output_handler = None
    return llm, steps


def add_request(llm: AsyncLLM, request_id: str) -> None:
    request = EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=[1, 2, 3],
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        arrival_time=0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    request.external_req_id = request_id
    llm.output_processor.add_request(request, None)


async def complete_step(steps: asyncio.Queue) -> None:
    """Deliver one completed step that produced no token (a prefill chunk)
    and wait until the output handler has taken it."""
    await steps.put(EngineCoreOutputs(outputs=[]))
    for _ in range(1000):
        if steps.empty():
            return
        await asyncio.sleep(0)
    raise AssertionError("output handler never consumed the step")


_APP: FastAPI | None = None


def app_for(llm: AsyncLLM) -> FastAPI:
    # The instrumentator registers process-global Prometheus metrics, so the
    # routers are mounted once per test process and the client swapped.
    global _APP
    if _APP is None:
        _APP = FastAPI()
        register_instrumentator_api_routers(_APP)
    _APP.state.engine_client = llm
    return _APP


async def get(app: FastAPI, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        return await c.get(path)


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{MODEL}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_progress_check_fails_only_while_busy_without_steps(monkeypatch):
    """Idle: healthy. Active with no completed step for longer than the
    configured timeout (0 s here): the progress check fails while /health,
    the liveness check, still answers 200."""
    monkeypatch.setenv("VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS", "0")

    async def scenario() -> None:
        llm, _ = make_llm()
        app = app_for(llm)
        idle = await get(app, "/health/progress")
        assert idle.status_code == 200, idle.text

        add_request(llm, "r1")
        # Let the monotonic clock move past the 0 s timeout.
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() == start:
            await asyncio.sleep(0)
        busy = await get(app, "/health/progress")
        assert busy.status_code == 503, busy.text
        assert busy.json()["num_active_requests"] == 1
        assert (await get(app, "/health")).status_code == 200

    asyncio.run(scenario())


def test_long_prefill_progress_stays_healthy_and_stall_shows_in_metric(
    monkeypatch,
):
    """Steps that produce no token (prefill chunks) count as progress; once
    they stop for longer than the timeout, both endpoint and metric report
    the stall, and the next step clears it."""
    monkeypatch.setenv("VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS", "10")

    async def scenario() -> None:
        llm, steps = make_llm()
        clock = FakeClock()
        llm.output_processor.progress.clock = clock
        app = app_for(llm)
        llm._run_output_handler()
        try:
            clock.now += 500  # long idle gap before the request: not a stall
            add_request(llm, "long-prompt")
            for _ in range(4):  # 4 prefill chunks, 8 s each: 32 s in total
                clock.now += 8
                await complete_step(steps)
                resp = await get(app, "/health/progress")
                assert resp.status_code == 200, resp.text

            clock.now += 11  # the engine stops completing steps
            resp = await get(app, "/health/progress")
            assert resp.status_code == 503, resp.text
            scrape = (await get(app, "/metrics")).text
            assert metric(scrape, "vllm:engine_progress_stalled") == 1.0
            assert metric(scrape, "vllm:engine_seconds_without_progress") == 11.0

            await complete_step(steps)
            resp = await get(app, "/health/progress")
            assert resp.status_code == 200, resp.text
            scrape = (await get(app, "/metrics")).text
            assert metric(scrape, "vllm:engine_progress_stalled") == 0.0
        finally:
            assert llm.output_handler is not None
            llm.output_handler.cancel()

    asyncio.run(scenario())


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
