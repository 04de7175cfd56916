# SPDX-License-Identifier: Apache-2.0
"""The hybrid KV planner must count the bytes each attention layer really holds.

Qwen4Exp registers its QSA side caches (``QSAStateBackend``, whose
``customize_spec`` is the identity) before the attention layer that owns them,
so ``Platform._find_non_ssm_backends`` lists the side-cache backend first. The
pristine planner sizes the attention page through that backend only, while the
allocator sizes each layer through the layer's own backend
(``GPUModelRunner.get_kv_cache_spec`` -> ``customize_attention_spec``). With a
packing main backend (NVFP4, ROCm Octave) the two disagree and the attention
pages no longer match the padded recurrent page. The NVIDIA QSA owner accepts
only bf16/fp8 in 0.33.0, so the NVFP4 cases put FlashInfer, the backend that
packs NVFP4, behind the side caches; the Octave cases use the AMD QSA owner.

Everything here is the real vLLM 0.33.0 code: a real ``VllmConfig`` built from a
Qwen4Exp config file, the real side-cache layers (constructed, so they register
themselves first exactly as ``QSAIndexer`` does), the real attention backends,
the real model class for the recurrent page and the real
``Platform.update_block_size_for_backend``. Seams, all because the real object
needs a GPU to be built, never to plan:

* ``CudaPlatform`` / ``RocmPlatform`` cannot be imported without their drivers;
  neither overrides ``update_block_size_for_backend``, so the base ``Platform``
  method they inherit is called directly. ``CpuPlatform`` (its own override) is
  imported and run as is.
* ``FlashInferImpl.__init__`` asks the CUDA device for its NVFP4 kernel family
  and SM count and allocates its multi-CTA counter there: the answers are an
  H200's (fa2 NVFP4, 132 SMs) and the counter is a CPU tensor.
* The Qwen4Exp QSA owners' ``__init__`` builds the QSA Triton / Octave impl
  (CUDA tensors, flash-attn availability probe) and the projections. The owner
  is created with ``object.__new__`` and given the attributes its own
  ``__init__`` would set for the spec; its real ``get_attn_backend`` and
  ``get_kv_cache_spec`` are what the planner and the allocator call.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch import nn
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
    QSAStateBackend,
)
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import Platform
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
from vllm.v1.attention.backends.flashinfer import FlashInferBackend
from vllm.v1.kv_cache_interface import AttentionSpec
from vllm.v1.worker.utils import customize_attention_spec

# Reference figures (head size 256, 2 KV heads).
RECURRENT_PAGE = 3_207_168
HEAD_SIZE = 256
NUM_KV_HEADS = 2
INDEX_HEAD_DIM = 128
COMPRESS_RATIO = 4
ATTN_PREFIX = "model.layers.3.self_attn"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen4Exp text config whose GDN state page is the reference page.

    16 key / 48 value heads of 128 dims, conv kernel 4: conv state
    (2*16*128 + 48*128) x 3 x 2 B + fp32 recurrent state 48 x 128 x 128 x 4 B
    = 3,207,168 B. Rotary over a quarter of the head (64 dims), as Octave's
    kernels expect.
    """
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


def _vllm_config(model_dir: Path, cache_dtype: str) -> VllmConfig:
    return VllmConfig(
        model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16"),
        cache_config=CacheConfig(
            cache_dtype=cache_dtype,  # type: ignore[arg-type]
            mamba_ssm_cache_dtype="float32",
        ),
        device_config=DeviceConfig(device="cpu"),
    )


def _recurrent_page(vllm_config: VllmConfig) -> int:
    model_cls, _ = ModelRegistry.resolve_model_cls(
        vllm_config.model_config.architecture,
        model_config=vllm_config.model_config,
    )
    return max(s.page_size_bytes for s in model_cls.get_mamba_specs_from_config(vllm_config))


def _register_qsa_side_caches(vllm_config: VllmConfig) -> None:
    """The real side caches; they enter the forward context on construction,
    ahead of their owner, as in ``QSAIndexer.__init__``."""
    cache_config = vllm_config.cache_config
    prefix = f"{ATTN_PREFIX}.indexer"
    QSAKeyStateCache(
        head_size=INDEX_HEAD_DIM,
        dtype=torch.bfloat16,
        cache_config=cache_config,
        prefix=f"{prefix}.raw_key_cache",
        compress_ratio=COMPRESS_RATIO,
        vllm_config=vllm_config,
    )
    QSACompressedKeyCache(
        head_size=INDEX_HEAD_DIM,
        dtype=torch.bfloat16,
        cache_config=cache_config,
        prefix=f"{prefix}.compressed_key_cache",
        compress_ratio=COMPRESS_RATIO,
        vllm_config=vllm_config,
    )


