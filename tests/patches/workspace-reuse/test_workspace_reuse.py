# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression tests: identically configured FlashInferB12xExperts layers share
one set of B12xMoEWrapper buffers (static workspace, dynamic workspace, output)
instead of allocating a set per layer; a different configuration gets its own
set, and a set already handed out is never resized. A flashinfer whose wrapper
lacks the shared_* arguments gets per-layer buffers and one warning; the
wrapper's output dtype is the layer's.

Real vLLM experts build real flashinfer wrappers whose own allocator runs on
CPU; see conftest.py for the two GPU seams (CUDA allocation redirected to CPU,
kernel launch stubbed) and the allocation counter.
"""

from __future__ import annotations

import gc
import logging

import pytest
import torch
import vllm.logger
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.experts import flashinfer_b12x_moe

SHARED_ARGUMENTS = ("shared_static_workspace", "shared_dynamic_workspace", "shared_output")


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


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_without_shared_buffer_arguments_each_layer_allocates_its_own(
    make_b12x_layer, allocations, pre_sharing_flashinfer
):
    """A flashinfer whose wrapper has no shared_* arguments: every layer keeps
    its own buffers, as in vLLM 0.33.0, and the fallback is reported once."""
    # warning_once remembers messages for the process; an earlier fallback
    # (another test module's wrapper) must not hide this one.
    vllm.logger._print_warning_once.cache_clear()
    records = _Records()
    module_logger = logging.getLogger(flashinfer_b12x_moe.__name__)
    module_logger.addHandler(records)
    try:
        layers = [make_b12x_layer() for _ in range(3)]
        for layer in layers:
            layer.apply()
    finally:
        module_logger.removeHandler(records)

    assert all(type(layer.experts._wrapper) is pre_sharing_flashinfer for layer in layers)
    sets = [layer.buffers for layer in layers]
    # Each layer allocated a full set of its own through flashinfer's allocator.
    assert len(allocations.workspaces) == 2 * len(layers)
    for i, one in enumerate(sets):
        for other in sets[i + 1 :]:
            assert all(x is not y for x, y in zip(one, other, strict=True))
    assert all(layer.experts._shared_buffers is None for layer in layers)
    assert len(records.records) == 1, [r.getMessage() for r in records.records]
    message = records.records[0].getMessage()
    assert all(name in message for name in SHARED_ARGUMENTS), message


@pytest.mark.parametrize("flashinfer", ["shared-buffers", "pre-sharing"])
def test_wrapper_output_dtype_is_the_layers(make_b12x_layer, allocations, request, flashinfer):
    """The wrapper is built for the layer's dtype, not for bfloat16: a bf16
    layer's (shared) output is bf16, and flashinfer 0.7.2.post1, whose SM12x
    kernels write bf16 only, refuses an fp16 layer at construction instead of
    running it on a bf16 output."""
    if flashinfer == "pre-sharing":
        request.getfixturevalue("pre_sharing_flashinfer")

    bf16 = make_b12x_layer()
    bf16.apply()
    assert bf16.experts._wrapper.output_dtype == torch.bfloat16
    assert bf16.buffers[2].dtype == torch.bfloat16

    fp16 = make_b12x_layer(dtype=torch.float16)
    with pytest.raises(ValueError, match="float16"):
        fp16.apply()
