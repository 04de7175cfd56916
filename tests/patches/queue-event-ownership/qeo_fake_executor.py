# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A model executor for a real EngineCore on a machine without a GPU.

EngineCore, its Scheduler, KV cache manager and busy loop, the engine-core
process, its ZMQ sockets and the AsyncLLM frontend are all the real vLLM
code. Only the executor is replaced: the real one starts GPU workers and
runs the model. This one answers the same calls the way a GPU worker would
(a KV cache spec, a free-memory figure, one sampled token per scheduled
decode request) and can be made to hang inside a step, as a wedged GPU or a
stuck collective does, through a file the test creates: the executor lives
in the engine-core process, the test in the frontend process.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

BLOCK_SIZE = 16
NUM_BLOCKS = 512

TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_hidden_layers=1,
    vocab_size=256,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    torch_dtype="float32",
)


def _done(result: Any) -> Future:
    future: Future = Future()
    future.set_result(result)
    return future


def write_tiny_model(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    return path


class FakeExecutor(Executor):
    """One fake worker, in the engine-core process."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        self.hang_file = os.environ["QEO_PROGRESS_HANG_FILE"]
        self.slow_file = os.environ["QEO_PROGRESS_SLOW_FILE"]
        # req_id -> tokens still to prefill, as a model runner tracks it.
        self.prefill_left: dict[str, int] = {}
        self._last: Any = None

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):  # type: ignore[override]
        if method == "get_kv_cache_spec":
            spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float32)
            result: Any = [{"model.layers.0.self_attn.attn": spec}]
        elif method == "determine_available_memory":
            result = [NUM_BLOCKS * BLOCK_SIZE * 2 * 4 * 16 * 4]
        elif method == "get_supported_kv_cache_layouts":
            result = [["LBNHC"]]
        elif method == "get_supported_tasks":
            result = [("generate",)]
        elif method == "hang_like_a_stuck_collective":
            # A utility call (LLM.collective_rpc) that hangs in the worker, as
            # a stuck collective does, while its own hang file exists (steps
            # are not held by it).
            while os.path.exists(os.environ.get("QEO_PROGRESS_RPC_HANG_FILE", "")):
                time.sleep(0.01)
            result = ["done"]
        else:
            result = [None]
        return result

    def execute_model(self, scheduler_output, non_block=False):  # type: ignore[override]
        # A hung device step: the call does not return while the file exists.
        while os.path.exists(self.hang_file):
            time.sleep(0.01)
        if os.path.exists(self.slow_file):
            with open(self.slow_file) as f:
                time.sleep(float(f.read()))
        for new in scheduler_output.scheduled_new_reqs:
            self.prefill_left[new.req_id] = len(new.prompt_token_ids or []) - new.num_computed_tokens
        self._last = scheduler_output
        # As the GPU model runner: an empty batch answers at once, with no
        # sampling step after it.
        result = EMPTY_MODEL_RUNNER_OUTPUT if scheduler_output.total_num_scheduled_tokens == 0 else None
        return _done(result) if non_block else result

    def sample_tokens(self, grammar_output, non_block=False):  # type: ignore[override]
        num_scheduled = self._last.num_scheduled_tokens
        req_ids = list(num_scheduled)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            left = self.prefill_left.get(req_id, 0) - num_scheduled[req_id]
            self.prefill_left[req_id] = max(0, left)
            # A step that ends inside the prompt (a prefill chunk) samples
            # nothing; otherwise one token.
            sampled.append([] if left > 0 else [7])
        out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        return _done(out) if non_block else out

    def compile_or_warm_up_model(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def make_config(
    model_dir: str, kv_transfer_config: Any = None, parallel_config: Any = None, **scheduler: Any
) -> VllmConfig:
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig

    return VllmConfig(
        parallel_config=parallel_config if parallel_config is not None else ParallelConfig(),
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=2048, enforce_eager=True),
        cache_config=CacheConfig(block_size=BLOCK_SIZE),
        scheduler_config=SchedulerConfig(**scheduler),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=kv_transfer_config,
    )