def _flashinfer_attention(vllm_config: VllmConfig, monkeypatch) -> nn.Module:
    # Seams: FlashInferImpl.__init__ asks the device which NVFP4 kernel family
    # it has (an H200, SM90, runs NVFP4 KV on fa2), sizes its multi-CTA counter
    # from the device's SM count and allocates that counter on the device.
    flashinfer = "vllm.v1.attention.backends.flashinfer"
    monkeypatch.setattr(f"{flashinfer}._nvfp4_kv_on_fa2", lambda: True)
    monkeypatch.setattr(f"{flashinfer}.get_device_sm_count", lambda device: 132)
    monkeypatch.setattr(
        f"{flashinfer}._get_multi_ctas_kv_counter_buffer",
        lambda min_bytes, device: torch.zeros(min_bytes, dtype=torch.uint8),
    )
    return Attention(
        num_heads=16,
        head_size=HEAD_SIZE,
        scale=HEAD_SIZE**-0.5,
        num_kv_heads=NUM_KV_HEADS,
        cache_config=vllm_config.cache_config,
        prefix=f"{ATTN_PREFIX}.attn",
        attn_backend=FlashInferBackend,
    )


def _qsa_owner(vllm_config: VllmConfig, vendor: str) -> nn.Module:
    """The Qwen4Exp QSA owner with its spec attributes only (see module doc)."""
    # The owner module and the model module import each other; enter through
    # the model module as the registry does.
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
    context = vllm_config.compilation_config.static_forward_context
    context[f"{ATTN_PREFIX}.attn"] = owner
    return owner


def _plan(platform: type[Platform], vllm_config: VllmConfig) -> None:
    with set_current_vllm_config(vllm_config):
        platform.update_block_size_for_backend(vllm_config)


def _allocated_spec(vllm_config: VllmConfig, layer: nn.Module) -> AttentionSpec:
    """The spec the allocator builds for the layer, through the same call
    GPUModelRunner.get_kv_cache_spec makes."""
    with set_current_vllm_config(vllm_config):
        spec = customize_attention_spec(layer.get_attn_backend(), layer.get_kv_cache_spec(vllm_config))
    assert isinstance(spec, AttentionSpec)
    return spec


def _assert_pages_agree(vllm_config: VllmConfig, layer: nn.Module) -> int:
    """block_size x physical bytes/token == padded recurrent page; returns the
    physical bytes per token the allocator gives the layer."""
    cache_config = vllm_config.cache_config
    recurrent = _recurrent_page(vllm_config)
    padded_recurrent = cache_config.mamba_page_size_padded or recurrent
    spec = _allocated_spec(vllm_config, layer)
    assert spec.block_size == cache_config.block_size
    bytes_per_token = spec.page_size_bytes // spec.block_size
    assert spec.page_size_bytes == cache_config.block_size * bytes_per_token
    assert spec.page_size_bytes == padded_recurrent, (
        f"planned block {cache_config.block_size} gives {spec.page_size_bytes} B "
        f"attention pages ({bytes_per_token} B/token held) but the recurrent "
        f"page was padded to {padded_recurrent} B"
    )
    return bytes_per_token


def test_reference_recurrent_page(model_dir: Path) -> None:
    assert _recurrent_page(_vllm_config(model_dir, "fp8")) == RECURRENT_PAGE


def test_side_cache_backend_is_found_first(model_dir: Path, monkeypatch) -> None:
    """The ordering the defect depends on, from the real forward context."""
    vllm_config = _vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        _register_qsa_side_caches(vllm_config)
        _flashinfer_attention(vllm_config, monkeypatch)
        backends = Platform._find_non_ssm_backends(vllm_config)
    assert backends == [QSAStateBackend, FlashInferBackend]


