# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: an RPC that fails or times out before it has read every
rank's reply leaves no reply behind to be taken for the next RPC's.

On vLLM 0.33.0, collective_rpc reads the replies rank by rank and stops at
the first failure (fault tolerance off) or at its deadline; the replies it
did not read stay in their queues and the next RPC reads them as its own.
With fault tolerance and a KV connector, the finished sending notices of the
replies a timed-out RPC dropped still reach the next aggregate.

Real executor RPC path, real WorkerProc ranks (each constructed by its
__init__, each busy loop in its own thread), output threads and shared-memory
message queues; the GPU worker is a stand-in, see qeo_worker_pipeline.py for
each seam and why.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from qeo_worker_pipeline import Pipeline, as_the_engine_core, rank_output
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_failure_read_from_rank_0_leaves_no_stale_reply(monkeypatch, async_scheduling):
    """TP=2, fault tolerance off: rank 0 fails a collective RPC, rank 1
    answers it. The RPC raises rank 0's error, and the next one gets both
    ranks' own replies (on 0.33.0 it gets rank 1's reply to the failed RPC,
    and every later RPC the reply before its own)."""
    calls = {0: 0, 1: 0}

    def step(rank: int, method: str, batch: Any) -> Any:
        calls[rank] += 1
        if rank == 0 and calls[rank] == 1:
            raise RuntimeError("rank 0: out of memory")
        return f"rank {rank} reply {calls[rank]}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=async_scheduling)
    try:
        with pytest.raises(RuntimeError, match="rank 0: out of memory"):
            pipe.executor.collective_rpc("check_health")
        assert pipe.executor.collective_rpc("check_health") == ["rank 0 reply 2", "rank 1 reply 2"]
        assert pipe.executor.collective_rpc("check_health") == ["rank 0 reply 3", "rank 1 reply 3"]
        assert not pipe.executor.is_failed
    finally:
        pipe.close()


def test_every_rank_failing_is_reported_once(monkeypatch):
    """TP=2, a collective RPC on which both ranks fail: the RPC raises, and
    the rank whose failure was read second does not fail the next RPC."""
    calls = {0: 0, 1: 0}

    def step(rank: int, method: str, batch: Any) -> Any:
        calls[rank] += 1
        if calls[rank] == 1:
            raise RuntimeError(f"rank {rank}: out of memory")
        return f"rank {rank} healthy"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False)
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            pipe.executor.collective_rpc("check_health")
        assert pipe.executor.collective_rpc("check_health") == ["rank 0 healthy", "rank 1 healthy"]
        assert not pipe.executor.is_failed
    finally:
        pipe.close()


def test_timed_out_rpc_leaves_no_stale_reply(monkeypatch):
    """TP=2: a collective RPC with a 0.3 s timeout times out on rank 0, which
    replies 1 s late; rank 1 replied at once. The next RPC gets both ranks'
    own replies, not the timed-out RPC's (on 0.33.0 it gets both of those)."""
    calls = {0: 0, 1: 0}

    def step(rank: int, method: str, batch: Any) -> Any:
        calls[rank] += 1
        if rank == 0 and calls[rank] == 1:
            time.sleep(1.0)
        return f"rank {rank} reply {calls[rank]}"

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False)
    try:
        with pytest.raises(TimeoutError, match="RPC call to check_health timed out"):
            pipe.executor.collective_rpc("check_health", timeout=0.3)
        assert pipe.executor.collective_rpc("check_health", timeout=10) == ["rank 0 reply 2", "rank 1 reply 2"]
        assert not pipe.executor.is_failed
    finally:
        pipe.close()


def test_fault_tolerance_keeps_kv_notices_of_a_timed_out_rpc(monkeypatch):
    """Fault tolerance and a KV connector, TP=2: batch B times out
    (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1) while rank 0 finishes its step 1.5 s
    late; both ranks report req-0 finished sending in B. The next batch C gets
    its own output, not B's (as 0.33.0 hands it), and the notices of the two
    dropped replies reach C's aggregate: req-0 finished sending."""
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1")

    def step(rank: int, method: str, batch: Any) -> Any:
        finished: set[str] | None = None
        if batch == "B":
            if rank == 0:
                time.sleep(1.5)
            finished = {"req-0"}
        return rank_output(rank, batch, finished)

    pipe = Pipeline(monkeypatch, step, world_size=2, async_scheduling=False, fault_tolerance=True)
    pipe.executor.kv_output_aggregator = KVOutputAggregator(expected_finished_count=2)
    try:
        with pytest.raises(TimeoutError, match="RPC call to execute_model timed out"):
            pipe.executor.execute_model("B")
        c = pipe.executor.execute_model("C")
        assert c.req_ids == ["rank 0 C"]
        assert c.kv_connector_output.finished_sending == {"req-0"}
        assert not pipe.executor.is_failed
    finally:
        pipe.close()


def test_pp2_batch_after_a_failed_utility_call_gets_its_own_output(monkeypatch):
    """PP=2 (one rank per stage, the last stage's rank 1 is the output rank),
    fault tolerance off, the batch queue holding two batches: a utility RPC
    that raises on both ranks (a LoRA adapter the workers reject) reaches its
    caller, both batches are delivered, and the next batch gets rank 1's
    output of it. On 0.33.0 the utility RPC stops at rank 0's failure, and
    the next batch reads rank 1's failure to the utility RPC as its own
    output: the engine dies on the first rejected adapter."""
    rejected = "LoRA rank 64 is greater than max_lora_rank 16"

    def step(rank: int, method: str, batch: Any) -> Any:
        if method == "add_lora":
            raise ValueError(rejected)
        if batch in ("A", "B") and rank == 1:
            time.sleep(0.2)  # the last stage still computes while the call comes
        return f"rank {rank} output of {batch}"

    pipe = Pipeline(monkeypatch, step, world_size=2, pipeline_parallel_size=2, async_scheduling=False)
    try:

        def engine_core() -> list[Any]:
            # One thread, as the engine core's busy loop with its batch queue.
            futures = [pipe.executor.execute_model(b, non_block=True) for b in ("A", "B")]
            with pytest.raises(RuntimeError, match=rejected):
                pipe.executor.collective_rpc("add_lora", args=("lora",))
            return [f.result() for f in futures] + [pipe.executor.execute_model("C")]

        assert as_the_engine_core(engine_core) == ["rank 1 output of A", "rank 1 output of B", "rank 1 output of C"]
        assert not pipe.executor.is_failed
    finally:
        pipe.close()
