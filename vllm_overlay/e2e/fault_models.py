"""Models that hang or fail on demand, for the end-to-end suite, registered through vLLM's own plugin mechanism.

Loaded in every vLLM process by the ``vllm.general_plugins`` entry point that
vllm_overlay.e2e.suite writes into a scratch dist-info on the server's PYTHONPATH; the model
directory's config.json names the architecture. Imported only inside a runtime (it imports vllm).

``E2EHangLlamaForCausalLM`` is the served Llama whose forward blocks while the file named by
``$VLLM_OVERLAY_E2E_TRIGGER`` exists: a model step that hangs, on demand, after the server is
ready (warm-up and profiling run before the file is made). The wait is in the outer forward, which
vLLM does not compile (it compiles the inner LlamaModel), so it runs on every step.
"""

from __future__ import annotations

import os
import time

TRIGGER_ENV = "VLLM_OVERLAY_E2E_TRIGGER"
HANG_ARCH = "E2EHangLlamaForCausalLM"
# ``E2EFailLlamaForCausalLM``: the Llama whose forward raises on tensor-parallel rank 1 while the
# file named by $VLLM_OVERLAY_E2E_FAIL_TRIGGER exists (rank 0 goes on into the collective).
FAIL_TRIGGER_ENV = "VLLM_OVERLAY_E2E_FAIL_TRIGGER"
FAIL_ARCH = "E2EFailLlamaForCausalLM"
FAIL_MESSAGE = "e2e test model: rank 1 raises inside forward on purpose"
# Bounded even if the suite dies without removing the file.
MAX_HANG_S = 600.0


def _hold_while_triggered() -> None:
    trigger = os.environ.get(TRIGGER_ENV)
    started = time.monotonic()
    while trigger and os.path.exists(trigger) and time.monotonic() - started < MAX_HANG_S:
        time.sleep(0.05)


def register() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class E2EHangLlamaForCausalLM(LlamaForCausalLM):
        def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            _hold_while_triggered()
            return super().forward(*args, **kwargs)

    class E2EFailLlamaForCausalLM(LlamaForCausalLM):
        def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            from vllm.distributed import get_tensor_model_parallel_rank

            trigger = os.environ.get(FAIL_TRIGGER_ENV)
            if trigger and os.path.exists(trigger) and get_tensor_model_parallel_rank() == 1:
                raise RuntimeError(FAIL_MESSAGE)
            return super().forward(*args, **kwargs)

    supported = ModelRegistry.get_supported_archs()
    if HANG_ARCH not in supported:
        ModelRegistry.register_model(HANG_ARCH, E2EHangLlamaForCausalLM)
    if FAIL_ARCH not in supported:
        ModelRegistry.register_model(FAIL_ARCH, E2EFailLlamaForCausalLM)
