# SPDX-License-Identifier: Apache-2.0
"""Loading a speculative draft the way vLLM's engine does, for the draft-placeholder tests."""

from vllm.config import (
    DeviceConfig,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    SpeculativeConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.model_loader import DefaultModelLoader


def load_speculative_draft(target: str, method: str, draft: str | None = None):
    """Load a draft as vLLM's engine does: the real ``SpeculativeConfig`` derives the draft's
    model config from the target checkpoint (``draft`` for separate EAGLE checkpoints, none for
    MTP), and the real ``DefaultModelLoader`` loads it on the CPU. Returns (draft, vllm_config)."""
    target_config = ModelConfig(model=target, skip_tokenizer_init=True)
    parallel_config = ParallelConfig()
    speculative_config = SpeculativeConfig(
        method=method,
        model=draft,
        num_speculative_tokens=1,
        target_model_config=target_config,
        target_parallel_config=parallel_config,
    )
    vllm_config = VllmConfig(
        model_config=target_config,
        parallel_config=parallel_config,
        speculative_config=speculative_config,
        device_config=DeviceConfig(device="cpu"),
        load_config=LoadConfig(),
    )
    loader = DefaultModelLoader(vllm_config.load_config)
    with set_current_vllm_config(vllm_config):
        model = loader.load_model(vllm_config, model_config=speculative_config.draft_model_config)
    return model, vllm_config
