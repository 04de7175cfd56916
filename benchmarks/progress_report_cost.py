#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the engine's progress reports (queue-event-ownership, the progress
check) cost a user who never asks for /health/progress.

Measures, with the real classes of a patched tree laid over the installed
vllm (scripts/with-patched-vllm):

* the bytes of one report on the wire: EngineCoreOutputs(progress=...) as
  the engine core's output thread encodes it (vLLM's MsgpackEncoder), for an
  engine in a step and for one waiting for work;
* the CPU time of one report on the engine side: EngineStepProgress.report()
  plus that encoding (median of many);
* from these, per API server and hour at the default interval (1 s, from
  VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS=120): an engine with work sends one
  report a second; an engine waiting for work sends one report per idle
  period, then nothing.

    scripts/with-patched-vllm --tree build/patched -- ENV/bin/python benchmarks/progress_report_cost.py
"""

from __future__ import annotations

import statistics
import time


def main() -> None:
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.engine.progress import EngineStepProgress, progress_report_interval_s
    from vllm.v1.serial_utils import MsgpackEncoder

    encoder = MsgpackEncoder()
    progress = EngineStepProgress()
    interval = progress_report_interval_s(120.0)

    def wire_bytes(report) -> int:
        return sum(len(memoryview(f)) for f in encoder.encode(EngineCoreOutputs(progress=report)))

    with progress.waiting_for_work():
        idle_bytes = wire_bytes(progress.report())
    with progress.step():
        busy_bytes = wire_bytes(progress.report())
        samples = []
        for _ in range(20_000):
            start = time.perf_counter()
            encoder.encode(EngineCoreOutputs(progress=progress.report()))
            samples.append(time.perf_counter() - start)
    per_report_us = statistics.median(samples) * 1e6
    per_hour = 3600 / interval
    print(f"report interval at the default timeout: {interval:.2f} s")
    print(f"one report on the wire: {busy_bytes} B in a step, {idle_bytes} B waiting for work")
    print(f"engine-side CPU per report (report() + encode): {per_report_us:.1f} us median of 20000")
    print(
        f"per API server and hour, engine with work: {per_hour:.0f} reports, "
        f"{per_hour * busy_bytes / 1024:.0f} KiB, {per_hour * per_report_us / 1e6 * 1e3:.1f} ms of CPU"
    )
    print(f"per API server and hour, engine waiting for work: at most 1 report ({idle_bytes} B) per idle period")


if __name__ == "__main__":
    main()