def test_nvfp4_block_covers_recurrent_page_exactly(model_dir: Path, monkeypatch):
    """Packed NVFP4: (128 data + 16 scale) B per head, K and V, 2 heads = 576
    B/token; 5,568 tokens x 576 B = 3,207,168 B, the recurrent page itself.

    Pristine planning counts the side-cache backend's 1,024 B/token: a 3,136
    token block, the recurrent page padded to 3,211,264 B, and 1,806,336 B
    attention pages."""
    vllm_config = _vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        _register_qsa_side_caches(vllm_config)
        layer = _flashinfer_attention(vllm_config, monkeypatch)
    _plan(Platform, vllm_config)

    assert _assert_pages_agree(vllm_config, layer) == 576
    assert vllm_config.cache_config.block_size == 5568
    assert 5568 * 576 == RECURRENT_PAGE
    # The attention page is the recurrent page: nothing to pad.
    assert vllm_config.cache_config.mamba_page_size_padded is None


def test_fp8_block_unchanged(model_dir: Path) -> None:
    """FP8 on the NVIDIA QSA owner: both backends publish 1,024 B/token, so the
    planner keeps the 3,136-token block and pads the recurrent page to
    3,136 x 1,024 = 3,211,264 B (guards the unchanged path)."""
    vllm_config = _vllm_config(model_dir, "fp8")
    with set_current_vllm_config(vllm_config):
        _register_qsa_side_caches(vllm_config)
        layer = _qsa_owner(vllm_config, "nvidia")
    _plan(Platform, vllm_config)

    assert vllm_config.cache_config.block_size == 3136
    assert _assert_pages_agree(vllm_config, layer) == 1024
    assert vllm_config.cache_config.mamba_page_size_padded == 3136 * 1024


@pytest.mark.parametrize(
    ("cache_dtype", "bytes_per_token", "block_size"),
    [
        # 16 x ceil(3,207,168 / (16 x B)) tokens.
        ("octave_k3v4", 496, 6480),
        ("octave_k3v3", 432, 7424),
        ("octave_k3v3_compact", 392, 8192),
    ],
)
def test_rocm_octave_blocks_match_held_bytes(
    model_dir: Path, cache_dtype: str, bytes_per_token: int, block_size: int
) -> None:
    """The AMD QSA owner packs one Octave slot per (token, KV head)."""
    vllm_config = _vllm_config(model_dir, cache_dtype)
    with set_current_vllm_config(vllm_config):
        _register_qsa_side_caches(vllm_config)
        layer = _qsa_owner(vllm_config, "amd")
    _plan(Platform, vllm_config)

    assert _assert_pages_agree(vllm_config, layer) == bytes_per_token
    assert vllm_config.cache_config.block_size == block_size


def test_cpu_platform_override_counts_held_bytes(model_dir: Path, monkeypatch):
    """CpuPlatform aligns through its own override (128-token default), which
    hands the same first backend to the hybrid alignment."""
    vllm_config = _vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        _register_qsa_side_caches(vllm_config)
        layer = _flashinfer_attention(vllm_config, monkeypatch)
    _plan(CpuPlatform, vllm_config)

    assert _assert_pages_agree(vllm_config, layer) == 576
    # 128 x ceil(3,207,168 / (128 x 576)).
    assert vllm_config.cache_config.block_size == 5632


def test_skip_layers_share_the_held_primary_page(model_dir: Path, monkeypatch) -> None:
    """NVFP4 primary plus a bf16 sliding-window skip layer: the shared page the
    skip layer pads to (``_align_heterogeneous_kv_block_size``) must be the page
    the NVFP4 layers hold, not one sized at the side-cache backend's bytes."""
    vllm_config = _vllm_config(model_dir, "nvfp4")
    cache_config = vllm_config.cache_config
    cache_config.kv_cache_dtype_skip_layers = ["sliding_window"]
    with set_current_vllm_config(vllm_config):
        _register_qsa_side_caches(vllm_config)
        primary = _flashinfer_attention(vllm_config, monkeypatch)
        skip = Attention(
            num_heads=16,
            head_size=HEAD_SIZE,
            scale=HEAD_SIZE**-0.5,
            num_kv_heads=NUM_KV_HEADS,
            cache_config=cache_config,
            per_layer_sliding_window=1024,
            prefix="model.layers.7.self_attn.attn",
            attn_backend=FlashInferBackend,
        )
    assert skip.kv_cache_dtype == "auto"
    _plan(Platform, vllm_config)

    primary_page = _allocated_spec(vllm_config, primary).page_size_bytes
    assert primary_page == cache_config.block_size * 576
    assert cache_config.skip_page_size_padded == primary_page
    assert _allocated_spec(vllm_config, skip).page_size_bytes == primary_page
    assert (cache_config.mamba_page_size_padded or RECURRENT_PAGE) == primary_page
