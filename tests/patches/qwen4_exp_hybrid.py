# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Qwen4Exp hybrid-KV scenario shared by the byte-accounting test and its benchmark.

A real ``VllmConfig`` from a Qwen4Exp config file whose GDN state page is 3,207,168 B, the real QSA
side caches registered first (as ``QSAIndexer`` does), then the main attention layer: the real
FlashInfer ``Attention`` for NVFP4, or the QSA owner of a vendor for the QSA formats. Seams, each
because the real object needs a GPU to be built, never to plan:

* ``FlashInferImpl.__init__`` asks the CUDA device for its NVFP4 kernel family and SM count and
  allocates its multi-CTA counter there: ``flashinfer_device_answers`` gives an H200's answers
  (fa2 NVFP4, 132 SMs) and a CPU counter. Callers apply them only where there is no GPU.
* The QSA owners' ``__init__`` builds the QSA Triton / Octave impl (CUDA tensors, a flash-attn
  probe) and the projections: ``qsa_owner`` creates the owner with ``object.__new__`` and gives it
  the attributes its ``__init__`` sets for the spec; its real ``get_attn_backend`` and
  ``get_kv_cache_spec`` are what the planner and the allocator call.

vLLM is imported inside the functions: the benchmark may choose vLLM's platform before the first
vLLM import.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

# Reference figures (head size 256, 2 KV heads).
RECURRENT_PAGE = 3_207_168
HEAD_SIZE = 256
NUM_KV_HEADS = 2
INDEX_HEAD_DIM = 128
COMPRESS_RATIO = 4
ATTN_PREFIX = "model.layers.3.self_attn"


def write_model_dir(path: Path) -> None:
    """A Qwen4Exp text config whose GDN state page is the reference page.

    16 key / 48 value heads of 128 dims, conv kernel 4: conv state (2*16*128 + 48*128) x 3 x 2 B
    + fp32 recurrent state 48 x 128 x 128 x 4 B = 3,207,168 B. Rotary over a quarter of the head
    (64 dims), as Octave's kernels expect.
    """
    from transformers import Qwen4ExpTextConfig

    Qwen4ExpTextConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_SIZE,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        eos_token_id=1,
        hc_count=2,
        hc_lowrank=4,
        ple_layer_ids=[],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        architectures=["Qwen4ExpForCausalLM"],
        torch_dtype="bfloat16",
    ).save_pretrained(path)


def make_vllm_config(model_dir: Path, cache_dtype: str, device: str = "cpu") -> Any:
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig

    return VllmConfig(
        model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16"),
        cache_config=CacheConfig(
            cache_dtype=cache_dtype,  # type: ignore[arg-type]
            mamba_ssm_cache_dtype="float32",
        ),
        device_config=DeviceConfig(device=device),
    )


def recurrent_page(vllm_config: Any) -> int:
    """The model's largest recurrent (mamba-style) page, from the real model class."""
    from vllm.model_executor.models import ModelRegistry

    model_cls, _ = ModelRegistry.resolve_model_cls(
        vllm_config.model_config.architecture,
        model_config=vllm_config.model_config,
    )
    return max(s.page_size_bytes for s in model_cls.get_mamba_specs_from_config(vllm_config))


def register_qsa_side_caches(vllm_config: Any) -> None:
    """The real side caches; they enter the forward context on construction, ahead of their
    owner, as in ``QSAIndexer.__init__``. Call under ``set_current_vllm_config``."""
    import torch
    from vllm.models.qwen4_exp.common.qsa_cache import QSACompressedKeyCache, QSAKeyStateCache

    for cache_cls, name in ((QSAKeyStateCache, "raw_key_cache"), (QSACompressedKeyCache, "compressed_key_cache")):
        cache_cls(
            head_size=INDEX_HEAD_DIM,
            dtype=torch.bfloat16,
            cache_config=vllm_config.cache_config,
            prefix=f"{ATTN_PREFIX}.indexer.{name}",
            compress_ratio=COMPRESS_RATIO,
            vllm_config=vllm_config,
        )


def flashinfer_device_answers() -> dict[str, object]:
    """``FlashInferImpl.__init__``'s device queries answered as an H200 would (attribute path ->
    replacement), for ``monkeypatch.setattr`` or ``mock.patch`` where there is no GPU."""
    import torch

    module = "vllm.v1.attention.backends.flashinfer"
    return {
        f"{module}._nvfp4_kv_on_fa2": lambda: True,
        f"{module}.get_device_sm_count": lambda device: 132,
        f"{module}._get_multi_ctas_kv_counter_buffer": lambda min_bytes, device: torch.zeros(
            min_bytes, dtype=torch.uint8
        ),
    }


def flashinfer_attention(
    vllm_config: Any,
    prefix: str = f"{ATTN_PREFIX}.attn",
    per_layer_sliding_window: int | None = None,
) -> Any:
    """The real FlashInfer ``Attention`` layer (its device queries must be answered first where
    there is no GPU). Call under ``set_current_vllm_config``."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.flashinfer import FlashInferBackend

    return Attention(
        num_heads=16,
        head_size=HEAD_SIZE,
        scale=HEAD_SIZE**-0.5,
        num_kv_heads=NUM_KV_HEADS,
        cache_config=vllm_config.cache_config,
        per_layer_sliding_window=per_layer_sliding_window,
        prefix=prefix,
        attn_backend=FlashInferBackend,
    )


def qsa_owner(vllm_config: Any, vendor: str) -> Any:
    """The Qwen4Exp QSA owner of ``vendor`` (nvidia, amd) with its spec attributes only."""
    from torch import nn
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    # The owner module and the model module import each other; enter through the model module
    # as the registry does.
    importlib.import_module(f"vllm.models.qwen4_exp.{vendor}.model")
    qsa = importlib.import_module(f"vllm.models.qwen4_exp.{vendor}.qsa")
    owner = object.__new__(qsa.Qwen4ExpQSAAttention)
    nn.Module.__init__(owner)
    cache_dtype = vllm_config.cache_config.cache_dtype
    owner.num_kv_heads = NUM_KV_HEADS
    owner.head_dim = HEAD_SIZE
    owner.kv_cache_dtype = cache_dtype
    owner.kv_cache_torch_dtype = kv_cache_dtype_str_to_dtype(cache_dtype, vllm_config.model_config)
    owner.attn_backend = qsa.Qwen4ExpQSAFlashAttentionBackend
    vllm_config.compilation_config.static_forward_context[f"{ATTN_PREFIX}.attn"] = owner
    return owner


def allocated_spec(vllm_config: Any, layer: Any) -> Any:
    """The spec the allocator builds for the layer, through the same call
    ``GPUModelRunner.get_kv_cache_spec`` makes."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.utils import customize_attention_spec

    with set_current_vllm_config(vllm_config):
        return customize_attention_spec(layer.get_attn_backend(), layer.get_kv_cache_spec(vllm_config))
