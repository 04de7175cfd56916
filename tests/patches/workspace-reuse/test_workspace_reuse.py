# SPDX-License-Identifier: Apache-2.0
"""Regression tests: identically configured FlashInferB12xExperts layers share
one set of B12xMoEWrapper buffers (static workspace, dynamic workspace, output)
instead of allocating a set per layer; a different configuration gets its own
set, and a set already handed out is never resized.

Real vLLM experts build real flashinfer wrappers whose own allocator runs on
CPU; see conftest.py for the two GPU seams (CUDA allocation redirected to CPU,
kernel launch stubbed) and the allocation counter.
"""

from __future__ import annotations

import gc

import pytest
import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation


def _workspaces(buffers: tuple[object, object, torch.Tensor]) -> list[object]:
    return [ws for ws in buffers[:2] if ws is not None]


def test_identical_layers_allocate_once_and_hold_the_same_buffers(make_b12x_layer, allocations):
    first, second = make_b12x_layer(), make_b12x_layer()

    first.apply()
    static, dynamic, output = first.buffers
    # 256 tokens x top-8 crosses flashinfer's static/dynamic cutover, so the
    # wrapper holds all three kinds of buffer.
    assert static is not None and dynamic is not None
    assert len(allocations.workspaces) == 2

    second.apply()
    assert len(allocations.workspaces) == 2, "second layer allocated its own"
    assert second.buffers[0] is static
    assert second.buffers[1] is dynamic
    assert second.buffers[2] is output
    assert first.experts._wrapper is not second.experts._wrapper


@pytest.mark.parametrize(
    "change",
    [
        {"num_experts": 32},
        {"top_k": 4},
        {"hidden": 512},
        {"intermediate": 256},
        {"max_num_tokens": 512},
        {"activation": MoEActivation.GELU_TANH},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_different_configuration_gets_its_own_buffers(make_b12x_layer, allocations, change):
    first, twin, other = make_b12x_layer(), make_b12x_layer(), make_b12x_layer(**change)

    first.apply()
    before = first.buffers
    static_shape = before[0].packed_input.shape
    output_ptr, output_shape = before[2].data_ptr(), before[2].shape

    twin.apply()
    other.apply()

    assert all(x is y for x, y in zip(twin.buffers, before, strict=True)), "twin not shared"
    assert other.buffers[0] is not before[0]
    assert other.buffers[2] is not before[2]
    if other.buffers[1] is not None:
        assert other.buffers[1] is not before[1]
    # Exactly one set per configuration came out of flashinfer's allocator.
    expected = _workspaces(before) + _workspaces(other.buffers)
    assert [id(ws) for ws in allocations.workspaces] == [id(ws) for ws in expected]
    # The set handed to the first configuration was not resized or replaced.
    assert first.buffers[0] is before[0]
    assert first.buffers[0].packed_input.shape == static_shape
    assert first.buffers[2].data_ptr() == output_ptr
    assert first.buffers[2].shape == output_shape


def test_shared_buffers_are_released_with_the_last_layer(make_b12x_layer, allocations):
    first, second = make_b12x_layer(), make_b12x_layer()
    first.apply()
    second.apply()
    assert second.buffers[0] is first.buffers[0], "second layer allocated its own"
    assert len(allocations.workspaces) == 2

    # While one layer lives, a new identical layer still shares its set.
    del first
    gc.collect()
    third = make_b12x_layer()
    third.apply()
    assert third.buffers[0] is second.buffers[0], "third layer allocated its own"
    assert len(allocations.workspaces) == 2

    # Once every layer using it is gone, the set is not kept alive by the
    # cache: a later layer allocates a fresh one.
    del second, third
    allocations.workspaces.clear()
    gc.collect()
    fourth = make_b12x_layer()
    fourth.apply()
    assert len(allocations.workspaces) == 2
