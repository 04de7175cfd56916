# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The hybrid KV planner must count the bytes each attention layer holds.

Qwen4Exp registers its QSA side caches (``QSAStateBackend``, whose
``customize_spec`` is the identity) before the attention layer that owns them.
With a packing main backend (FlashInfer NVFP4: 576 B/token for head size 256
and 2 KV heads) the planner must size the block by the bytes that layer holds,
as the allocator does, or every attention page ends up padded to the recurrent
page.

FlashInferImpl asks the CUDA device for its NVFP4 kernel family and SM count and
allocates a counter there; those answers are an H200's, so the test runs on CPU.
"""

from pathlib import Path

import pytest
import torch
from transformers import Qwen4ExpTextConfig

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models import ModelRegistry
from vllm.models.qwen4_exp.common.qsa_cache import (
    QSACompressedKeyCache,
    QSAKeyStateCache,
)
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.flashinfer import FlashInferBackend
from vllm.v1.worker.utils import customize_attention_spec

# GDN state page of the config below: conv (2*16*128 + 48*128) x 3 x 2 B
# + fp32 recurrent 48 x 128 x 128 x 4 B.
RECURRENT_PAGE = 3_207_168
HEAD_SIZE = 256
NUM_KV_HEADS = 2
NVFP4_BYTES_PER_TOKEN = 576  # (128 data + 16 scale) B per head, K and V
ATTN_PREFIX = "model.layers.3.self_attn"
FLASHINFER = "vllm.v1.attention.backends.flashinfer"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen4_exp")
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
    return path


@pytest.fixture
def nvfp4_layer(model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A VllmConfig with the QSA side caches registered first, then the real
    FlashInfer NVFP4 attention layer."""
    monkeypatch.setattr(f"{FLASHINFER}._nvfp4_kv_on_fa2", lambda: True)
    monkeypatch.setattr(f"{FLASHINFER}.get_device_sm_count", lambda device: 132)
    monkeypatch.setattr(
        f"{FLASHINFER}._get_multi_ctas_kv_counter_buffer",
        lambda min_bytes, device: torch.zeros(min_bytes, dtype=torch.uint8),
    )
    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16"
        ),
        cache_config=CacheConfig(cache_dtype="nvfp4", mamba_ssm_cache_dtype="float32"),
        device_config=DeviceConfig(device="cpu"),
    )
    with set_current_vllm_config(vllm_config):
        for cache_cls, name in (
            (QSAKeyStateCache, "raw_key_cache"),
            (QSACompressedKeyCache, "compressed_key_cache"),
        ):
            cache_cls(
                head_size=128,
                dtype=torch.bfloat16,
                cache_config=vllm_config.cache_config,
                prefix=f"{ATTN_PREFIX}.indexer.{name}",
                compress_ratio=4,
                vllm_config=vllm_config,
            )
        layer = Attention(
            num_heads=16,
            head_size=HEAD_SIZE,
            scale=HEAD_SIZE**-0.5,
            num_kv_heads=NUM_KV_HEADS,
            cache_config=vllm_config.cache_config,
            prefix=f"{ATTN_PREFIX}.attn",
            attn_backend=FlashInferBackend,
        )
    return vllm_config, layer


def _recurrent_page(vllm_config: VllmConfig) -> int:
    model_cls, _ = ModelRegistry.resolve_model_cls(
        vllm_config.model_config.architecture,
        model_config=vllm_config.model_config,
    )
    specs = model_cls.get_mamba_specs_from_config(vllm_config)
    return max(spec.page_size_bytes for spec in specs)


def _allocated_page(vllm_config: VllmConfig, layer: Attention) -> int:
    """The attention page the allocator builds (GPUModelRunner's call)."""
    with set_current_vllm_config(vllm_config):
        spec = customize_attention_spec(
            layer.get_attn_backend(), layer.get_kv_cache_spec(vllm_config)
        )
    assert spec.block_size == vllm_config.cache_config.block_size
    assert spec.page_size_bytes // spec.block_size == NVFP4_BYTES_PER_TOKEN
    return spec.page_size_bytes


def test_recurrent_page(nvfp4_layer) -> None:
    vllm_config, _ = nvfp4_layer
    assert _recurrent_page(vllm_config) == RECURRENT_PAGE


@pytest.mark.parametrize(
    ("platform", "block_size"),
    [
        # 16 x ceil(3,207,168 / (16 x 576)): the recurrent page exactly.
        (Platform, 5568),
        # CpuPlatform aligns to 128 tokens: 128 x ceil(3,207,168 / (128 x 576)).
        (CpuPlatform, 5632),
    ],
)
def test_nvfp4_attention_page_matches_padded_recurrent_page(
    nvfp4_layer, platform: type[Platform], block_size: int
) -> None:
    """Planned at the side-cache backend's 1,024 B/token, the block is 3,136
    tokens and the 1,806,336 B attention pages get padded up to the recurrent
    page: 44% of every attention block unused."""
    vllm_config, layer = nvfp4_layer
    with set_current_vllm_config(vllm_config):
        platform.update_block_size_for_backend(vllm_config)
    cache_config = vllm_config.cache_config
    page = _allocated_page(vllm_config, layer)
    assert cache_config.block_size == block_size
    assert page == (cache_config.mamba_page_size_padded or RECURRENT_PAGE)
