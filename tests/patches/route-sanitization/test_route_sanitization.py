# SPDX-License-Identifier: Apache-2.0
"""Regression tests: FlashInferB12xExperts.apply() never hands the B12x kernel
an expert id outside [0, num_experts).

With VLLM_MOE_SKIP_PADDING (the default) padded rows carry expert id -1; the
kernel indexes its per-expert state with the raw id (illegal address, Xid 31).
The real apply() path runs on CPU; the kernel launch is replaced by a recorder
and the wrapper's CUDA allocation is redirected to CPU (see conftest.py).
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
def test_field_vector_padding_routes_become_expert0_weight0(make_b12x_layer, b12x_seams, ids_dtype):
    layer = make_b12x_layer(NUM_EXPERTS, top_k=3)
    topk_ids = torch.tensor([[-1, 7, 512]], dtype=ids_dtype)
    topk_weights = torch.tensor([[0.4, 0.5, 0.6]], dtype=torch.float32)
    ids_before, weights_before = topk_ids.clone(), topk_weights.clone()

    layer.apply(topk_ids, topk_weights)

    seen = b12x_seams.calls[-1]
    assert seen["num_experts"] == NUM_EXPERTS
    assert seen["ids_copy"].dtype == torch.int32
    assert seen["ids_copy"].tolist() == [[0, 7, 0]]
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
    assert bool(((ids >= 0) & (ids < NUM_EXPERTS)).all()), ids[~valid]
    # Valid routes keep their id and weight; invalid ones get weight 0.
    assert torch.equal(ids[valid].long(), topk_ids[valid].long())
    assert torch.equal(weights[valid], topk_weights[valid])
    assert bool((weights[~valid] == 0).all())

    # The weighted sum the kernel forms over its routes equals the weighted
    # sum over the router's valid routes alone.
    features = torch.randn(NUM_EXPERTS, 4, dtype=torch.float64)
    got = (weights.double().unsqueeze(-1) * features[ids.long()]).sum(dim=1)
    safe_ids = torch.where(valid, topk_ids, 0).long()
    want = ((topk_weights.double() * valid).unsqueeze(-1) * features[safe_ids]).sum(dim=1)
    torch.testing.assert_close(got, want)
