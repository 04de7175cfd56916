# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: the one route guard covers both B12x backends and the paths the routes take.

* B12xExperts (fused_moe/b12x.py, the b12x planned API) in every kernel mode it selects: no
  expert id outside [0, num_experts) reaches the launch but the unrouted marker -1, which those
  kernels skip; an int64 id that would wrap into range under an int32 conversion is rejected
  too, and padding routes stay -1 (no expert-0 work). Only the Trellis weight layout, whose FC2
  indexes with the raw id, gets expert 0 with weight 0 instead.
* Data parallelism without expert parallelism all-gathers every DP rank's tokens: the route
  capacity is max_num_tokens x DP size.
* A non-contiguous top-k input (a strided view) is guarded, not rejected.
* The route buffers exist from construction, before any call, so no call (the first one during
  CUDA-graph capture included) allocates.
* With VLLM_MOE_SKIP_PADDING=0 no padding route can occur and the guard is skipped; with it on
  (the default) the guard runs.

The kernel launches are replaced by recorders (see conftest.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from b12x_harness import B12X_TP_SCHEMES, make_b12x_tp_experts, make_moe_config
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

NUM_EXPERTS = 512
TOP_K = 4
# -1 (padding sentinel), a valid id, num_experts, and an int64 id whose int32 narrowing is the
# valid expert 7.
FIELD_IDS = [[-1, 7, NUM_EXPERTS, 2**32 + 7]]
FIELD_WEIGHTS = [[0.25, 0.5, 0.75, 1.0]]


def _dp_no_ep(dp_size: int) -> FusedMoEParallelConfig:
    return replace(FusedMoEParallelConfig.make_no_parallel(), dp_size=dp_size)


def _tp_experts(scheme, max_num_tokens: int = 16, dp_size: int = 1, top_k: int = TOP_K):
    config = make_moe_config(NUM_EXPERTS, top_k, 256, 128, max_num_tokens, moe_parallel_config=_dp_no_ep(dp_size))
    return make_b12x_tp_experts(scheme, config)


@pytest.mark.parametrize(
    "scheme", list(B12X_TP_SCHEMES), ids=lambda s: B12X_TP_SCHEMES[s] + "-" + "-".join(map(str, s))
)
def test_b12x_tp_every_mode_gets_only_valid_routes(b12x_tp_launches, apply_b12x_tp, scheme):
    experts = _tp_experts(scheme)
    assert experts._quant_mode == B12X_TP_SCHEMES[scheme]
    topk_ids = torch.tensor(FIELD_IDS, dtype=torch.int64)
    topk_weights = torch.tensor(FIELD_WEIGHTS, dtype=torch.float32)

    apply_b12x_tp(experts, topk_ids, topk_weights)

    seen = b12x_tp_launches.calls[-1]
    assert seen["ids_copy"].dtype == torch.int32 and seen["ids_copy"].is_contiguous()
    assert seen["weights_copy"].dtype == torch.float32
    assert seen["ids_copy"].tolist() == [[-1, 7, -1, -1]]
    assert seen["weights_copy"].tolist() == [[0.0, 0.5, 0.0, 0.0]]


@pytest.mark.parametrize(
    "scheme", list(B12X_TP_SCHEMES), ids=lambda s: B12X_TP_SCHEMES[s] + "-" + "-".join(map(str, s))
)
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_b12x_tp_padding_routes_stay_unrouted_not_expert0(b12x_tp_launches, apply_b12x_tp, scheme, ids_dtype):
    """Kept from 0.33.0: these kernels skip -1, so padding reaches them as -1, not expert 0."""
    experts = _tp_experts(scheme, max_num_tokens=8, top_k=TOP_K)
    real_rows, graph_rows = 3, 8
    topk_ids = torch.arange(1, 1 + graph_rows * TOP_K, dtype=ids_dtype).view(graph_rows, TOP_K)
    topk_ids[real_rows:] = -1
    topk_weights = torch.full((graph_rows, TOP_K), 1.0 / TOP_K)

    apply_b12x_tp(experts, topk_ids, topk_weights)

    ids = b12x_tp_launches.calls[-1]["ids_copy"]
    assert ids[real_rows:].tolist() == [[-1] * TOP_K] * (graph_rows - real_rows)
    assert int((ids == 0).sum()) == 0
    assert torch.equal(ids[:real_rows].long(), topk_ids[:real_rows].long())


def test_b12x_trellis_layout_gets_expert0_weight0(monkeypatch, b12x_tp_launches, apply_b12x_tp):
    """The Trellis FC2 (b12x micro.py _run_fc2_trellis) indexes w2_alphas with the raw id.

    No mode of vLLM 0.33.0's table selects a Trellis source format; the table gains one here.
    """
    import vllm.model_executor.layers.fused_moe.b12x as b12x

    monkeypatch.setitem(b12x._B12X_MOE_MODES, ("mxfp4", "mxfp8"), ("w4a8_mx", "exl3", "w31"))
    experts = _tp_experts(("mxfp4", "mxfp8"))
    assert experts._source_format == "exl3"

    apply_b12x_tp(experts, torch.tensor(FIELD_IDS, dtype=torch.int64), torch.tensor(FIELD_WEIGHTS))

    seen = b12x_tp_launches.calls[-1]
    assert seen["ids_copy"].tolist() == [[0, 7, 0, 0]]
    assert seen["weights_copy"].tolist() == [[0.0, 0.5, 0.0, 0.0]]


def test_b12x_tp_strided_bf16_routes_are_guarded(b12x_tp_launches, apply_b12x_tp):
    experts = _tp_experts(("nvfp4", "nvfp4"), top_k=2)
    # Column-major ids and weights: a transposed view, as a router writing [top_k, T] would hand.
    topk_ids = torch.tensor([[-1, 3], [5, 600]], dtype=torch.int32).t()
    topk_weights = torch.tensor([[0.5, 0.25], [0.125, 1.0]], dtype=torch.bfloat16).t()
    assert not topk_ids.is_contiguous()

    apply_b12x_tp(experts, topk_ids, topk_weights)

    seen = b12x_tp_launches.calls[-1]
    assert seen["ids_copy"].tolist() == [[-1, 5], [3, -1]]
    assert seen["weights_copy"].dtype == torch.float32
    assert seen["weights_copy"].tolist() == [[0.0, 0.125], [0.25, 0.0]]


@pytest.mark.parametrize("backend", ["flashinfer", "b12x"])
def test_route_buffers_exist_before_the_first_call(
    make_b12x_layer, b12x_seams, b12x_tp_launches, apply_b12x_tp, backend
):
    """Nothing is allocated on the first call, so a first call during capture is safe."""
    if backend == "flashinfer":
        layer = make_b12x_layer(NUM_EXPERTS, top_k=TOP_K, max_num_tokens=8)
        guard = layer.experts._route_guard
        call, recorder = layer.apply, b12x_seams
    else:
        experts = _tp_experts(("nvfp4", None), max_num_tokens=8)
        guard = experts._route_guard

        def call(ids, weights):
            apply_b12x_tp(experts, ids, weights)

        recorder = b12x_tp_launches
    assert guard.ids is not None and guard.weights is not None
    assert guard.ids.shape == guard.weights.shape == (8, TOP_K)
    ids_ptr, weights_ptr = guard.ids.data_ptr(), guard.weights.data_ptr()

    call(torch.tensor(FIELD_IDS), torch.tensor(FIELD_WEIGHTS))

    seen = recorder.calls[-1]
    assert seen["topk_ids"].data_ptr() == ids_ptr
    assert seen["topk_weights"].data_ptr() == weights_ptr


@pytest.mark.parametrize("backend", ["flashinfer", "b12x"])
def test_dp_without_ep_route_capacity_is_max_tokens_times_dp(make_b12x_layer, b12x_tp_launches, apply_b12x_tp, backend):
    """The guard takes what the naive dispatch all-gathers (the FlashInfer wrapper's own capacity
    is the next patch's, test_b12x_wrapper_capacity.py)."""
    max_num_tokens, dp_size = 4, 2
    gathered = max_num_tokens * dp_size

    def routes(num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.arange(num_tokens * TOP_K, dtype=torch.int32).view(num_tokens, TOP_K)
        return ids, torch.full((num_tokens, TOP_K), 0.25)

    if backend == "flashinfer":
        layer = make_b12x_layer(
            NUM_EXPERTS, top_k=TOP_K, max_num_tokens=max_num_tokens, moe_parallel_config=_dp_no_ep(dp_size)
        )
        guard = layer.experts._route_guard
        call = layer.apply
    else:
        experts = _tp_experts(("nvfp4", "nvfp4"), max_num_tokens=max_num_tokens, dp_size=dp_size)
        guard = experts._route_guard

        def call(ids, weights):
            apply_b12x_tp(experts, ids, weights)

        # The tokens of both DP ranks, all-gathered, fit.
        call(*routes(gathered))
        assert b12x_tp_launches.calls[-1]["ids_copy"].shape == (gathered, TOP_K)
    assert guard.max_num_tokens == gathered and guard.ids.shape == (gathered, TOP_K)
    with pytest.raises(ValueError, match=f"exceeds the MoE route capacity \\({gathered} "):
        call(*routes(gathered + 1))


@pytest.mark.parametrize("skip_padding", ["1", "0"])
@pytest.mark.parametrize("backend", ["flashinfer", "b12x"])
def test_guard_runs_only_when_padding_routes_can_occur(
    monkeypatch, make_b12x_layer, b12x_seams, b12x_tp_launches, apply_b12x_tp, backend, skip_padding
):
    monkeypatch.setenv("VLLM_MOE_SKIP_PADDING", skip_padding)
    if backend == "flashinfer":
        layer = make_b12x_layer(NUM_EXPERTS, top_k=3, max_num_tokens=8)
        guard = layer.experts._route_guard
        call, recorder = layer.apply, b12x_seams
    else:
        experts = _tp_experts(("nvfp4", "nvfp4"), max_num_tokens=8, top_k=3)
        guard = experts._route_guard

        def call(ids, weights):
            apply_b12x_tp(experts, ids, weights)

        recorder = b12x_tp_launches
    # Router output as each setting produces it: with VLLM_MOE_SKIP_PADDING on, padded rows
    # carry -1; with it off, padded rows are routed like real ones.
    padded = -1 if skip_padding == "1" else 2
    topk_ids = torch.tensor([[4, 7, 9], [padded, padded, padded]], dtype=torch.int64)
    topk_weights = torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]], dtype=torch.float32)

    call(topk_ids, topk_weights)

    seen = recorder.calls[-1]
    assert seen["ids_copy"].dtype == torch.int32
    if skip_padding == "1":
        assert guard.enabled and guard.ids is not None
        assert seen["topk_ids"].data_ptr() == guard.ids.data_ptr()
        assert seen["ids_copy"].tolist() == [[4, 7, 9], [-1, -1, -1]]
        assert seen["weights_copy"].tolist() == [[0.5, 0.25, 0.25], [0.0, 0.0, 0.0]]
    else:
        # Skipped: no buffers, and the kernel gets the router's routes as the unguarded call did.
        assert not guard.enabled and guard.ids is None and guard.weights is None
        assert seen["ids_copy"].tolist() == topk_ids.tolist()
        assert torch.equal(seen["weights_copy"], topk_weights)
