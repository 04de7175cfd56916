# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU harnesses for the two B12x backends' apply(): FlashInferB12xExperts and B12xExperts.

The real vLLM ``FlashInferB12xExperts`` and the real flashinfer
``B12xMoEWrapper`` run here; ``B12xMoEWrapper.run`` runs its real
per-call logic (backend choice, weight-view caching). Only two things that
need an SM12x GPU are replaced:

* the CUDA allocation: ``_ensure_wrapper`` builds the wrapper on the default
  device ``"cuda"``; a subclass of the real wrapper redirects that device to
  CPU so its real buffer allocation runs without a GPU;
* the kernel launch: ``moe_dispatch.launch_sm120_moe`` (the CuTe-DSL kernel
  behind ``B12xMoEWrapper.run``) is replaced by a recorder that keeps what
  would have reached the kernel and returns the output buffer untouched.

The real vLLM ``B12xExperts`` (``fused_moe/b12x.py``, on the b12x planned API) runs its real
``apply()``. The b12x library prepares weights, plans and launches only on an SM12x GPU, so the
seams are the ones vLLM's own tests/kernels/moe/test_b12x.py uses: ``_prepared_experts`` and
``_plan`` stand in for the GPU-prepared weights and plan, ``b12x._run_b12x_moe_plan`` (bind +
launch: the point where vLLM hands the routes to the library) is a recorder, and
``b12x._is_current_stream_capturing`` (a CUDA runtime query, which fails without a driver) says
"not capturing".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flashinfer.fused_moe as fi_fused_moe
import pytest
import torch
import vllm.model_executor.layers.fused_moe.b12x as b12x
from b12x_harness import B12xLayer, apply_b12x_tp_routes, cpu_wrapper_class
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch


@dataclass
class LaunchRecorder:
    """Stands in for the B12x kernel launch; keeps the last call's routes."""

    calls: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def __call__(self, **kwargs: Any) -> torch.Tensor:
        self.calls[:] = [
            {
                "topk_ids": kwargs["topk_ids"],
                "topk_weights": kwargs["topk_weights"],
                "ids_copy": kwargs["topk_ids"].clone(),
                "weights_copy": kwargs["topk_weights"].clone(),
                "num_experts": kwargs["num_experts"],
            }
        ]
        return kwargs["scatter_output"]


@pytest.fixture(scope="module")
def b12x_seams():
    """Install both seams for a whole module; yields the launch recorder."""
    recorder = LaunchRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fi_fused_moe, "B12xMoEWrapper", cpu_wrapper_class())
        mp.setattr(moe_dispatch, "launch_sm120_moe", recorder)
        yield recorder


class RouteLayer(B12xLayer):
    """A real B12x expert layer whose ``apply`` takes the router's ids and weights."""

    def __init__(self, num_experts: int, top_k: int, max_num_tokens: int = 64, **kwargs: Any):
        super().__init__(num_experts=num_experts, top_k=top_k, max_num_tokens=max_num_tokens, **kwargs)

    def apply(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:  # type: ignore[override]
        self.apply_routes(topk_ids, topk_weights)


@pytest.fixture(scope="module")
def make_b12x_layer(b12x_seams):
    """Factory for real B12x expert layers, with both seams installed."""
    return RouteLayer


@dataclass
class PlanRunRecorder:
    """Stands in for ``b12x._run_b12x_moe_plan``; keeps the last call's routes."""

    calls: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def __call__(self, **kwargs: Any) -> None:
        self.calls[:] = [
            {
                "topk_ids": kwargs["topk_ids"],
                "topk_weights": kwargs["topk_weights"],
                "ids_copy": kwargs["topk_ids"].clone(),
                "weights_copy": kwargs["topk_weights"].clone(),
            }
        ]


@pytest.fixture
def b12x_tp_launches(monkeypatch):
    """Install the B12xExperts seams for one test; yields the launch recorder."""
    recorder = PlanRunRecorder()
    monkeypatch.setattr(b12x, "_run_b12x_moe_plan", recorder)
    monkeypatch.setattr(b12x, "_is_current_stream_capturing", lambda: False)
    return recorder


@pytest.fixture
def apply_b12x_tp(b12x_tp_launches):
    """One real B12xExperts.apply() call with the given routes, seams installed."""
    return _apply_b12x_tp


def _apply_b12x_tp(experts: b12x.B12xExperts, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
    """One real B12xExperts.apply() call with the given routes (seams: see the module docstring)."""
    apply_b12x_tp_routes(experts, topk_ids, topk_weights)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
