# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU harness for FlashInferB12xExperts wrapper construction.

The real vLLM ``FlashInferB12xExperts`` builds the real flashinfer
``B12xMoEWrapper``, whose real ``_allocate_buffers`` sizes and allocates the
static workspace, dynamic workspace and output buffer through flashinfer's own
``allocate_sm120_moe_workspace``. Only two things that need an SM12x GPU are
replaced:

* the CUDA allocation: ``b12x_harness.cpu_wrapper_class``, a subclass of the
  real wrapper, redirects a ``cuda`` device to CPU (vLLM 0.33.0 builds the
  wrapper on the default ``"cuda"``). It keeps the real ``__init__`` signature
  (``functools.wraps``), because the patched layer reads that signature to
  decide whether buffers can be shared;
* the kernel launch: ``moe_dispatch.launch_sm120_moe`` is a stub returning the
  output buffer, so ``apply()`` can run end to end.

``allocate_sm120_moe_workspace`` is wrapped (not replaced) to count how many
workspaces flashinfer really allocates.

``pre_sharing_flashinfer`` stands in for a flashinfer release whose wrapper
predates the ``shared_*`` buffer arguments: the same real wrapper (so the same
real allocation) behind the narrower signature such a release has, which is
the only thing the patched layer inspects. The pinned flashinfer cannot be
installed beside an older one in one environment, so this is the narrowest
seam that reproduces the older API.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import flashinfer.fused_moe as fi_fused_moe
import pytest
import torch
from b12x_harness import B12xLayer, cpu_device, cpu_wrapper_class
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch
from vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe import (
    FlashInferB12xExperts,
)


def pre_sharing_wrapper_class(real: type) -> type:
    """The real wrapper, allocating on CPU, behind the signature of a
    flashinfer release without the shared_* buffer arguments."""

    class PreSharingB12xMoEWrapper(real):  # type: ignore[misc, valid-type]
        def __init__(
            self,
            num_experts: int,
            top_k: int,
            hidden_size: int,
            intermediate_size: int,
            *,
            use_cuda_graph: bool = False,
            max_num_tokens: int = 4096,
            num_local_experts: int | None = None,
            output_dtype: torch.dtype = torch.bfloat16,
            device: str = "cuda",
            activation: str = "silu",
        ):
            super().__init__(
                num_experts,
                top_k,
                hidden_size,
                intermediate_size,
                use_cuda_graph=use_cuda_graph,
                max_num_tokens=max_num_tokens,
                num_local_experts=num_local_experts,
                output_dtype=output_dtype,
                device=cpu_device(device),
                activation=activation,
            )

    return PreSharingB12xMoEWrapper


REAL_WRAPPER = fi_fused_moe.B12xMoEWrapper


class WorkspaceAllocations:
    """Counts the workspaces flashinfer's own allocator hands out."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.workspaces: list[object] = []

    def __call__(self, **kwargs: Any) -> object:
        workspace = self.real(**kwargs)
        self.workspaces.append(workspace)
        return workspace


@pytest.fixture
def allocations() -> Iterator[WorkspaceAllocations]:
    # Layers of earlier tests must be gone, so that their buffer sets (held
    # weakly by the sharing cache) cannot be reused here.
    gc.collect()
    counter = WorkspaceAllocations(moe_dispatch.allocate_sm120_moe_workspace)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fi_fused_moe, "B12xMoEWrapper", cpu_wrapper_class(REAL_WRAPPER))
        mp.setattr(moe_dispatch, "allocate_sm120_moe_workspace", counter)
        mp.setattr(moe_dispatch, "launch_sm120_moe", lambda **kw: kw["scatter_output"])
        yield counter


@pytest.fixture
def pre_sharing_flashinfer(allocations) -> Iterator[type]:
    """B12xMoEWrapper as a flashinfer release without shared buffers has it."""
    wrapper = pre_sharing_wrapper_class(REAL_WRAPPER)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fi_fused_moe, "B12xMoEWrapper", wrapper)
        yield wrapper


def make_layer(dtype: torch.dtype = torch.bfloat16, **shape: Any) -> B12xLayer:
    """A real B12x expert layer whose activations (and so output) are ``dtype``."""
    layer = B12xLayer(**shape)
    if dtype != layer.experts.moe_config.in_dtype:
        # B12xLayer builds bf16 layers; rebuild its experts from the same
        # configuration with only the dtype changed, and load them the same way.
        experts = layer.experts
        layer.experts = FlashInferB12xExperts(
            dataclasses.replace(experts.moe_config, in_dtype=dtype),
            experts.quant_config,
        )
        e = layer.num_experts
        layer.experts.process_weights_after_loading(
            SimpleNamespace(
                w13_weight=torch.empty(0),
                w13_weight_scale=layer.experts.w1_scale,
                w13_weight_scale_2=torch.ones(e),
                w2_weight_scale=layer.experts.w2_scale,
                w2_weight_scale_2=torch.ones(e),
            )
        )
    return layer


@pytest.fixture
def make_b12x_layer(allocations):
    """Factory for real B12x expert layers, with the seams installed."""
    return make_layer
