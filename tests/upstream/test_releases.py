"""The series made for 0.33.0 against real earlier releases, downloaded from the package index.

The expected statuses were checked by hand (README, "Sample report"): route-sanitization is clean
because flashinfer_b12x_moe.py is byte-identical in 0.31.0, 0.32.0 and 0.33.0; the wrong-width
patch applies through a 3-way merge while PLEVocabParallelEmbedding.weight_loader was rewritten
between 0.32.0 and 0.33.0 (helpers moved into the class), so its target changed; byte-accounting
conflicts because the lines it replaces (`with set_current_vllm_config(vllm_config): return
backend_cls.customize_spec(spec).page_size_bytes`) do not exist in 0.32.0's interface.py.
0.30.0 adds dependency-API drift: it pins flashinfer-python 0.6.18.post1, whose B12xMoEWrapper
takes none of shared_static_workspace / shared_dynamic_workspace / shared_output, which the
workspace-reuse patch passes; the row names that whatever else it says (since route-sanitization
round 2 touches b12x.py too, route-sanitization applies with offsets on these releases and
workspace-reuse conflicts in flashinfer_b12x_moe.py). 0.31.0 and 0.32.0 pin
0.7.0.post1, whose wrapper lacks only expert_map (refresh, not resolve). On every one of them the
wrong-width patch merges while the n-gram patch that adds check_full_table_shape() does not: a
broken merge ("resolve"). The wrapper-capacity patch applies clean everywhere and is "refresh" for
the same wrapper API drift. The offload patch (its flush_timeout_s reaches the connector and its
documentation) and the progress check (the scaling middleware's paths) conflict on all three. The
round trip bumps the series to 0.32.0 and back. 0.29.0 has no
nvidia/ngram_embedding.py: the moved-target check finds the class in the ple_layer.py files.
These tests need the network (the index) and take a few minutes; tests/tool stays fast.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import git
import pytest

from vllm_overlay import bump, cli, series
from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import run as apply_run
from vllm_overlay.audit import review
from vllm_overlay.audit.decisions import store_reader
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

REPO = Path(__file__).resolve().parents[2]

LOADER_FULL = "loader-layouts/qwen4-exp-load-complete-ple-n-gram-tables-not-only-row.patch"
LOADER_WIDTH = "loader-layouts/qwen4-exp-reject-an-unsharded-ple-table-of-the-wrong-width.patch"
LOADER_DRAFT = "loader-layouts/model-loader-release-a-draft-s-unloaded-lm-head-before-post.patch"
ROUTES = "route-sanitization/fused-moe-keep-padding-routes-out-of-the-flashinfer-b12x-moe.patch"
CAPACITY = "route-sanitization/fused-moe-size-the-flashinfer-b12x-wrapper-for-all-gathered.patch"
WORKSPACE = "workspace-reuse/fused-moe-share-b12x-moe-wrapper-buffers-between-identical.patch"
LOADER_DTYPE = "loader-layouts/qwen4-exp-refuse-ple-checkpoint-tables-that-quantized.patch"
LOADER_ROWS = "loader-layouts/qwen4-exp-refuse-a-ple-table-whose-checkpoint-lacks-a-row.patch"
DRAFT_MOE = "moe-backend-fallback/fused-moe-let-an-unquantized-draft-moe-fall-back-from-the.patch"
BYTES = "byte-accounting/platforms-size-hybrid-kv-pages-by-the-bytes-each-layer-holds.patch"
OFFLOAD = "queue-event-ownership/simple-kv-offload-give-each-store-its-own-event-flush-queued.patch"
REPLIES = "queue-event-ownership/executor-keep-each-worker-reply-with-its-own-rpc.patch"
FAILURE = "queue-event-ownership/executor-send-worker-failures-ahead-of-other-ranks-replies.patch"
ASYNC_FAILURE = "queue-event-ownership/executor-send-worker-failures-ahead-of-stuck-async-outputs.patch"
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
# The offload patch's flush_timeout_s reaches the connector's __init__ (and its documentation).
OFFLOAD_TARGETS = OFFLOAD_INIT | {
    "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector:SimpleCPUOffloadConnector.__init__"
}
# The executor failure work is three patches; each reports the changed targets it names.
COLLECTIVE_RPC = {"vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc"}
ENQUEUE_OUTPUT = {"vllm.v1.executor.multiproc_executor:WorkerProc.enqueue_output"}
EXECUTOR_MORE = {
    "vllm.v1.executor.multiproc_executor:WorkerProc.ResponseStatus",
    "vllm.v1.executor.multiproc_executor:WorkerProc._execute_worker_rpc",
}
EXECUTOR = COLLECTIVE_RPC | ENQUEUE_OUTPUT | EXECUTOR_MORE
PROGRESS_TARGETS = {
    "vllm.v1.engine.core:DPEngineCoreProc.run_busy_loop",
    "vllm.v1.engine.core:EngineCoreProc.__init__",
    "vllm.v1.engine.core:EngineCoreProc._process_engine_step",
    "vllm.v1.engine.core_client:MPClient.__init__",
}
# The progress check also brackets utility calls and lets /health/progress through the scaling middleware.
PROGRESS_NOW = PROGRESS_TARGETS | {
    "vllm.v1.engine.core:EngineCoreProc._handle_client_request",
    "vllm.entrypoints.serve.elastic_ep.middleware:_SCALING_OBSERVABILITY_PATHS",
}
DTYPE_TARGETS = PLE_LOADER | {"vllm.models.qwen4_exp.nvidia.ngram_embedding:Qwen4ExpNGramEmbedding.load_weights"}
PLE_METHODS = "vllm.models.qwen4_exp.common.ngram_embedding:Qwen4ExpPLE{}EmbeddingMethod.process_weights_after_loading"
ROWS_TARGETS = DTYPE_TARGETS | {PLE_METHODS.format("NvFp4")}  # the NVFP4 method has no such hook before 0.33.0
# The draft patch's opt-in refusal (refuse_uninitialized_draft_weights) is a field of SpeculativeConfig,
# a class that differs in every earlier release.
SHARING = {
    "vllm.config.speculative:SpeculativeConfig",
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._maybe_share_embeddings",
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.load_model",
    "vllm.v1.worker.gpu.spec_decode.eagle.utils:load_eagle_model",
}
DRAFT_LOADERS = SHARING | {
    "vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
    "vllm.model_executor.model_loader.default_loader:DefaultModelLoader.load_weights",
    "vllm.v1.worker.gpu.spec_decode.dspark.utils:load_dspark_model",
}
UNQUANTIZED_ORACLE = {"vllm.model_executor.layers.fused_moe.oracle.unquantized:select_unquantized_moe_backend"}
B12X_INIT = {"vllm.model_executor.layers.fused_moe.b12x:B12xExperts.__init__"}
OLDER = {  # the rows 0.31.0 and 0.30.0 share
    LOADER_FULL: ("conflict", "resolve", ENGRAM),
    LOADER_WIDTH: ("merged-3way", "resolve", PLE_LOADER),
    LOADER_DTYPE: ("conflict", "resolve", DTYPE_TARGETS),
    LOADER_ROWS: ("conflict", "resolve", ROWS_TARGETS),
    LOADER_DRAFT: ("conflict", "resolve", DRAFT_LOADERS),
    ROUTES: ("offset", "refresh", B12X_INIT),
    CAPACITY: ("clean", "refresh", set()),  # refresh: flashinfer's wrapper API differs there
    WORKSPACE: ("clean", "refresh", set()),  # refresh: flashinfer's wrapper API differs there
    DRAFT_MOE: ("conflict", "resolve", UNQUANTIZED_ORACLE),
    BYTES: ("conflict", "resolve", ALIGN),
    REPLIES: ("conflict", "resolve", COLLECTIVE_RPC),
    # The failure patch reads an overflow payload whole in MessageQueue.dequeue, which differs before 0.32.0.
    FAILURE: (
        "conflict",
        "resolve",
        EXECUTOR | {"vllm.distributed.device_communicators.shm_broadcast:MessageQueue.dequeue"},
    ),
    ASYNC_FAILURE: ("conflict", "resolve", ENQUEUE_OUTPUT),
    PROGRESS: ("conflict", "resolve", PROGRESS_NOW | {"vllm.v1.engine:EngineCoreOutputs"}),
}
EXPECTED = {
    "0.30.0": {
        **OLDER,
        # 0.30.0 has no common/ngram_embedding.py (its PLE methods live in nvidia/ngram_embedding.py).
        LOADER_ROWS: ("target-missing", "resolve", ROWS_TARGETS | {PLE_METHODS.format("Fp8")}),
        LOADER_DRAFT: (
            "conflict",
            "resolve",
            DRAFT_LOADERS | {"vllm.v1.worker.gpu.spec_decode.dflash.utils:load_dflash_model"},
        ),
        OFFLOAD: (
            "conflict",
            "resolve",
            OFFLOAD_TARGETS | {"vllm.v1.simple_kv_offload.worker:SimpleCPUOffloadWorker.wait_for_save"},
        ),
    },
    "0.31.0": {**OLDER, OFFLOAD: ("conflict", "resolve", OFFLOAD_TARGETS)},
    "0.32.0": {
        LOADER_FULL: ("conflict", "resolve", ENGRAM),
        LOADER_WIDTH: ("merged-3way", "resolve", PLE_LOADER),
        LOADER_DTYPE: ("conflict", "resolve", DTYPE_TARGETS),
        LOADER_ROWS: ("conflict", "resolve", ROWS_TARGETS),
        LOADER_DRAFT: ("merged-3way", "refresh", SHARING),
        ROUTES: ("offset", "refresh", set()),
        CAPACITY: ("clean", "refresh", set()),
        WORKSPACE: ("clean", "refresh", set()),
        DRAFT_MOE: ("conflict", "resolve", UNQUANTIZED_ORACLE),
        BYTES: ("conflict", "resolve", ALIGN),
        OFFLOAD: ("conflict", "resolve", OFFLOAD_TARGETS),
        REPLIES: ("conflict", "resolve", COLLECTIVE_RPC),
        FAILURE: ("conflict", "resolve", EXECUTOR),
        ASYNC_FAILURE: ("conflict", "resolve", ENQUEUE_OUTPUT),
        PROGRESS: ("conflict", "resolve", PROGRESS_NOW),
    },
}

# Files a person must resolve in a conflict row (a 3-way merge still conflicts there), apart from
# those that merge. The n-gram rows of 0.32.0 were checked by hand with git apply --3way; the
# others are the audit's own answer for the current series, kept so a change shows.
RESOLVE_FILES = {
    "0.32.0": {
        LOADER_FULL: {
            "vllm/model_executor/model_loader/weight_utils.py",
            "vllm/models/qwen4_exp/nvidia/ngram_embedding.py",
        },
        BYTES: {"vllm/platforms/interface.py"},
        DRAFT_MOE: {"vllm/model_executor/layers/fused_moe/oracle/unquantized.py"},
    },
    "0.30.0": {
        PROGRESS: {
            "vllm/entrypoints/serve/elastic_ep/middleware.py",
            "vllm/v1/engine/__init__.py",
            "vllm/v1/engine/async_llm.py",
            "vllm/v1/engine/core.py",
            "vllm/v1/engine/core_client.py",
        },
        BYTES: {"vllm/platforms/interface.py"},
    },
}
MERGE_FILES = {
    "0.32.0": {LOADER_FULL: {"vllm/models/qwen4_exp/amd/ple_layer.py", "vllm/models/qwen4_exp/common/ple.py"}},
    "0.30.0": {
        PROGRESS: {
            "vllm/engine/protocol.py",
            "vllm/entrypoints/serve/instrumentator/metrics.py",
            "vllm/envs.py",
        }
    },
}
FLASHINFER_PIN = {"0.30.0": "0.6.18.post1", "0.31.0": "0.7.0.post1", "0.32.0": "0.7.0.post1"}
WORKSPACE_MISSING = {
    "0.30.0": ["expert_map", "shared_static_workspace", "shared_dynamic_workspace", "shared_output"],
    "0.31.0": ["expert_map"],
    "0.32.0": ["expert_map"],
}


def audit(version: str, tmp_path: Path) -> dict:
    out = tmp_path / f"audit-{version}.json"
    proc = subprocess.run(
        [str(REPO / "scripts" / "audit-upstream"), "--upstream", version, "--json", str(out),
         "--range-diff", str(tmp_path / "range-diff.txt")],
        capture_output=True,
        text=True,
        timeout=1800,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(out.read_text())


def changed_targets(row: dict) -> set[str]:
    """The targets an audit row reports as changed or removed since the locked release."""
    return {d.split(": ", 1)[0] for d in row["drift"] if ": changed" in d or ": removed" in d}


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_audit_against_real_release(version: str, tmp_path: Path) -> None:
    report = audit(version, tmp_path)
    assert report["new"]["version"] == version and report["new"]["kind"] == "release"
    assert len(report["new"]["sha256"]) == 64  # taken from the index, shown in the report
    rows = {row["patch"]: row for row in report["rows"]}
    assert set(rows) == set(EXPECTED[version])
    found = {name: (row["status"], row["decision"], changed_targets(row)) for name, row in rows.items()}
    # One comparison of every row, so a failure shows all the rows that moved, not only the first.
    assert {name: row for name, row in found.items() if row != EXPECTED[version][name]} == {}
    for name in EXPECTED[version]:
        row = rows[name]
        if row["status"] == "conflict":
            assert "does not apply" in row["reason"], name
            assert row["hunks"] and all({"file", "hunk", "line", "how"} <= set(h) for h in row["hunks"]), name
            failing = {h["file"] for h in row["hunks"]}
            assert failing == set(row["resolve_files"]) | set(row["merge_files"]), name
        if name in RESOLVE_FILES.get(version, {}):
            assert set(row["resolve_files"]) == RESOLVE_FILES[version][name], name
        if name in MERGE_FILES.get(version, {}):
            assert set(row["merge_files"]) == MERGE_FILES[version][name], name
    # The wrong-width patch merges, but calls what only the unapplied n-gram patch defines.
    assert any("self.check_full_table_shape is not defined" in n for n in rows[LOADER_WIDTH]["unresolved_names"])
    # Dependency-API drift names the dependency, both versions and the symbol.
    pin = FLASHINFER_PIN[version]
    init = next(d for d in rows[WORKSPACE]["dependency_drift"] if "B12xMoEWrapper.__init__" in d)
    assert init.startswith(f"flashinfer-python 0.7.2.post1 -> {pin}: flashinfer.fused_moe:B12xMoEWrapper.__init__ ")
    assert "B12xMoEWrapper.__init__ changed (" in init
    assert f"parameters missing there: {', '.join(WORKSPACE_MISSING[version])};" in init
    assert f"flashinfer-python 0.7.2.post1 -> {pin}" in rows[WORKSPACE]["reason"]
    assert report["seconds"]["total"] > 0
    range_diff = (tmp_path / "range-diff.txt").read_text()
    assert "fused_moe: keep out-of-range expert ids" in range_diff
    assert "did not apply on the new base; as on the old base:" in range_diff


def take_patch_side(path: Path) -> None:
    """Resolve every conflict region of a file by the patch's side (``=======`` .. ``>>>>>>>``)."""
    out, state = [], "both"
    for line in path.read_text().splitlines(keepends=True):
        if re.match(r"^<{7}( |$)", line):
            state = "ours"
        elif re.match(r"^\|{7}( |$)", line) and state == "ours":
            state = "base"
        elif re.match(r"^={7}$", line.rstrip("\n")) and state in ("ours", "base"):
            state = "theirs"
        elif re.match(r"^>{7}( |$)", line) and state == "theirs":
            state = "both"
        elif state in ("both", "theirs"):
            out.append(line)
    path.write_text("".join(out))


