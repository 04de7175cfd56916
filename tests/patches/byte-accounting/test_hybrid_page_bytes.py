# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
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

from dataclasses import replace
from pathlib import Path

import pytest
from qwen4_exp_hybrid import (
    RECURRENT_PAGE,
    allocated_spec,
    flashinfer_attention,
    flashinfer_device_answers,
    make_vllm_config,
    qsa_owner,
    recurrent_page,
    register_qsa_side_caches,
    write_model_dir,
)
from torch import nn
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.models.qwen4_exp.common.qsa_cache import QSAStateBackend
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.flashinfer import FlashInferBackend
from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen4Exp text config whose GDN state page is the reference page."""
    path = tmp_path_factory.mktemp("qwen4_exp")
    write_model_dir(path)
    return path


def _flashinfer_attention(vllm_config: VllmConfig, monkeypatch, **kwargs) -> nn.Module:
    # Seams (see qwen4_exp_hybrid): FlashInferImpl.__init__'s device queries, answered as an H200
    # would, for the whole test.
    for name, value in flashinfer_device_answers().items():
        monkeypatch.setattr(name, value)
    return flashinfer_attention(vllm_config, **kwargs)


def _plan(platform: type[Platform], vllm_config: VllmConfig) -> None:
    with set_current_vllm_config(vllm_config):
        platform.update_block_size_for_backend(vllm_config)


def _allocated_spec(vllm_config: VllmConfig, layer: nn.Module) -> AttentionSpec:
    spec = allocated_spec(vllm_config, layer)
    assert isinstance(spec, AttentionSpec)
    return spec


def _assert_pages_agree(vllm_config: VllmConfig, layer: nn.Module) -> int:
    """block_size x physical bytes/token == padded recurrent page; returns the
    physical bytes per token the allocator gives the layer."""
    cache_config = vllm_config.cache_config
    recurrent = recurrent_page(vllm_config)
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
    assert recurrent_page(make_vllm_config(model_dir, "fp8")) == RECURRENT_PAGE


def test_side_cache_backend_is_found_first(model_dir: Path, monkeypatch) -> None:
    """The ordering the defect depends on, from the real forward context."""
    vllm_config = make_vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
        _flashinfer_attention(vllm_config, monkeypatch)
        backends = Platform._find_non_ssm_backends(vllm_config)
    assert backends == [QSAStateBackend, FlashInferBackend]


def test_nvfp4_block_covers_recurrent_page_exactly(model_dir: Path, monkeypatch):
    """Packed NVFP4: (128 data + 16 scale) B per head, K and V, 2 heads = 576
    B/token; 5,568 tokens x 576 B = 3,207,168 B, the recurrent page itself.

    Pristine planning counts the side-cache backend's 1,024 B/token: a 3,136
    token block, the recurrent page padded to 3,211,264 B, and 1,806,336 B
    attention pages."""
    vllm_config = make_vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
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
    vllm_config = make_vllm_config(model_dir, "fp8")
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
        layer = qsa_owner(vllm_config, "nvidia")
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
    vllm_config = make_vllm_config(model_dir, cache_dtype)
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
        layer = qsa_owner(vllm_config, "amd")
    _plan(Platform, vllm_config)

    assert _assert_pages_agree(vllm_config, layer) == bytes_per_token
    assert vllm_config.cache_config.block_size == block_size


def test_cpu_platform_override_counts_held_bytes(model_dir: Path, monkeypatch):
    """CpuPlatform aligns through its own override (128-token default), which
    hands the same first backend to the hybrid alignment."""
    vllm_config = make_vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
        layer = _flashinfer_attention(vllm_config, monkeypatch)
    _plan(CpuPlatform, vllm_config)

    assert _assert_pages_agree(vllm_config, layer) == 576
    # 128 x ceil(3,207,168 / (128 x 576)).
    assert vllm_config.cache_config.block_size == 5632


def test_skip_layers_share_the_held_primary_page(model_dir: Path, monkeypatch) -> None:
    """NVFP4 primary plus a bf16 sliding-window skip layer: the shared page the
    skip layer pads to (``_align_heterogeneous_kv_block_size``) must be the page
    the NVFP4 layers hold, not one sized at the side-cache backend's bytes."""
    vllm_config = make_vllm_config(model_dir, "nvfp4")
    cache_config = vllm_config.cache_config
    cache_config.kv_cache_dtype_skip_layers = ["sliding_window"]
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
        primary = _flashinfer_attention(vllm_config, monkeypatch)
        skip = _flashinfer_attention(
            vllm_config,
            monkeypatch,
            prefix="model.layers.7.self_attn.attn",
            per_layer_sliding_window=1024,
        )
    assert skip.kv_cache_dtype == "auto"
    _plan(Platform, vllm_config)

    primary_page = _allocated_spec(vllm_config, primary).page_size_bytes
    assert primary_page == cache_config.block_size * 576
    assert cache_config.skip_page_size_padded == primary_page
    assert _allocated_spec(vllm_config, skip).page_size_bytes == primary_page
    assert (cache_config.mamba_page_size_padded or RECURRENT_PAGE) == primary_page


def test_packed_uint8_layer_without_quant_mode_counts(model_dir: Path, monkeypatch) -> None:
    """A layer whose spec carries its packed layout itself, stored as uint8
    with quant mode NONE, still holds the NVFP4 KV its owning backend was
    handed (``kv_cache_dtype="nvfp4"``), so its bytes decide the page.

    Stand-in, because no in-tree 0.33.0 backend stores NVFP4 under quant mode
    NONE: the real FlashInfer NVFP4 layer whose ``get_kv_cache_spec`` is the
    packed spec FlashInfer itself builds (576 B/token, its
    ``state_content_bytes`` set, so ``customize_spec`` keeps it as it is), with
    only the quant mode changed to NONE. Selecting layers by quant mode and
    element size skips it and plans the side-cache backend's 1,024 B/token."""
    vllm_config = make_vllm_config(model_dir, "nvfp4")
    with set_current_vllm_config(vllm_config):
        register_qsa_side_caches(vllm_config)
        layer = _flashinfer_attention(vllm_config, monkeypatch)
    real_get_spec = layer.get_kv_cache_spec

    def packed_uint8_spec(config: VllmConfig) -> AttentionSpec:
        packed = FlashInferBackend.customize_spec(real_get_spec(config))
        return replace(packed, kv_quant_mode=KVQuantMode.NONE)

    monkeypatch.setattr(layer, "get_kv_cache_spec", packed_uint8_spec)
    spec = _allocated_spec(vllm_config, layer)
    assert spec.kv_quant_mode == KVQuantMode.NONE and spec.dtype.itemsize == 1
    assert spec.page_size_bytes // spec.block_size == 576
    _plan(Platform, vllm_config)

    assert _assert_pages_agree(vllm_config, layer) == 576
    assert vllm_config.cache_config.block_size == 5568
