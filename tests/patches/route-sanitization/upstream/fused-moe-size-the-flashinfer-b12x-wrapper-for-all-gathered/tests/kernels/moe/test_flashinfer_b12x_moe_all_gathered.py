# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""FlashInferB12xExperts builds flashinfer's B12xMoEWrapper for every token
that data parallelism (without expert parallelism) and prefill context
parallelism all-gather before apply(), and refuses at construction a wrapper
that flashinfer would refuse at the first apply() for its 2^31-1 element limit.

The layer and flashinfer's wrapper are the real ones. The wrapper would
allocate on an SM12x GPU, so the one seam is a subclass that allocates on the
CPU instead; the construction check builds the real wrapper on the meta
device, which runs flashinfer's own sizing.
"""

import dataclasses
import functools
from typing import Any

import flashinfer.fused_moe as fi_fused_moe
import pytest
import torch

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
def cpu_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fi_fused_moe, "B12xMoEWrapper", CpuB12xMoEWrapper)


def make_layer(
    num_experts: int = 16,
    top_k: int = 4,
    hidden: int = 256,
    intermediate: int = 128,
    max_num_tokens: int = 4,
    dp_size: int = 1,
    pcp_size: int = 1,
) -> FlashInferB12xExperts:
    """An NVFP4 B12x layer of one DP/PCP rank, without expert parallelism."""
    e = num_experts
    parallel = dataclasses.replace(
        FusedMoEParallelConfig.make_no_parallel(), dp_size=dp_size, pcp_size=pcp_size
    )
    moe_config = FusedMoEConfig(
        num_experts=e,
        experts_per_token=top_k,
        hidden_dim=hidden,
        intermediate_size=intermediate,
        num_local_experts=e,
        num_logical_experts=e,
        moe_parallel_config=parallel,
        activation=MoEActivation.SILU,
        in_dtype=torch.bfloat16,
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
    return FlashInferB12xExperts(moe_config, quant_config)


@pytest.mark.parametrize(("dp_size", "pcp_size"), [(2, 1), (1, 2), (2, 2)])
def test_wrapper_takes_all_gathered_tokens(cpu_wrapper, dp_size, pcp_size):
    layer = make_layer(max_num_tokens=4, dp_size=dp_size, pcp_size=pcp_size)

    layer._ensure_wrapper()

    # Every rank's tokens reach the experts in one apply() call.
    assert layer._wrapper.max_num_tokens == 4 * dp_size * pcp_size


def test_one_rank_keeps_the_wrapper_of_max_num_tokens(cpu_wrapper):
    layer = make_layer(max_num_tokens=8)

    layer._ensure_wrapper()

    assert layer._wrapper.max_num_tokens == 8


def test_wrapper_over_the_flashinfer_limit_is_refused_at_construction():
    # 256 experts, top-8, hidden 7168: 8192 tokens x DP 16 = 131072 tokens,
    # whose dynamic workspace is over flashinfer's 2^31-1 element limit.
    with pytest.raises(ValueError, match=r"2\^31-1") as info:
        make_layer(256, 8, 7168, 256, max_num_tokens=8192, dp_size=16)

    assert "131072 tokens" in str(info.value)
    assert "DP size 16" in str(info.value)
