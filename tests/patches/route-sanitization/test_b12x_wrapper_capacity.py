# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: FlashInferB12xExperts builds flashinfer's B12xMoEWrapper for every token the
naive DP/PCP dispatch all-gathers, and refuses at construction a wrapper over flashinfer's 2^31-1
workspace limit.

The real FlashInferB12xExperts and the real flashinfer B12xMoEWrapper run on CPU (the wrapper's CUDA
allocation redirected to CPU, the kernel launch a recorder: see conftest.py). The construction check
builds the real wrapper on the meta device, which runs flashinfer's own sizing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from b12x_harness import make_experts
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

NUM_EXPERTS = 64
TOP_K = 4


def _parallel(dp_size: int = 1, pcp_size: int = 1) -> FusedMoEParallelConfig:
    return replace(FusedMoEParallelConfig.make_no_parallel(), dp_size=dp_size, pcp_size=pcp_size)


def _routes(num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = (torch.arange(num_tokens * TOP_K, dtype=torch.int32) % NUM_EXPERTS).view(num_tokens, TOP_K)
    return ids, torch.full((num_tokens, TOP_K), 1.0 / TOP_K)


@pytest.mark.parametrize(("dp_size", "pcp_size"), [(2, 1), (1, 2), (2, 2)])
def test_wrapper_takes_all_gathered_tokens(make_b12x_layer, b12x_seams, dp_size, pcp_size):
    max_num_tokens = 4
    gathered = max_num_tokens * dp_size * pcp_size
    layer = make_b12x_layer(
        NUM_EXPERTS, top_k=TOP_K, max_num_tokens=max_num_tokens, moe_parallel_config=_parallel(dp_size, pcp_size)
    )

    # Every rank's tokens, all-gathered before apply(), reach the kernel in one call.
    layer.apply(*_routes(gathered))

    assert layer.experts._wrapper.max_num_tokens == gathered
    assert b12x_seams.calls[-1]["ids_copy"].shape == (gathered, TOP_K)


def test_one_rank_keeps_the_wrapper_of_max_num_tokens(make_b12x_layer, b12x_seams):
    """Kept from 0.33.0: without DP or PCP the wrapper is built for max_num_tokens."""
    layer = make_b12x_layer(NUM_EXPERTS, top_k=TOP_K, max_num_tokens=8)

    layer.apply(*_routes(8))

    assert layer.experts._wrapper.max_num_tokens == 8
    assert b12x_seams.calls[-1]["ids_copy"].shape == (8, TOP_K)


def test_wrapper_over_the_flashinfer_limit_is_refused_at_construction(b12x_seams):
    # 256 experts, top-8, hidden 7168: 8192 tokens x DP 16 = 131,072 tokens, whose dynamic
    # workspace plane flashinfer 0.7.2.post1 sizes at 3,875,078,144 elements (> 2^31-1).
    with pytest.raises(ValueError, match=r"2\^31-1") as info:
        make_experts(256, 8, 7168, 256, 8192, moe_parallel_config=_parallel(dp_size=16))
    message = str(info.value)
    assert "FlashInferB12xExperts" in message
    assert "131072 tokens" in message and "DP size 16" in message
