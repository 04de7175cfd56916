# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Both B12x MoE backends must hand their kernels only expert ids in
[0, num_experts) and the unrouted id -1.

The B12x kernels skip a negative id (the padding routers write with
VLLM_MOE_SKIP_PADDING) but index their per-expert state with any other id, so
an id at or above the expert count, or an int64 id that wraps into range when
narrowed to int32, must reach them as -1 with routing weight 0. Padding must
stay -1: as expert 0 it would become real expert-0 work.

The real apply() of each backend runs; the kernels need an SM12x GPU, so each
test replaces only the hand-off to them and records the routes it gets:
FlashInferB12xExperts' B12xMoEWrapper, and B12xExperts' _run_b12x_moe_plan
with the prepared weights and plan that the b12x library builds on the GPU.
"""

from types import SimpleNamespace

import pytest
import torch

import vllm.model_executor.layers.fused_moe.b12x as b12x
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.b12x import B12xExperts
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    FusedMoEQuantConfig,
    RoutingMethodType,
    nvfp4_moe_quant_config,
)
from vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe import (
    FlashInferB12xExperts,
)

NUM_EXPERTS = 512
HIDDEN = 256
INTERMEDIATE = 128
WEIGHTS = [[0.25, 0.5, 0.75, 1.0]]

# (router ids, their dtype, the ids the kernel must get, their weights): the
# padding id -1, a valid id, the expert count, and a valid id (int32) or an
# int64 id that an int32 conversion turns into expert 7.
ROUTES = [
    pytest.param(
        [[-1, 7, NUM_EXPERTS, 3]],
        torch.int32,
        [[-1, 7, -1, 3]],
        [[0.0, 0.5, 0.0, 1.0]],
        id="int32",
    ),
    pytest.param(
        [[-1, 7, NUM_EXPERTS, 2**32 + 7]],
        torch.int64,
        [[-1, 7, -1, -1]],
        [[0.0, 0.5, 0.0, 0.0]],
        id="int64",
    ),
]

# (weight dtype, activation dtype) of each b12x kernel mode B12xExperts takes.
B12X_SCHEMES = [
    ("nvfp4", "nvfp4"),
    ("nvfp4", "mxfp8"),
    ("nvfp4", None),
    ("mxfp4", "mxfp8"),
    ("mxfp4", None),
]


def _moe_config() -> FusedMoEConfig:
    return FusedMoEConfig(
        num_experts=NUM_EXPERTS,
        experts_per_token=4,
        hidden_dim=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_local_experts=NUM_EXPERTS,
        num_logical_experts=NUM_EXPERTS,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=torch.bfloat16,
        # The kernels are replaced, so the layers and routes live on the CPU.
        device="cpu",
        routing_method=RoutingMethodType.TopK,
        max_num_tokens=16,
    )


def _apply(experts, topk_ids: torch.Tensor, workspace2=None) -> None:
    hidden_states = torch.zeros(1, HIDDEN, dtype=torch.bfloat16)
    experts.apply(
        output=torch.empty_like(hidden_states),
        hidden_states=hidden_states,
        w1=torch.empty(0),
        w2=torch.empty(0),
        topk_weights=torch.tensor(WEIGHTS),
        topk_ids=topk_ids,
        activation=MoEActivation.SILU,
        global_num_experts=NUM_EXPERTS,
        expert_map=None,
        a1q_scale=None,
        a2_scale=None,
        workspace13=None,
        workspace2=workspace2,
        expert_tokens_meta=None,
        apply_router_weight_on_input=False,
    )


class RecordingB12xWrapper:
    """Stands in for flashinfer's B12xMoEWrapper: keeps the routes of run()."""

    def run(self, x, token_selected_experts, token_final_scales, **kwargs):
        self.ids = token_selected_experts.clone()
        self.weights = token_final_scales.clone()
        return torch.zeros_like(x)


@pytest.mark.parametrize("ids,ids_dtype,kernel_ids,kernel_weights", ROUTES)
def test_flashinfer_b12x_gets_only_valid_routes(
    ids, ids_dtype, kernel_ids, kernel_weights
) -> None:
    e = NUM_EXPERTS
    scale = torch.ones(e)
    w1_scale = torch.ones(e, 2 * INTERMEDIATE, HIDDEN // 16)
    w2_scale = torch.ones(e, HIDDEN, INTERMEDIATE // 16)
    experts = FlashInferB12xExperts(
        _moe_config(),
        nvfp4_moe_quant_config(
            g1_alphas=scale,
            g2_alphas=scale,
            a1_gscale=scale,
            a2_gscale=scale,
            w1_scale=w1_scale.to(torch.float8_e4m3fn),
            w2_scale=w2_scale.to(torch.float8_e4m3fn),
        ),
    )
    # What process_weights_after_loading prepares for the wrapper.
    experts._fc2_input_scale = scale
    experts.w1_sf_mma = experts.w1_scale
    experts.w2_sf_mma = experts.w2_scale
    experts._wrapper = wrapper = RecordingB12xWrapper()

    _apply(experts, torch.tensor(ids, dtype=ids_dtype))

    assert wrapper.ids.dtype == torch.int32
    assert wrapper.ids.tolist() == kernel_ids
    assert wrapper.weights.tolist() == kernel_weights


@pytest.mark.parametrize("scheme", B12X_SCHEMES)
@pytest.mark.parametrize("ids,ids_dtype,kernel_ids,kernel_weights", ROUTES)
def test_b12x_gets_only_valid_routes(
    monkeypatch: pytest.MonkeyPatch, scheme, ids, ids_dtype, kernel_ids, kernel_weights
) -> None:
    weight_dtype, activation_dtype = scheme
    one = torch.ones(1, dtype=torch.float32)
    experts = B12xExperts(
        _moe_config(),
        FusedMoEQuantConfig.make(
            quant_dtype=activation_dtype,
            weight_dtype=weight_dtype,
            w1_scale=one,
            w2_scale=one,
            g1_alphas=one,
            g2_alphas=one,
            a1_gscale=one,
            a2_gscale=one,
        ),
    )
    # The prepared weights and the plan the b12x library builds on the GPU.
    scratch_bytes = 64
    experts._prepared_experts = SimpleNamespace()
    experts._plan = lambda **kwargs: SimpleNamespace(
        scratch_specs=lambda: [
            SimpleNamespace(dtype=torch.uint8, shape=(scratch_bytes,))
        ]
    )
    launches = []
    # A CUDA runtime query, which fails without a driver.
    monkeypatch.setattr(b12x, "_is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(
        b12x,
        "_run_b12x_moe_plan",
        lambda **kwargs: launches.append(
            (kwargs["topk_ids"].clone(), kwargs["topk_weights"].clone())
        ),
    )

    workspace2 = torch.empty(scratch_bytes, dtype=torch.uint8)
    _apply(experts, torch.tensor(ids, dtype=ids_dtype), workspace2)

    ((launched_ids, launched_weights),) = launches
    assert launched_ids.dtype == torch.int32
    assert launched_ids.tolist() == kernel_ids
    assert launched_weights.tolist() == kernel_weights
