# SPDX-License-Identifier: Apache-2.0
"""CPU harness for FlashInferB12xExperts wrapper construction.

The real vLLM ``FlashInferB12xExperts`` builds the real flashinfer
``B12xMoEWrapper``, whose real ``_allocate_buffers`` sizes and allocates the
static workspace, dynamic workspace and output buffer through flashinfer's own
``allocate_sm120_moe_workspace``. Only two things that need an SM12x GPU are
replaced:

* the CUDA allocation: a subclass of the real wrapper redirects a ``cuda``
  device to CPU (vLLM 0.33.0 builds the wrapper on the default ``"cuda"``);
* the kernel launch: ``moe_dispatch.launch_sm120_moe`` is a stub returning the
  output buffer, so ``apply()`` can run end to end.

``allocate_sm120_moe_workspace`` is wrapped (not replaced) to count how many
workspaces flashinfer really allocates.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import flashinfer.fused_moe as fi_fused_moe
import pytest
from b12x_harness import B12xLayer, cpu_wrapper_class
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch


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
        mp.setattr(fi_fused_moe, "B12xMoEWrapper", cpu_wrapper_class())
        mp.setattr(moe_dispatch, "allocate_sm120_moe_workspace", counter)
        mp.setattr(moe_dispatch, "launch_sm120_moe", lambda **kw: kw["scatter_output"])
        yield counter


@pytest.fixture
def make_b12x_layer(allocations):
    """Factory for real B12x expert layers, with the seams installed."""
    return B12xLayer
