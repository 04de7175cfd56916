"""A streaming-input session idle between chunks, and /health/progress meanwhile; run inside a runtime.

    python -m vllm_overlay.e2e.stream_probe MODEL_DIR --idle 8

Starts vLLM's ``AsyncLLM`` (the engine the API server runs; the engine core and its worker are
separate processes as there) and mounts vLLM's own health router on a FastAPI app whose
``engine_client`` is that engine, as the API server's app has it; requests go through httpx's ASGI
transport (the routes' real code, no socket). Then one streaming-input session
(``generate()`` with an async generator of ``StreamingInput``, vLLM's resumable requests): a first
chunk, ``--idle`` seconds with nothing sent (longer than VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS, which
the suite sets), a second chunk, the end. /health and /health/progress are asked every half second
throughout. A session waiting on its next chunk is not a stalled engine: the progress check must
answer 200 while it idles. Prints one JSON object (the last line of stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def probe(model: str, idle_s: float) -> dict[str, object]:
    import httpx
    from fastapi import FastAPI
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.protocol import StreamingInput
    from vllm.entrypoints.serve.instrumentator.health import router
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    facts: dict[str, object] = {}
    started = time.monotonic()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, max_model_len=256, dtype="bfloat16", seed=0))
    facts["ready_s"] = round(time.monotonic() - started, 1)
    app = FastAPI()
    app.include_router(router)
    app.state.engine_client = engine
    samples: list[tuple[str, float, int, int]] = []  # (phase, t, /health, /health/progress)
    phase = "before"

    async def sample(client: httpx.AsyncClient) -> None:
        while True:
            health = (await client.get("/health")).status_code
            progress = (await client.get("/health/progress")).status_code
            samples.append((phase, round(time.monotonic() - started, 2), health, progress))
            await asyncio.sleep(0.5)

    async def chunks():  # the session's input: a chunk, an idle gap, a chunk
        nonlocal phase
        phase = "chunk 1"
        yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=list(range(10, 40))))
        await asyncio.sleep(1.0)  # the first chunk's tokens are generated
        phase = "idle"
        await asyncio.sleep(idle_s)
        phase = "chunk 2"
        yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=list(range(40, 60))))

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://e2e") as client:
        sampler = asyncio.create_task(sample(client))
        try:
            await _session(engine, chunks, params, idle_s, facts)
        finally:
            phase = "after"
            await asyncio.sleep(1.0)
            sampler.cancel()
    engine.shutdown()
    _idle_facts(facts, samples)
    return facts


async def _session(engine: object, chunks: object, params: object, idle_s: float, facts: dict[str, object]) -> None:
    """The streaming-input session (its input from ``chunks()``), bounded; how it ended goes into ``facts``."""
    tokens = 0
    try:
        async with asyncio.timeout(idle_s + 120):
            async for output in engine.generate(chunks(), params, "e2e-streaming-input"):
                tokens += sum(len(o.token_ids) for o in output.outputs)
        facts["session"] = f"finished, {tokens} token(s) over two chunks"
        facts["session_ok"] = tokens > 0
    except Exception as exc:  # recorded: the session failed or did not finish in bounds
        facts["session"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        facts["session_ok"] = False


def _idle_facts(facts: dict[str, object], samples: list[tuple[str, float, int, int]]) -> None:
    """What /health and /health/progress answered while the session idled, and every sample."""
    idle = [s for s in samples if s[0] == "idle"]
    facts["idle_samples"] = len(idle)
    facts["idle_health"] = sorted({s[2] for s in idle})
    facts["idle_progress"] = sorted({s[3] for s in idle})
    facts["samples"] = samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--idle", type=float, default=8.0)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(probe(args.model, args.idle)), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
