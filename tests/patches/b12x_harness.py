# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared harness for the B12x MoE series (route-sanitization, workspace-reuse): their CPU tests
and their GPU benchmarks build the real layer through ``make_experts``.

The real vLLM ``FlashInferB12xExperts`` builds the real flashinfer ``B12xMoEWrapper``.
``cpu_wrapper_class`` is the one GPU seam both series need for construction: vLLM 0.33.0 builds the
wrapper on the default ``"cuda"`` device, and this subclass of the real wrapper redirects that
device to CPU so the wrapper's real buffer allocation runs without a GPU. Each series' conftest
adds its own stand-in for the kernel launch (``moe_dispatch.launch_sm120_moe``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import flashinfer.fused_moe as fi_fused_moe
import torch
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


def cpu_device(device: Any) -> Any:
    """``device``, with a CUDA device replaced by the CPU (the one GPU seam of construction)."""
    return "cpu" if torch.device(device).type == "cuda" else device


def cpu_wrapper_class(real: type | None = None) -> type:
    """``real`` (flashinfer's B12xMoEWrapper by default), allocating on CPU, with the real signature.

    The signature is kept (``functools.wraps``): workspace-reuse's patched layer reads it to decide
    whether buffers can be shared.
    """
    real = fi_fused_moe.B12xMoEWrapper if real is None else real

    class CpuAllocatedB12xMoEWrapper(real):  # type: ignore[misc, valid-type]
        @functools.wraps(real.__init__)
        def __init__(self, *args: Any, device: Any = "cuda", **kwargs: Any):
            super().__init__(*args, device=cpu_device(device), **kwargs)

    return CpuAllocatedB12xMoEWrapper


def make_experts(
    num_experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    max_num_tokens: int,
    device: str = "cpu",
    activation: MoEActivation = MoEActivation.SILU,
    moe_parallel_config: FusedMoEParallelConfig | None = None,
) -> FlashInferB12xExperts:
    """One real FlashInferB12xExperts of a MoE shape (NVFP4, the B12x backend's only quant scheme).

    Its scales are ones of the NVFP4 shapes (CPU tensors): the route guard and the wrapper's
    construction read the shape, not the values.
    """
    e = num_experts
    moe_config = make_moe_config(
        num_experts, top_k, hidden, intermediate, max_num_tokens, device, activation, moe_parallel_config
    )
    w1_rows = intermediate * (2 if activation.is_gated else 1)
    quant_config = nvfp4_moe_quant_config(
        g1_alphas=torch.ones(e),
        g2_alphas=torch.ones(e),
        a1_gscale=torch.ones(e),
        a2_gscale=torch.ones(e),
        w1_scale=torch.ones(e, w1_rows, hidden // 16).to(torch.float8_e4m3fn),
        w2_scale=torch.ones(e, hidden, intermediate // 16).to(torch.float8_e4m3fn),
    )
    return FlashInferB12xExperts(moe_config, quant_config)


def make_moe_config(
    num_experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    max_num_tokens: int,
    device: str = "cpu",
    activation: MoEActivation = MoEActivation.SILU,
    moe_parallel_config: FusedMoEParallelConfig | None = None,
) -> FusedMoEConfig:
    """The FusedMoEConfig of a B12x MoE layer (no parallelism unless ``moe_parallel_config`` is given)."""
    e = num_experts
    return FusedMoEConfig(
        num_experts=e,
        experts_per_token=top_k,
        hidden_dim=hidden,
        intermediate_size=intermediate,
        num_local_experts=e,
        num_logical_experts=e,
        moe_parallel_config=moe_parallel_config or FusedMoEParallelConfig.make_no_parallel(),
        activation=activation,
        in_dtype=torch.bfloat16,
        device=device,
        routing_method=RoutingMethodType.TopK,
        max_num_tokens=max_num_tokens,
    )


# The quantization schemes B12xExperts (vllm/model_executor/layers/fused_moe/b12x.py) takes, as
# (weight dtype, activation dtype) -> the b12x kernel mode it selects.
B12X_TP_SCHEMES: dict[tuple[str, str | None], str] = {
    ("nvfp4", "nvfp4"): "nvfp4",
    ("nvfp4", "mxfp8"): "w4a8_nvfp4",
    ("nvfp4", None): "w4a16",
    ("mxfp4", "mxfp8"): "w4a8_mx",
    ("mxfp4", None): "w4a16",
}


def make_b12x_tp_experts(
    scheme: tuple[str, str | None],
    moe_config: FusedMoEConfig,
) -> B12xExperts:
    """One real B12xExperts (the b12x planned-API backend) for a quantization scheme.

    Its scales are placeholders: construction reads only the scheme, and the weights the b12x
    library prepares on a GPU are not part of what reaches the kernel's route arguments.
    """
    weight_dtype, activation_dtype = scheme
    scale = torch.ones(1, dtype=torch.float32)
    quant_config = FusedMoEQuantConfig.make(
        quant_dtype=activation_dtype,
        weight_dtype=weight_dtype,
        w1_scale=scale,
        w2_scale=scale,
        g1_alphas=scale,
        g2_alphas=scale,
        a1_gscale=scale,
        a2_gscale=scale,
    )
    return B12xExperts(moe_config, quant_config)


def apply_b12x_tp_routes(experts: B12xExperts, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
    """One real B12xExperts.apply() call with the given routes, on CPU.

    The b12x library prepares weights and plans only on an SM12x GPU, so the prepared weights and
    the plan are stand-ins (the seams vLLM's own tests/kernels/moe/test_b12x.py uses); the caller
    replaces ``b12x._run_b12x_moe_plan`` (bind + launch) and ``b12x._is_current_stream_capturing``.
    """
    scratch_bytes = 64
    experts._prepared_experts = object()  # what process_weights_after_loading prepares on a GPU
    experts._plan = lambda **_: SimpleNamespace(  # type: ignore[method-assign]
        scratch_specs=lambda: [SimpleNamespace(dtype=torch.uint8, shape=(scratch_bytes,))]
    )
    num_tokens = topk_ids.size(0)
    hidden = experts.moe_config.hidden_dim
    hidden_states = torch.zeros(num_tokens, hidden, dtype=torch.bfloat16)
    experts.apply(
        output=torch.empty_like(hidden_states),
        hidden_states=hidden_states,
        w1=torch.empty(0),
        w2=torch.empty(0),
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        activation=experts.moe_config.activation,
        global_num_experts=experts.moe_config.num_experts,
        expert_map=None,
        a1q_scale=None,
        a2_scale=None,
        workspace13=None,
        workspace2=torch.empty(scratch_bytes, dtype=torch.uint8),
        expert_tokens_meta=None,
        apply_router_weight_on_input=False,
    )


def nvfp4_quant_config(num_experts: int, hidden: int, intermediate: int, gated: bool = True) -> FusedMoEQuantConfig:
    """The NVFP4 scales a FlashInferB12xExperts layer takes (ones: construction reads their shapes)."""
    e = num_experts
    w1_rows = intermediate * (2 if gated else 1)
    return nvfp4_moe_quant_config(
        g1_alphas=torch.ones(e),
        g2_alphas=torch.ones(e),
        a1_gscale=torch.ones(e),
        a2_gscale=torch.ones(e),
        w1_scale=torch.ones(e, w1_rows, hidden // 16).to(torch.float8_e4m3fn),
        w2_scale=torch.ones(e, hidden, intermediate // 16).to(torch.float8_e4m3fn),
    )


def make_model_layers(backend: str, moe_config: FusedMoEConfig, count: int) -> list[Any]:
    """``count`` real experts layers of one backend ("flashinfer": FlashInferB12xExperts, "b12x":
    B12xExperts in its nvfp4 mode) built from one MoE config and one quant config, as the MoE
    layers of one model are, so that what differs between them is what each allocates itself."""
    if backend == "flashinfer":
        quant_config = nvfp4_quant_config(
            moe_config.num_experts,
            moe_config.hidden_dim,
            moe_config.intermediate_size_per_partition,
            moe_config.activation.is_gated,
        )
        return [FlashInferB12xExperts(moe_config, quant_config) for _ in range(count)]
    scale = torch.ones(1, dtype=torch.float32)
    quant_config = FusedMoEQuantConfig.make(
        quant_dtype="nvfp4",
        weight_dtype="nvfp4",
        w1_scale=scale,
        w2_scale=scale,
        g1_alphas=scale,
        g2_alphas=scale,
        a1_gscale=scale,
        a2_gscale=scale,
    )
    return [B12xExperts(moe_config, quant_config) for _ in range(count)]


def held_bytes(*roots: object) -> int:
    """Bytes of the distinct tensor storages the roots hold, whatever attribute holds them.

    Every tensor reachable through the attributes of vLLM and flashinfer objects and the containers
    they hold is counted, each storage once (views share their base's storage; on ``meta`` storages
    are told apart by their StorageImpl handle, as their data pointers are all 0).
    """
    storages: dict[int, int] = {}
    visited: set[int] = set()
    stack: list[object] = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in visited or isinstance(obj, type):
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage._cdata] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif type(obj).__module__.split(".")[0] in ("vllm", "flashinfer"):
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            for cls in type(obj).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                stack.extend(getattr(obj, name, None) for name in ((slots,) if isinstance(slots, str) else slots))
    return sum(storages.values())


def describe_vllm() -> str:
    """Which vLLM and which vLLM platform this process runs (for a benchmark's record)."""
    import vllm
    from vllm.platforms import current_platform

    return f"vllm {vllm.__file__}; vLLM platform {type(current_platform).__name__}"


class B12xLayer:
    """One real FlashInferB12xExperts with NVFP4-shaped CPU weights."""

    def __init__(
        self,
        num_experts: int = 16,
        top_k: int = 8,
        hidden: int = 256,
        intermediate: int = 128,
        max_num_tokens: int = 256,
        activation: MoEActivation = MoEActivation.SILU,
        moe_parallel_config: FusedMoEParallelConfig | None = None,
    ) -> None:
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden = hidden
        self.activation = activation
        self.experts = make_experts(
            num_experts,
            top_k,
            hidden,
            intermediate,
            max_num_tokens,
            device="cpu",
            activation=activation,
            moe_parallel_config=moe_parallel_config,
        )
        e = num_experts
        self.experts.process_weights_after_loading(
            SimpleNamespace(
                w13_weight=torch.empty(0),
                w13_weight_scale=self.experts.w1_scale,
                w13_weight_scale_2=torch.ones(e),
                w2_weight_scale=self.experts.w2_scale,
                w2_weight_scale_2=torch.ones(e),
            )
        )
        w1_rows = intermediate * (2 if activation.is_gated else 1)
        self.w1 = torch.zeros(e, w1_rows, hidden // 2, dtype=torch.uint8)
        self.w2 = torch.zeros(e, hidden, intermediate // 2, dtype=torch.uint8)

    def apply(self, num_tokens: int = 4) -> None:
        """One real apply() call with valid routes; the first one builds the wrapper."""
        topk_ids = torch.arange(num_tokens * self.top_k).view(num_tokens, -1)
        topk_ids = (topk_ids % self.num_experts).to(torch.int32)
        topk_weights = torch.full((num_tokens, self.top_k), 1.0 / self.top_k)
        self.apply_routes(topk_ids, topk_weights)

    def apply_routes(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """One real apply() call with the given routes."""
        hidden_states = torch.randn(topk_ids.size(0), self.hidden, dtype=torch.bfloat16)
        self.experts.apply(
            output=torch.empty_like(hidden_states),
            hidden_states=hidden_states,
            w1=self.w1,
            w2=self.w2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            activation=self.activation,
            global_num_experts=self.num_experts,
            expert_map=None,
            a1q_scale=None,
            a2_scale=None,
            workspace13=None,
            workspace2=None,
            expert_tokens_meta=None,
            apply_router_weight_on_input=False,
        )

    @property
    def buffers(self) -> tuple[object, object, torch.Tensor]:
        wrapper = self.experts._wrapper
        assert wrapper is not None
        return (
            wrapper._static_workspace,
            wrapper._dynamic_workspace,
            wrapper._moe_output,
        )
