# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""An unquantized (BF16) draft of a target on a B12x MoE backend must build its MoE layers.

The draft's VllmConfig comes from the proposer's own ``_create_draft_vllm_config``, which keeps
the target's ``kernel_config.moe_backend`` unless the speculative config sets one. The B12x
backends (``flashinfer_b12x``, ``b12x``) have NVFP4/MXFP4 kernels only, so in vLLM 0.33.0 the
unquantized oracle refused the inherited name and the draft's first MoE layer raised at load.

Real code throughout: a real ``VllmConfig`` with a real ``SpeculativeConfig`` (method
``draft_model``, a BF16 MoE draft), the real ``DraftModelProposer._create_draft_vllm_config``
and the real ``UnquantizedFusedMoEMethod`` that a draft's ``FusedMoE`` layer builds from a
``FusedMoEConfig`` carrying the draft's ``moe_backend`` (as ``FusedMoE.__init__`` does). Seams:

* the proposer is created without its ``__init__``, which needs a device and a model runner;
  ``_create_draft_vllm_config`` reads only ``vllm_config`` and ``speculative_config``, which are
  set as ``__init__`` sets them;
* the platform: this machine has no accelerator and vLLM resolves no platform for it, and the
  unquantized oracle has no backend list for that case; the field machine's ``CudaPlatform``
  cannot be imported without a driver. The oracle and the CPU experts see the real
  ``CpuPlatform``, the platform whose automatic selection can run here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from qwen4_exp_hybrid import make_vllm_config, write_model_dir
from vllm.config import KernelConfig, SpeculativeConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.fused_moe.experts import cpu_moe
from vllm.model_executor.layers.fused_moe.oracle import unquantized
from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.spec_decode.draft_model import DraftModelProposer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BF16 MoE model config (4 experts, top-2), used as target and draft."""
    path = tmp_path_factory.mktemp("bf16_moe")
    write_model_dir(path)
    return path


@pytest.fixture
def cpu_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    platform = CpuPlatform()
    monkeypatch.setattr(unquantized, "current_platform", platform)
    monkeypatch.setattr(cpu_moe, "current_platform", platform)


def _draft_vllm_config(model_dir: Path, moe_backend: str) -> VllmConfig:
    target = make_vllm_config(model_dir, "auto")
    vllm_config = VllmConfig(
        model_config=target.model_config,
        cache_config=target.cache_config,
        device_config=target.device_config,
        kernel_config=KernelConfig(moe_backend=moe_backend),  # type: ignore[arg-type]
        speculative_config=SpeculativeConfig(
            model=str(model_dir),
            method="draft_model",
            num_speculative_tokens=1,
            target_model_config=target.model_config,
            target_parallel_config=target.parallel_config,
        ),
    )
    proposer = object.__new__(DraftModelProposer)
    proposer.vllm_config = vllm_config
    proposer.speculative_config = vllm_config.speculative_config
    return proposer._create_draft_vllm_config()


def _draft_moe_method(draft: VllmConfig) -> UnquantizedFusedMoEMethod:
    """The quant method a BF16 draft MoE layer builds, from the draft's config."""
    moe_config = FusedMoEConfig(
        num_experts=4,
        experts_per_token=2,
        hidden_dim=256,
        intermediate_size=128,
        num_local_experts=4,
        num_logical_experts=4,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU,
        in_dtype=draft.model_config.dtype,
        moe_backend=draft.kernel_config.moe_backend,
        device=draft.device_config.device,
        routing_method=RoutingMethodType.TopK,
        max_num_tokens=256,
    )
    with set_current_vllm_config(draft):
        return UnquantizedFusedMoEMethod(moe_config)


@pytest.mark.parametrize("moe_backend", ["flashinfer_b12x", "b12x"])
def test_bf16_draft_of_a_b12x_target_builds_its_moe(model_dir: Path, moe_backend: str, cpu_platform) -> None:
    draft = _draft_vllm_config(model_dir, moe_backend)
    # The draft inherits the target's backend: nothing in the speculative config overrides it.
    assert draft.kernel_config.moe_backend == moe_backend
    assert draft.model_config.dtype == torch.bfloat16
    assert draft.quant_config is None

    method = _draft_moe_method(draft)

    # The draft's MoE gets what automatic selection gives a BF16 layer here.
    auto = _draft_moe_method(_draft_vllm_config(model_dir, "auto"))
    assert isinstance(method.unquantized_backend, UnquantizedMoeBackend)
    assert method.unquantized_backend == auto.unquantized_backend
    assert method.experts_cls is auto.experts_cls