def snapshot(project: Path) -> dict[str, bytes]:
    """patches/ and upstream.lock, byte for byte."""
    files = {p.relative_to(project).as_posix(): p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}
    files["upstream.lock"] = (project / "upstream.lock").read_bytes()
    return files


def bump_through(project: Path, version: str, resolve) -> None:
    """scripts/bump VERSION --no-test, resolving every stop with ``resolve(repo, subject, files)``."""
    args = ["bump", "--project", str(project), "--no-test", "--allow-downgrade"]
    code = cli.main([*args, version])
    repo_dir = project / "build" / "bump"
    for _ in range(20):
        if code == 0:
            return
        repo = git.Repo(repo_dir)
        assert bump.am_in_progress(repo), "bump failed without stopping at a conflict"
        subject = (repo_dir / ".git" / "rebase-apply" / "final-commit").read_text().splitlines()[0]
        unmerged = repo.git.diff("--name-only", "--diff-filter=U").split()
        assert unmerged, f"{subject}: stopped without a file to resolve"
        resolve(repo, subject, unmerged)
        repo.git.add(*unmerged)
        code = cli.main([*args, "--continue"])
    raise AssertionError("bump did not finish")


def test_round_trip_to_an_older_release_and_back_is_byte_identical(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copytree(REPO / "patches", project / "patches")
    shutil.copy(REPO / "upstream.lock", project / "upstream.lock")
    before = snapshot(project)

    def there(repo: git.Repo, subject: str, files: list[str]) -> None:
        for name in files:
            take_patch_side(Path(repo.working_tree_dir) / name)

    stops = {"there": 0, "again": 0}

    def count(key):
        def resolve(repo: git.Repo, subject: str, files: list[str]) -> None:
            stops[key] += 1
            there(repo, subject, files)

        return resolve

    bump_through(project, "0.32.0", count("there"))
    assert 'version = "0.32.0"' in (project / "upstream.lock").read_text()
    assert bump.abort(project / "build" / "bump", project / "patches", project / "upstream.lock")
    # --abort put back what the bump replaced; bump again (recorded resolutions replay) and keep it.
    assert snapshot(project) == before
    bump_through(project, "0.32.0", count("again"))
    # Recorded resolutions replay (git rerere): the second bump needs no hand work at all.
    assert stops["there"] > 0 and stops["again"] == 0, stops
    shutil.rmtree(project / "build" / "bump")

    # On the way back every conflict is resolved with the file as the original series has it.
    the_lock = lock.load(REPO / "upstream.lock")
    store = Store()
    locked = upstream_trees.obtain(None, the_lock, store)
    original = tmp_path / "original"
    report = apply_run.apply_series(
        series.load_series(REPO / "patches"), locked,
        store, original, apply.Options(),
    )  # fmt: skip
    assert report.ok
    by_subject = {r.subject: r.commit for r in report.results}
    original_repo = git.Repo(original)

    def back(repo: git.Repo, subject: str, files: list[str]) -> None:
        commit = by_subject[subject]
        for name in files:
            data = original_repo.git.show(f"{commit}:{name}", stdout_as_string=False, strip_newline_in_stdout=False)
            (Path(repo.working_tree_dir) / name).write_bytes(data)

    bump_through(project, "0.33.0", back)
    assert snapshot(project) == before


def test_moved_target_is_located_in_0_29_0() -> None:
    """0.29.0 has no nvidia/ngram_embedding.py: the n-gram patch's target class lives in ple_layer.py."""
    the_lock = lock.load(REPO / "upstream.lock")
    store = Store()
    old, new = upstream_trees.obtain(None, the_lock, store), upstream_trees.obtain("0.29.0", the_lock, store)
    repo = git.Repo(store.upstreams_git)
    patch = next(p for p in series.load_series(REPO / "patches") if p.name == LOADER_FULL)
    moved = review.moved_targets(repo, new.commit, patch, store_reader(repo, new.commit),
                                 store_reader(repo, old.commit))  # fmt: skip
    assert moved == [
        "Qwen4ExpNGramEmbedding.load_weights is in vllm/models/qwen4_exp/amd/ple_layer.py, "
        "vllm/models/qwen4_exp/nvidia/ple_layer.py there"
    ]
