# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: the route guard's buffers cost what one MoE call needs, not one set per layer.

Every B12x MoE layer builds a TopKRouteGuard whose int32 ids and float32 weights hold
[max_num_tokens x DP x PCP, top_k] routes. They are taken at construction, before the KV cache is
profiled, so every byte comes out of the KV cache. A guard's output lives only for the MoE call
that wrote it (the layer's kernel reads it in the same apply(), on the current stream) and the MoE
layers of a device run one after another, so guards of one device and shape share one set.

* Kept from 0.33.0, which allocates nothing for a guard: N real layers of either backend, built
  from one configuration, hold no more tensor memory than one of them, at DP=1 and at DP=8 (the
  per-layer sets of the series before this fix made N layers hold N sets).
* Guards of the same device, rows and top-k share one set (whichever backend, whichever unrouted
  id); another shape or device gets its own, and a set handed out keeps its storage, address and
  shape (captured CUDA graphs hold its address).
* The set goes with the last guard that uses it.
* Two layers sharing a set, called one after another, each hand their kernel their own routes.

The layers are the real FlashInferB12xExperts and B12xExperts; the kernel launches are recorders
(see conftest.py).
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest
import torch
from b12x_harness import B12X_TP_SCHEMES, held_bytes, make_b12x_tp_experts, make_model_layers, make_moe_config
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

NUM_EXPERTS = 512
TOP_K = 8
HIDDEN, INTERMEDIATE = 256, 128
MAX_NUM_TOKENS = 64
NUM_LAYERS = 4


def _config(dp_size: int = 1, top_k: int = TOP_K, max_num_tokens: int = MAX_NUM_TOKENS, device: str = "cpu"):
    parallel = replace(FusedMoEParallelConfig.make_no_parallel(), dp_size=dp_size)
    return make_moe_config(
        NUM_EXPERTS, top_k, HIDDEN, INTERMEDIATE, max_num_tokens, device, moe_parallel_config=parallel
    )


@pytest.mark.parametrize("dp_size", [1, 8])
@pytest.mark.parametrize("backend", ["flashinfer", "b12x"])
def test_layers_hold_no_more_tensor_memory_than_one(backend, dp_size):
    """Kept from 0.33.0: N layers hold what one holds (0.33.0 allocates nothing for a guard)."""
    moe_config = _config(dp_size=dp_size)
    layers = make_model_layers(backend, moe_config, NUM_LAYERS)

    one = held_bytes(layers[0])
    all_layers = held_bytes(*layers)

    assert all_layers == one, (
        f"{NUM_LAYERS} layers at DP={dp_size} hold {all_layers} B of tensors, one layer {one} B: "
        f"{all_layers - one} B more"
    )


def _route_guard(layer: object):
    return layer._route_guard  # type: ignore[attr-defined]


def _same_set(guard, other) -> bool:
    """Whether two guards hand their kernels the same two buffers (the tensors, not a copy)."""
    return guard.ids is other.ids and guard.weights is other.weights


def test_guards_of_one_device_and_shape_share_one_set():
    from vllm.model_executor.layers.fused_moe.route_guard import TopKRouteGuard

    moe_config = _config()
    flashinfer_layers = make_model_layers("flashinfer", moe_config, 2)
    b12x_layers = [make_b12x_tp_experts(scheme, moe_config) for scheme in B12X_TP_SCHEMES]
    trellis_guard = TopKRouteGuard(moe_config, unrouted_id=0)
    guards = [_route_guard(layer) for layer in flashinfer_layers + b12x_layers] + [trellis_guard]
    first = guards[0]
    assert first.ids.shape == first.weights.shape == (MAX_NUM_TOKENS, TOP_K)
    assert first.ids.dtype == torch.int32 and first.weights.dtype == torch.float32
    ids_ptr, weights_ptr = first.ids.data_ptr(), first.weights.data_ptr()
    assert all(_same_set(guard, first) for guard in guards[1:])

    others = {
        "top_k": TopKRouteGuard(_config(top_k=TOP_K - 2)),
        "max_num_tokens": TopKRouteGuard(_config(max_num_tokens=2 * MAX_NUM_TOKENS)),
        "dp_size": TopKRouteGuard(_config(dp_size=2)),
        "device": TopKRouteGuard(_config(device="meta")),
    }
    expected_rows = {"top_k": MAX_NUM_TOKENS, "max_num_tokens": 2 * MAX_NUM_TOKENS, "dp_size": 2 * MAX_NUM_TOKENS}
    for what, guard in others.items():
        assert guard.ids is not first.ids, what
        assert guard.weights is not first.weights, what
        assert guard.ids.shape[0] == expected_rows.get(what, MAX_NUM_TOKENS), what
    assert others["device"].ids.device.type == "meta"
    # A set handed out is never replaced or resized: captured graphs keep its address.
    assert first.ids.data_ptr() == ids_ptr and first.weights.data_ptr() == weights_ptr
    assert first.ids.shape == (MAX_NUM_TOKENS, TOP_K)
    assert all(_same_set(_route_guard(layer), first) for layer in flashinfer_layers + b12x_layers)


def test_shared_set_goes_with_the_last_guard():
    from vllm.model_executor.layers.fused_moe.route_guard import TopKRouteGuard

    # A shape no other test uses, so no other guard holds this set.
    moe_config = _config(max_num_tokens=3 * MAX_NUM_TOKENS + 1)
    guards = [TopKRouteGuard(moe_config) for _ in range(3)]
    ids = weakref.ref(guards[0].ids)

    del guards[:2]
    gc.collect()
    assert ids() is not None, "released while a guard still uses it"
    assert ids().data_ptr() == guards[0].ids.data_ptr()

    del guards[0]
    gc.collect()
    assert ids() is None, "the set outlived its last guard"
    assert TopKRouteGuard(moe_config).ids is not None


def test_layers_sharing_a_set_each_hand_their_kernel_their_own_routes(make_b12x_layer, b12x_seams):
    first, second = make_b12x_layer(NUM_EXPERTS, top_k=2), make_b12x_layer(NUM_EXPERTS, top_k=2)
    assert _same_set(_route_guard(first.experts), _route_guard(second.experts))

    first.apply(torch.tensor([[3, NUM_EXPERTS]]), torch.tensor([[0.5, 0.5]]))
    seen_first = b12x_seams.calls[-1]
    second.apply(torch.tensor([[-1, 9], [11, 12]]), torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    seen_second = b12x_seams.calls[-1]

    # One after another through the same storage, each launch with its own routes.
    assert seen_first["topk_ids"].data_ptr() == seen_second["topk_ids"].data_ptr()
    assert seen_first["ids_copy"].tolist() == [[3, -1]]
    assert seen_first["weights_copy"].tolist() == [[0.5, 0.0]]
    assert seen_second["ids_copy"].tolist() == [[-1, 9], [11, 12]]
    assert seen_second["weights_copy"].tolist() == [[0.0, 0.75], [0.5, 0.5]]
