# SPDX-License-Identifier: Apache-2.0
"""The real vLLM ``FlashInferB12xExperts`` of one MoE shape, for the B12x benchmarks."""

from __future__ import annotations

import torch


def make_experts(
    experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    max_tokens: int,
    device: str,
):
    """One real FlashInferB12xExperts (NVFP4, the B12x backend's only quant scheme).

    The scales only have to exist for construction: the route guard and
    ``_ensure_wrapper`` read the shape fields, not the scales.
    """
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

    moe_config = FusedMoEConfig(
        num_experts=experts,
        experts_per_token=top_k,
        hidden_dim=hidden,
        intermediate_size=intermediate,
        num_local_experts=experts,
        num_logical_experts=experts,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=torch.bfloat16,
        device=device,
        routing_method=RoutingMethodType.TopK,
        max_num_tokens=max_tokens,
    )
    ones = torch.ones(experts)
    quant_config = nvfp4_moe_quant_config(
        g1_alphas=ones,
        g2_alphas=ones,
        a1_gscale=ones,
        a2_gscale=ones,
        w1_scale=torch.ones(experts, 2 * intermediate, hidden // 16).to(torch.float8_e4m3fn),
        w2_scale=torch.ones(experts, hidden, intermediate // 16).to(torch.float8_e4m3fn),
    )
    return FlashInferB12xExperts(moe_config, quant_config)


def describe_vllm() -> str:
    """Which vLLM and which vLLM platform this process runs (for the record)."""
    import vllm
    from vllm.platforms import current_platform

    return f"vllm {vllm.__file__}; vLLM platform {type(current_platform).__name__}"
