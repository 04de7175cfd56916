# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A KV connector whose remote KV never arrives, for a decode instance of a
disaggregated prefill setup whose prefill instance has gone quiet.

Loaded by vLLM's own KVConnectorFactory through kv_transfer_config
(kv_connector_module_path names this module), and used by the real
Scheduler in the engine-core process. A request whose kv_transfer_params say
``do_remote_prefill`` (the key vLLM's P/D connectors read) is told that its
prompt's KV will be loaded asynchronously; the scheduler allocates blocks,
puts it in WAITING_FOR_REMOTE_KVS and polls it every step. The load never
finishes, so the request waits there until it is aborted.

Only the scheduler side exists: the worker side would run inside the model
forward pass, and the test's FakeExecutor stands in for the GPU worker and
runs none (it never reports a finished transfer, which is what "never
finishes" means to the scheduler).

The engine-core process and the test are different processes: each step the
connector writes what the scheduler did with the waiting request (its status,
how long it has been seen waiting) to the file named by
QEO_REMOTE_KV_RECORD.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class NeverArrivingRemoteKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        assert role == KVConnectorRole.SCHEDULER, "no worker side: FakeExecutor is the worker"
        super().__init__(vllm_config, role, kv_cache_config)
        self.record_path = os.environ["QEO_REMOTE_KV_RECORD"]
        # req_id -> (request, first time seen waiting for its KV)
        self.loading: dict[str, tuple[Request, float]] = {}

    def _record(self, request: Request, since: float, finished: bool = False) -> None:
        record = {
            "request_id": request.request_id,
            "status": request.status.name,
            "seconds_waiting": time.monotonic() - since,
            "finished": finished,
        }
        tmp = f"{self.record_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.record_path)

    # Scheduler side.

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_prefill"):
            return 0, False
        # All of the prompt but its last token comes from the remote
        # prefill, as with vLLM's P/D connectors; loaded asynchronously.
        return request.num_prompt_tokens - 1 - num_computed_tokens, True

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self.loading[request.request_id] = (request, time.monotonic())

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        # Called once per scheduler step: what the scheduler made of the
        # request after this step's scheduling.
        for request, since in self.loading.values():
            self._record(request, since)
        return KVConnectorMetadata()

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        entry = self.loading.pop(request.request_id, None)
        if entry is not None:
            self._record(request, entry[1], finished=True)
        return False, None

    # Worker side: never built (asserted in __init__).

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def wait_for_save(self) -> None:
        raise NotImplementedError
