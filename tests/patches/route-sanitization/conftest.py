# SPDX-License-Identifier: Apache-2.0
"""CPU harness for FlashInferB12xExperts.apply().

The real vLLM ``FlashInferB12xExperts`` and the real flashinfer
``B12xMoEWrapper`` run here; ``B12xMoEWrapper.run`` runs its real
per-call logic (backend choice, weight-view caching). Only two things that
need an SM12x GPU are replaced:

* the CUDA allocation: ``_ensure_wrapper`` builds the wrapper on the default
  device ``"cuda"``; a subclass of the real wrapper redirects that device to
  CPU so its real buffer allocation runs without a GPU;
* the kernel launch: ``moe_dispatch.launch_sm120_moe`` (the CuTe-DSL kernel
  behind ``B12xMoEWrapper.run``) is replaced by a recorder that keeps what
  would have reached the kernel and returns the output buffer untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
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

HIDDEN = 256
INTERMEDIATE = 128


@dataclass
class LaunchRecorder:
    """Stands in for the B12x kernel launch; keeps the last call's routes."""

    calls: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def __call__(self, **kwargs: Any) -> torch.Tensor:
        self.calls[:] = [
            {
                "topk_ids": kwargs["topk_ids"],
                "topk_weights": kwargs["topk_weights"],
                "ids_copy": kwargs["topk_ids"].clone(),
                "weights_copy": kwargs["topk_weights"].clone(),
                "num_experts": kwargs["num_experts"],
            }
        ]
        return kwargs["scatter_output"]


def _cpu_wrapper_class() -> type:
    real = fi_fused_moe.B12xMoEWrapper

    class CpuAllocatedB12xMoEWrapper(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, device: Any = "cuda", **kwargs: Any):
            if torch.device(device).type == "cuda":
                device = "cpu"
            super().__init__(*args, device=device, **kwargs)

    return CpuAllocatedB12xMoEWrapper


@pytest.fixture(scope="module")
def b12x_seams():
    """Install both seams for a whole module; yields the launch recorder."""
    recorder = LaunchRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fi_fused_moe, "B12xMoEWrapper", _cpu_wrapper_class())
        mp.setattr(moe_dispatch, "launch_sm120_moe", recorder)
        yield recorder


class B12xLayer:
    """One real FlashInferB12xExperts with NVFP4-shaped CPU weights."""

    def __init__(self, num_experts: int, top_k: int, max_num_tokens: int = 64):
        self.num_experts = num_experts
        self.top_k = top_k
        moe_config = FusedMoEConfig(
            num_experts=num_experts,
            experts_per_token=top_k,
            hidden_dim=HIDDEN,
            intermediate_size=INTERMEDIATE,
            num_local_experts=num_experts,
            num_logical_experts=num_experts,
            moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
            activation=MoEActivation.SILU,
            in_dtype=torch.bfloat16,
            device="cpu",
            routing_method=RoutingMethodType.TopK,
            max_num_tokens=max_num_tokens,
        )
        e = num_experts
        w1_scale = torch.ones(e, 2 * INTERMEDIATE, HIDDEN // 16).to(torch.float8_e4m3fn)
        w2_scale = torch.ones(e, HIDDEN, INTERMEDIATE // 16).to(torch.float8_e4m3fn)
        quant_config = nvfp4_moe_quant_config(
            g1_alphas=torch.ones(e),
            g2_alphas=torch.ones(e),
            a1_gscale=torch.ones(e),
            a2_gscale=torch.ones(e),
            w1_scale=w1_scale,
            w2_scale=w2_scale,
        )
        self.experts = FlashInferB12xExperts(moe_config, quant_config)
        self.experts.process_weights_after_loading(
            SimpleNamespace(
                w13_weight=torch.empty(0),
                w13_weight_scale=w1_scale,
                w13_weight_scale_2=torch.ones(e),
                w2_weight_scale=w2_scale,
                w2_weight_scale_2=torch.ones(e),
            )
        )
        self.w1 = torch.zeros(e, 2 * INTERMEDIATE, HIDDEN // 2, dtype=torch.uint8)
        self.w2 = torch.zeros(e, HIDDEN, INTERMEDIATE // 2, dtype=torch.uint8)

    def apply(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        num_tokens = topk_ids.size(0)
        hidden_states = torch.randn(num_tokens, HIDDEN, dtype=torch.bfloat16)
        output = torch.empty_like(hidden_states)
        self.experts.apply(
            output=output,
            hidden_states=hidden_states,
            w1=self.w1,
            w2=self.w2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            activation=MoEActivation.SILU,
            global_num_experts=self.num_experts,
            expert_map=None,
            a1q_scale=None,
            a2_scale=None,
            workspace13=None,
            workspace2=None,
            expert_tokens_meta=None,
            apply_router_weight_on_input=False,
        )


@pytest.fixture(scope="module")
def make_b12x_layer(b12x_seams):
    """Factory for real B12x expert layers, with both seams installed."""
    return B12xLayer
