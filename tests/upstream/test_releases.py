"""The series made for 0.33.0 against real earlier releases, downloaded from the package index.

The expected statuses were checked by hand (README, "Sample report"): route-sanitization is clean
because flashinfer_b12x_moe.py is byte-identical in 0.31.0, 0.32.0 and 0.33.0; the wrong-width
patch applies through a 3-way merge while PLEVocabParallelEmbedding.weight_loader was rewritten
between 0.32.0 and 0.33.0 (helpers moved into the class), so its target changed; byte-accounting
conflicts because the lines it replaces (`with set_current_vllm_config(vllm_config): return
backend_cls.customize_spec(spec).page_size_bytes`) do not exist in 0.32.0's interface.py.
These tests need the network (the index) and take a few minutes; tests/tool stays fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LOADER_FULL = "loader-layouts/qwen4-exp-load-complete-ple-n-gram-tables-not-only-row.patch"
LOADER_WIDTH = "loader-layouts/qwen4-exp-reject-an-unsharded-ple-table-of-the-wrong-width.patch"
LOADER_DRAFT = "loader-layouts/model-loader-release-a-draft-s-unloaded-lm-head-before-post.patch"
ROUTES = "route-sanitization/fused-moe-keep-padding-routes-out-of-the-flashinfer-b12x-moe.patch"
WORKSPACE = "workspace-reuse/fused-moe-share-b12x-moe-wrapper-buffers-between-identical.patch"
DRAFT_MOE = "workspace-reuse/fused-moe-let-an-unquantized-draft-moe-fall-back-from-the.patch"
BYTES = "byte-accounting/platforms-size-hybrid-kv-pages-by-the-bytes-each-layer-holds.patch"
OFFLOAD = "queue-event-ownership/simple-kv-offload-give-each-store-its-own-event-flush-queued.patch"
FAILURE = "queue-event-ownership/executor-send-worker-failures-ahead-of-stuck-async-outputs.patch"
PROGRESS = "queue-event-ownership/health-add-a-progress-check-that-fails-when-active-work.patch"

# (status, decision, Targets reported as changed since 0.33.0, by AST)
ENGRAM = {
    "vllm.model_executor.model_loader.weight_utils:_ENGRAM_WEIGHT_RE",
    "vllm.models.qwen4_exp.nvidia.ngram_embedding:Qwen4ExpNGramEmbedding.load_weights",
}
PLE_LOADER = {"vllm.models.qwen4_exp.common.ple:PLEVocabParallelEmbedding.weight_loader"}
ALIGN = {
    "vllm.platforms.interface:Platform._align_heterogeneous_kv_block_size",
    "vllm.platforms.interface:Platform._align_hybrid_block_size",
}
OFFLOAD_INIT = {"vllm.v1.simple_kv_offload.worker:SimpleCPUOffloadWorker.__init__"}
EXECUTOR = {
    "vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc",
    "vllm.v1.executor.multiproc_executor:WorkerProc.ResponseStatus",
    "vllm.v1.executor.multiproc_executor:WorkerProc.enqueue_output",
    "vllm.v1.executor.multiproc_executor:WorkerProc._execute_worker_rpc",
}
OUTPUT_HANDLER = {"vllm.v1.engine.async_llm:AsyncLLM._run_output_handler"}
UNQUANTIZED_ORACLE = {"vllm.model_executor.layers.fused_moe.oracle.unquantized:select_unquantized_moe_backend"}
EXPECTED = {
    "0.32.0": {
        LOADER_FULL: ("conflict", "resolve", ENGRAM),
        LOADER_WIDTH: ("merged-3way", "refresh", PLE_LOADER),
        LOADER_DRAFT: ("clean", "keep", set()),
        ROUTES: ("clean", "keep", set()),
        WORKSPACE: ("clean", "keep", set()),
        DRAFT_MOE: ("conflict", "resolve", UNQUANTIZED_ORACLE),
        BYTES: ("conflict", "resolve", ALIGN),
        OFFLOAD: ("offset", "refresh", OFFLOAD_INIT),
        FAILURE: ("conflict", "resolve", EXECUTOR),
        PROGRESS: ("merged-3way", "refresh", OUTPUT_HANDLER),
    },
    "0.31.0": {
        LOADER_FULL: ("conflict", "resolve", ENGRAM),
        LOADER_WIDTH: ("merged-3way", "refresh", PLE_LOADER),
        LOADER_DRAFT: (
            "merged-3way",
            "refresh",
            {"vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model"},
        ),
        ROUTES: ("clean", "keep", set()),
        WORKSPACE: ("clean", "keep", set()),
        DRAFT_MOE: ("conflict", "resolve", UNQUANTIZED_ORACLE),
        BYTES: ("conflict", "resolve", ALIGN),
        OFFLOAD: ("offset", "refresh", OFFLOAD_INIT),
        FAILURE: ("conflict", "resolve", EXECUTOR),
        PROGRESS: ("conflict", "resolve", OUTPUT_HANDLER),
    },
}


def audit(version: str, tmp_path: Path) -> dict:
    out = tmp_path / f"audit-{version}.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "audit-upstream"), "--upstream", version, "--json", str(out),
         "--range-diff", str(tmp_path / "range-diff.txt")],
        capture_output=True,
        text=True,
        timeout=1800,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_audit_against_real_release(version: str, tmp_path: Path) -> None:
    report = audit(version, tmp_path)
    assert report["new"]["version"] == version and report["new"]["kind"] == "release"
    assert len(report["new"]["sha256"]) == 64  # taken from the index, shown in the report
    rows = {row["patch"]: row for row in report["rows"]}
    assert set(rows) == set(EXPECTED[version])
    for name, (status, decision, changed) in EXPECTED[version].items():
        row = rows[name]
        assert (row["status"], row["decision"]) == (status, decision), name
        reported = {d.split(": ", 1)[0] for d in row["drift"] if ": changed" in d or ": removed" in d}
        assert reported == changed, name
        if decision == "resolve":
            assert "does not apply" in row["reason"], name
    range_diff = (tmp_path / "range-diff.txt").read_text()
    assert "fused_moe: keep padding routes" in range_diff
