# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""FlashInferB12xExperts layers of one shape share one set of B12xMoEWrapper
buffers (static workspace, dynamic workspace, output) instead of allocating a
set per layer; a layer of another shape gets its own set, and the set goes
with the last layer that uses it.

The layers and flashinfer's wrapper and allocator are the real ones. The
wrapper would allocate on an SM12x GPU, so the one seam is a subclass that
allocates on the CPU instead; it keeps the wrapper's signature, which the layer
reads to decide whether buffers can be shared. flashinfer's
``allocate_sm120_moe_workspace`` is wrapped to count the workspaces it makes.
"""

import functools
import gc
from typing import Any

import flashinfer.fused_moe as fi_fused_moe
import pytest
import torch
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch

from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
    nvfp4_moe_quant_config,
)
from vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe import (
    FlashInferB12xExperts,
)

if not hasattr(fi_fused_moe, "B12xMoEWrapper"):
    pytest.skip("FlashInfer without B12xMoEWrapper", allow_module_level=True)

REAL_WRAPPER = fi_fused_moe.B12xMoEWrapper


class CpuB12xMoEWrapper(REAL_WRAPPER):
    """The real wrapper, allocating its buffers on the CPU."""

    @functools.wraps(REAL_WRAPPER.__init__)
    def __init__(self, *args: Any, device: str = "cuda", **kwargs: Any):
        if torch.device(device).type == "cuda":
            device = "cpu"
        super().__init__(*args, device=device, **kwargs)


@pytest.fixture
def workspaces(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The workspaces flashinfer's allocator makes during the test."""
    # Layers of earlier tests must be gone, so that their buffer sets cannot
    # be reused here.
    gc.collect()
    made: list[object] = []
    real_allocate = moe_dispatch.allocate_sm120_moe_workspace

    def allocate(**kwargs: Any) -> object:
        made.append(real_allocate(**kwargs))
        return made[-1]

    monkeypatch.setattr(fi_fused_moe, "B12xMoEWrapper", CpuB12xMoEWrapper)
    monkeypatch.setattr(moe_dispatch, "allocate_sm120_moe_workspace", allocate)
    return made


def make_layer(
    num_experts: int = 16,
    top_k: int = 8,
    hidden: int = 256,
    intermediate: int = 128,
    max_num_tokens: int = 256,
    dtype: torch.dtype = torch.bfloat16,
) -> FlashInferB12xExperts:
    """An NVFP4 B12x layer with its wrapper built, as its first apply() does."""
    e = num_experts
    moe_config = FusedMoEConfig(
        num_experts=e,
        experts_per_token=top_k,
        hidden_dim=hidden,
        intermediate_size=intermediate,
        num_local_experts=e,
        num_logical_experts=e,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=dtype,
        device="cpu",
        routing_method=RoutingMethodType.TopK,
        max_num_tokens=max_num_tokens,
    )
    quant_config = nvfp4_moe_quant_config(
        g1_alphas=torch.ones(e),
        g2_alphas=torch.ones(e),
        a1_gscale=torch.ones(e),
        a2_gscale=torch.ones(e),
        w1_scale=torch.ones(e, 2 * intermediate, hidden // 16).to(torch.float8_e4m3fn),
        w2_scale=torch.ones(e, hidden, intermediate // 16).to(torch.float8_e4m3fn),
    )
    layer = FlashInferB12xExperts(moe_config, quant_config)
    layer._ensure_wrapper()
    return layer


def buffers(layer: FlashInferB12xExperts) -> tuple[object, object, torch.Tensor]:
    wrapper = layer._wrapper
    return (wrapper._static_workspace, wrapper._dynamic_workspace, wrapper._moe_output)


def test_identical_layers_allocate_one_set(workspaces):
    first = make_layer()
    static, dynamic, output = buffers(first)
    # 256 tokens x top-8 crosses flashinfer's static/dynamic cutover, so the
    # wrapper holds both workspaces.
    assert static is not None and dynamic is not None
    assert len(workspaces) == 2

    second = make_layer()

    assert second._wrapper is not first._wrapper
    assert len(workspaces) == 2, "the second layer allocated its own set"
    assert buffers(second)[0] is static
    assert buffers(second)[1] is dynamic
    assert buffers(second)[2] is output


@pytest.mark.parametrize(
    "change",
    [
        {"num_experts": 32},
        {"top_k": 4},
        {"hidden": 512},
        {"intermediate": 256},
        {"max_num_tokens": 512},
    ],
    ids=lambda change: next(iter(change)),
)
def test_another_shape_gets_its_own_set(workspaces, change):
    first = make_layer()
    before = buffers(first)
    output_ptr = before[2].data_ptr()

    twin, other = make_layer(), make_layer(**change)

    assert all(x is y for x, y in zip(buffers(twin), before)), "twin not shared"
    assert buffers(other)[0] is not before[0]
    assert buffers(other)[2] is not before[2]
    # The set handed to the first shape was neither resized nor replaced.
    assert buffers(first)[0] is before[0]
    assert buffers(first)[2].data_ptr() == output_ptr


def test_shared_set_goes_with_the_last_layer(workspaces):
    first, second = make_layer(), make_layer()
    assert buffers(second)[0] is buffers(first)[0]

    # While one layer lives, a new identical layer still shares its set.
    del first
    gc.collect()
    third = make_layer()
    assert buffers(third)[0] is buffers(second)[0]
    assert len(workspaces) == 2

    # Once no layer uses it, nothing keeps it: a later layer allocates anew.
    del second, third
    gc.collect()
    make_layer()
    assert len(workspaces) == 4


def test_wrapper_output_dtype_is_the_layers(workspaces):
    """The (shared) output buffer has the layer's dtype, not bfloat16 always:
    flashinfer's SM12x kernels write bfloat16 only, so a float16 layer is
    refused when its wrapper is built rather than run on a bfloat16 output."""
    assert buffers(make_layer())[2].dtype == torch.bfloat16

    with pytest.raises(ValueError, match="float16"):
        make_layer(dtype=torch.float16)
