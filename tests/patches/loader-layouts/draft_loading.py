# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Loading a speculative draft the way vLLM's engine does, for the draft-placeholder tests."""

import contextlib
import json
import os
import tempfile

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


@contextlib.contextmanager
def gloo_world():
    """A real single-process gloo world (TP=PP=1) for loading drafts on CPU."""
    from vllm.distributed import cleanup_dist_env_and_memory, init_distributed_environment, initialize_model_parallel

    fd, store = tempfile.mkstemp()
    os.close(fd)
    try:
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"file://{store}",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        yield
        cleanup_dist_env_and_memory()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(store)


def use_cpu_attention_backend(monkeypatch) -> None:
    """Lets a draft or target with attention layers be built on this CPU-only machine.

    ``Attention`` asks the platform for a backend; with no accelerator the
    platform is ``UnspecifiedPlatform``, which offers none ("Invalid attention
    backend for None"). Only its ``get_attn_backend_cls`` is replaced by
    ``CpuPlatform``'s -- vLLM's own selector tests put ``CpuPlatform`` in place
    for the same reason -- so every other platform query is unchanged. The
    attention layers are built, never run. (The selector caches its answer
    without the platform in the key: clear ``_cached_get_attn_backend`` when
    the replacement is undone.)
    """
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform

    monkeypatch.setattr(current_platform, "get_attn_backend_cls", CpuPlatform.get_attn_backend_cls)


def shell_proposer(proposer_class: type, vllm_config, *, pass_hidden_states_to_model: bool = True):
    """A real v1 proposer built without ``__init__``, so that its real ``load_model`` can run on the CPU.

    ``SpecDecodeBaseProposer.__init__`` allocates pinned host buffers
    (``CpuGpuBuffer``, ``pin_memory=True`` here), and pinning needs a CUDA
    driver. The shell gets the attributes ``__init__`` sets that ``load_model``
    and the sharing steps read, computed from the config as ``__init__``
    computes them; every method is the class's own.
    """
    speculative_config = vllm_config.speculative_config
    proposer = object.__new__(proposer_class)
    proposer.vllm_config = vllm_config
    proposer.speculative_config = speculative_config
    proposer.draft_model_config = speculative_config.draft_model_config
    proposer.method = speculative_config.method
    proposer.pass_hidden_states_to_model = pass_hidden_states_to_model
    proposer.supports_mm_inputs = vllm_config.model_config.supports_multimodal_inputs
    proposer.parallel_drafting = speculative_config.parallel_drafting
    proposer.parallel_drafting_hidden_state_tensor = None
    proposer.use_local_argmax_reduction = speculative_config.use_local_argmax_reduction
    proposer._share_mtp_indices = False
    return proposer
