# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Loading a speculative draft the way vLLM's engine does, for the draft-placeholder tests."""

import json
import os

import torch
from safetensors.torch import save_file
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


def write_checkpoint(path, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    """A model folder: ``config.json`` and one safetensors file."""
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return str(path)


def speculative_vllm_config(
    target: str, method: str, draft: str | None = None, *, pipeline_parallel_size: int = 1, **speculative_options
) -> VllmConfig:
    """The engine's config for ``target`` with a ``method`` draft: the real ``SpeculativeConfig``
    derives the draft's model config from the target checkpoint (``draft`` for separate
    checkpoints, none for MTP). ``pipeline_parallel_size`` is the configured PP size;
    ``speculative_options`` are further ``SpeculativeConfig`` fields, as a user passes them."""
    target_config = ModelConfig(model=target, skip_tokenizer_init=True)
    parallel_config = ParallelConfig(pipeline_parallel_size=pipeline_parallel_size)
    speculative_config = SpeculativeConfig(
        method=method,
        model=draft,
        num_speculative_tokens=1,
        target_model_config=target_config,
        target_parallel_config=parallel_config,
        **speculative_options,
    )
    return VllmConfig(
        model_config=target_config,
        parallel_config=parallel_config,
        speculative_config=speculative_config,
        device_config=DeviceConfig(device="cpu"),
        load_config=LoadConfig(),
    )


def load_target(vllm_config: VllmConfig) -> torch.nn.Module:
    """The target model, loaded by the real ``DefaultModelLoader`` on the CPU."""
    loader = DefaultModelLoader(vllm_config.load_config)
    with set_current_vllm_config(vllm_config):
        return loader.load_model(vllm_config, model_config=vllm_config.model_config)


def load_speculative_draft(target: str, method: str, draft: str | None = None, **speculative_options):
    """Load a draft as vLLM's engine does (see ``speculative_vllm_config``) with the real
    ``DefaultModelLoader`` on the CPU. Returns (draft, vllm_config)."""
    vllm_config = speculative_vllm_config(target, method, draft, **speculative_options)
    loader = DefaultModelLoader(vllm_config.load_config)
    with set_current_vllm_config(vllm_config):
        model = loader.load_model(vllm_config, model_config=vllm_config.speculative_config.draft_model_config)
    return model, vllm_config
