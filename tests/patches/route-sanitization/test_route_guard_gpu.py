# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""GPU test: the production Triton route-guard kernel against its CPU path (skipped without CUDA).

``sanitize_topk_routes`` (fused_moe/route_guard.py) runs one Triton kernel for CUDA tensors and a
torch ``masked_fill`` path for CPU tensors; the CPU tests of this series exercise only the latter.
Here both run on the same routes and must agree exactly (int32 ids equal, float32 weights equal
bit for bit):

* ids int32 and int64: valid ids mixed with -1, num_experts, ids above it, other negatives, the
  dtype's extremes and, for int64, ids that wrap into [0, num_experts) when narrowed to int32,
  plus a padded tail of -1 rows as VLLM_MOE_SKIP_PADDING writes it;
* 1..8192 tokens (the edges of the kernel's 256-route programs included), top-8 and top-10;
* contiguous, transposed (column-major) and row-strided inputs; float32 and bfloat16 weights;
* both unrouted ids the backends use: -1 (kernels that skip it) and 0 (a raw-indexing kernel).

Then the real per-layer ``TopKRouteGuard`` is called for the first time inside CUDA-graph capture
(its buffers come from construction) and the graph is replayed on new routes.

This file needs no flashinfer: it imports only the route guard and the MoE config.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: runs the Triton kernel"),
]

NUM_EXPERTS = 512
TOKENS = [1, 2, 3, 7, 8, 25, 26, 31, 32, 33, 64, 100, 127, 256, 1000, 1024, 2047, 2048, 4095, 4096, 8191, 8192]


def _random_ids(num_tokens: int, top_k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    n = num_tokens * top_k
    ids = torch.randint(0, NUM_EXPERTS, (n,), generator=gen, dtype=torch.int64)
    info = torch.iinfo(dtype)
    edges = [-1, NUM_EXPERTS, NUM_EXPERTS + 1, 2 * NUM_EXPERTS, -2, -NUM_EXPERTS, info.min, info.max]
    if dtype == torch.int64:
        edges += [2**32 + 7, 2**32, -(2**32) + 5, 2**31, -(2**31) - 1]
    pick = torch.rand(n, generator=gen)
    edge_at = torch.randint(0, len(edges), (n,), generator=gen)
    ids = torch.where(pick < 0.3, torch.tensor(edges, dtype=torch.int64)[edge_at], ids)
    wide = torch.randint(info.min if dtype == torch.int32 else -(2**62), 2**31 - 1, (n,), generator=gen)
    ids = torch.where((pick >= 0.3) & (pick < 0.4), wide, ids)
    ids.view(num_tokens, top_k)[num_tokens - num_tokens // 4 :] = -1
    return ids.to(dtype).view(num_tokens, top_k)


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same logical [T, K] tensor on CUDA in the given memory layout."""
    t = t.cuda()
    if layout == "contiguous":
        return t.contiguous()
    if layout == "transposed":
        return t.t().contiguous().t()
    strided = torch.empty(t.size(0), 2 * t.size(1), dtype=t.dtype, device=t.device)[:, ::2]
    strided.copy_(t)
    return strided


@pytest.mark.parametrize("unrouted_id", [-1, 0])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "row_strided"])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k", [8, 10])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_triton_kernel_matches_cpu_path(ids_dtype, top_k, weights_dtype, layout, unrouted_id):
    from vllm.model_executor.layers.fused_moe.route_guard import sanitize_topk_routes

    gen = torch.Generator().manual_seed(top_k * 1000 + (ids_dtype == torch.int64) * 10 + unrouted_id)
    for num_tokens in TOKENS:
        ids = _random_ids(num_tokens, top_k, ids_dtype, gen)
        weights = torch.rand(num_tokens, top_k, generator=gen).to(weights_dtype)
        cpu_ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
        cpu_w = torch.empty(num_tokens, top_k, dtype=torch.float32)
        sanitize_topk_routes(ids, weights, NUM_EXPERTS, cpu_ids, cpu_w, unrouted_id)
        # Poisoned outputs: every element must be written by the kernel.
        gpu_ids = torch.full((num_tokens, top_k), -7, dtype=torch.int32, device="cuda")
        gpu_w = torch.full((num_tokens, top_k), float("nan"), dtype=torch.float32, device="cuda")
        gpu_in_ids, gpu_in_w = _layout(ids, layout), _layout(weights, layout)
        # A [1, K] view is contiguous whatever its strides; from 2 tokens on it is not.
        assert layout == "contiguous" or num_tokens == 1 or not gpu_in_ids.is_contiguous()

        sanitize_topk_routes(gpu_in_ids, gpu_in_w, NUM_EXPERTS, gpu_ids, gpu_w, unrouted_id)
        torch.cuda.synchronize()

        where = f"tokens={num_tokens}"
        assert torch.equal(gpu_ids.cpu(), cpu_ids), where
        assert torch.equal(gpu_w.cpu().view(torch.int32), cpu_w.view(torch.int32)), where
        # The CPU path itself: invalid -> (unrouted_id, 0.0), valid kept.
        valid = (ids >= 0) & (ids < NUM_EXPERTS)
        assert torch.equal(cpu_ids.long(), torch.where(valid, ids, unrouted_id).long()), where
        assert torch.equal(cpu_w, torch.where(valid, weights.float(), 0.0)), where
        assert bool((~valid).any()), where


@pytest.mark.parametrize("num_tokens", [1, 8192])
@pytest.mark.parametrize("unrouted_id", [-1, 0])
def test_layer_guard_first_call_inside_graph_capture(num_tokens, unrouted_id):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.route_guard import TopKRouteGuard, sanitize_topk_routes

    top_k = 10
    config = FusedMoEConfig(
        num_experts=NUM_EXPERTS,
        experts_per_token=top_k,
        hidden_dim=2048,
        intermediate_size=512,
        num_local_experts=NUM_EXPERTS,
        num_logical_experts=NUM_EXPERTS,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=torch.bfloat16,
        device="cuda",
        routing_method=RoutingMethodType.TopK,
        max_num_tokens=num_tokens,
    )
    guard = TopKRouteGuard(config, unrouted_id=unrouted_id)
    assert guard.enabled and guard.ids is not None and guard.ids.is_cuda
    gen = torch.Generator().manual_seed(num_tokens + unrouted_id)
    ids_in = _random_ids(num_tokens, top_k, torch.int64, gen).cuda()
    w_in = torch.rand(num_tokens, top_k, generator=gen).cuda()
    # Compile the kernel's specialization outside capture, on other buffers.
    sanitize_topk_routes(
        ids_in,
        w_in,
        NUM_EXPERTS,
        torch.empty_like(guard.ids),
        torch.empty_like(guard.weights),
        unrouted_id,
    )
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_ids, out_w = guard(ids_in, w_in)
    assert out_ids.data_ptr() == guard.ids.data_ptr()

    for _ in range(3):
        ids = _random_ids(num_tokens, top_k, torch.int64, gen)
        weights = torch.rand(num_tokens, top_k, generator=gen)
        ids_in.copy_(ids)
        w_in.copy_(weights)
        graph.replay()
        torch.cuda.synchronize()
        want_ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
        want_w = torch.empty(num_tokens, top_k, dtype=torch.float32)
        sanitize_topk_routes(ids, weights, NUM_EXPERTS, want_ids, want_w, unrouted_id)
        assert torch.equal(out_ids.cpu(), want_ids)
        assert torch.equal(out_w.cpu(), want_w)
