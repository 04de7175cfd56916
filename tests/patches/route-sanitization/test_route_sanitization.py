# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: FlashInferB12xExperts.apply() hands the B12x kernel only
expert ids in [0, num_experts) and the unrouted marker -1.

With VLLM_MOE_SKIP_PADDING (the default) padded rows carry expert id -1, which
flashinfer 0.7.2.post1's SM12x kernels skip; an id at or above num_experts (or
an int64 id that wraps into range when narrowed to int32) indexes the kernel's
per-expert state (illegal address, Xid 31). Out-of-range ids must become -1,
and padding must stay -1: turning it into expert 0 makes every padded route
real expert-0 work. The real apply() path runs on CPU; the kernel launch is
replaced by a recorder and the wrapper's CUDA allocation is redirected to CPU
(see conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

NUM_EXPERTS = 512
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_field_vector_out_of_range_routes_become_unrouted(make_b12x_layer, b12x_seams, ids_dtype):
    layer = make_b12x_layer(NUM_EXPERTS, top_k=3)
    topk_ids = torch.tensor([[-1, 7, 512]], dtype=ids_dtype)
    topk_weights = torch.tensor([[0.4, 0.5, 0.6]], dtype=torch.float32)
    ids_before, weights_before = topk_ids.clone(), topk_weights.clone()

    layer.apply(topk_ids, topk_weights)

    seen = b12x_seams.calls[-1]
    assert seen["num_experts"] == NUM_EXPERTS
    assert seen["ids_copy"].dtype == torch.int32
    assert seen["ids_copy"].tolist() == [[-1, 7, -1]]
    assert seen["weights_copy"].tolist() == [[0.0, 0.5, 0.0]]
    # The router's own tensors are left as they were.
    assert torch.equal(topk_ids, ids_before)
    assert torch.equal(topk_weights, weights_before)

    # A second call reuses the same route storage: nothing is allocated per
    # call, which is what lets the guard live inside a captured CUDA graph.
    layer.apply(topk_ids, topk_weights)
    again = b12x_seams.calls[-1]
    assert again["topk_ids"].data_ptr() == seen["topk_ids"].data_ptr()
    assert again["topk_weights"].data_ptr() == seen["topk_weights"].data_ptr()


def _edge_ids(dtype: torch.dtype) -> st.SearchStrategy[int]:
    edges = [-1, NUM_EXPERTS, NUM_EXPERTS + 1, INT32_MIN, INT32_MAX]
    if dtype == torch.int64:
        # 2**32 + 7 narrows to 7 in int32: it must still count as invalid.
        edges += [2**32 + 7, -(2**32) + 5, INT64_MIN, INT64_MAX]
    lo, hi = (INT32_MIN, INT32_MAX) if dtype == torch.int32 else (INT64_MIN, INT64_MAX)
    return st.one_of(
        st.integers(0, NUM_EXPERTS - 1),
        st.sampled_from(edges),
        st.integers(lo, hi),
    )


@st.composite
def _routes(draw, top_k: int):
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    num_tokens = draw(st.integers(1, 16))
    ids = draw(st.lists(_edge_ids(dtype), min_size=num_tokens * top_k, max_size=num_tokens * top_k))
    weights = draw(
        st.lists(
            st.floats(0.0, 1.0, width=32),
            min_size=num_tokens * top_k,
            max_size=num_tokens * top_k,
        )
    )
    return (
        torch.tensor(ids, dtype=dtype).view(num_tokens, top_k),
        torch.tensor(weights, dtype=torch.float32).view(num_tokens, top_k),
    )


@pytest.fixture(scope="module")
def top10_layer(make_b12x_layer):
    return make_b12x_layer(NUM_EXPERTS, top_k=10)


@settings(
    max_examples=60,
    database=None,
    deadline=None,
    # No shrinking: a failing example is reported as drawn, which keeps the
    # red run short.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(routes=_routes(top_k=10))
def test_no_invalid_id_reaches_kernel_and_valid_routes_are_kept(top10_layer, b12x_seams, routes):
    topk_ids, topk_weights = routes
    valid = (topk_ids >= 0) & (topk_ids < NUM_EXPERTS)

    top10_layer.apply(topk_ids, topk_weights)
    seen = b12x_seams.calls[-1]
    ids, weights = seen["ids_copy"], seen["weights_copy"]

    assert ids.dtype == torch.int32
    assert ids.shape == topk_ids.shape
    # Valid routes keep their id and weight; every invalid one becomes the
    # unrouted marker -1 (which the kernel skips) with weight 0.
    assert torch.equal(ids[valid].long(), topk_ids[valid].long())
    assert torch.equal(weights[valid], topk_weights[valid])
    assert bool((ids[~valid] == -1).all()), ids[~valid]
    assert bool((weights[~valid] == 0).all())

    # The weighted sum the kernel forms over the routes it does not skip
    # equals the weighted sum over the router's valid routes alone.
    routed = ids >= 0
    features = torch.randn(NUM_EXPERTS, 4, dtype=torch.float64)
    kernel_ids = torch.where(routed, ids, 0).long()
    got = ((weights.double() * routed).unsqueeze(-1) * features[kernel_ids]).sum(dim=1)
    safe_ids = torch.where(valid, topk_ids, 0).long()
    want = ((topk_weights.double() * valid).unsqueeze(-1) * features[safe_ids]).sum(dim=1)
    torch.testing.assert_close(got, want)


# A CUDA-graph replay of a padded decode batch: 5 real tokens in the 8-token
# graph, the last 3 rows written as padding (-1) by the router.
REAL_ROWS, GRAPH_ROWS, PAD_TOP_K = 5, 8, 8


def _padded_batch(ids_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # Real routes avoid expert 0, so any expert-0 route the kernel sees was
    # made from padding.
    ids = torch.arange(1, 1 + GRAPH_ROWS * PAD_TOP_K, dtype=ids_dtype).view(GRAPH_ROWS, PAD_TOP_K)
    ids[REAL_ROWS:] = -1
    weights = torch.full((GRAPH_ROWS, PAD_TOP_K), 1.0 / PAD_TOP_K)
    return ids, weights


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_padding_routes_stay_unrouted_not_expert0(make_b12x_layer, b12x_seams, ids_dtype):
    """Kept from 0.33.0: the kernel skips -1, so padding reaches it as -1, not as expert-0 work."""
    layer = make_b12x_layer(NUM_EXPERTS, top_k=PAD_TOP_K, max_num_tokens=GRAPH_ROWS)
    topk_ids, topk_weights = _padded_batch(ids_dtype)

    layer.apply(topk_ids, topk_weights)

    ids = b12x_seams.calls[-1]["ids_copy"]
    assert ids[REAL_ROWS:].tolist() == [[-1] * PAD_TOP_K] * (GRAPH_ROWS - REAL_ROWS)
    assert int((ids == 0).sum()) == 0
    assert torch.equal(ids[:REAL_ROWS].long(), topk_ids[:REAL_ROWS].long())
