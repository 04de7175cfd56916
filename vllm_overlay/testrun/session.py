"""One run of the per-patch tests over an applied series: trees, plan, jobs, report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from vllm_overlay.store import Store
from vllm_overlay.testrun.execute import Config, base_environment
from vllm_overlay.testrun.outcome import RunReport
from vllm_overlay.testrun.plan import Planner
from vllm_overlay.testrun.runner import Runner
from vllm_overlay.testrun.trees import Trees
from vllm_overlay.testrun.verdict_store import VerdictStore, scope_name


def run_series(
    *,
    project_root: Path,
    workdir: Path,
    patched_repo: Path,
    upstream_commit: str,
    patch_commits: list[tuple[object, str]],  # (series.Patch, commit) for every applied patch, in order
    selected: list[str],
    python: Path,
    env_key: str | None,
    installed_package: Path,
    store: Store,
    config: Config,
    tool_python: Path | None,
    info: Callable[[str], None],
) -> RunReport:
    started = time.monotonic()
    trees = Trees(workdir, patched_repo, upstream_commit, [c for _, c in patch_commits], installed_package)
    verdicts = VerdictStore(store, scope_name(env_key, python), enabled=config.use_cache)
    plan = Planner(
        project_root=project_root,
        workdir=workdir,
        trees=trees,
        patches=[p for p, _ in patch_commits],
        selected=selected,
        python=python,
        tool_python=tool_python,
        verdicts=verdicts,
        config=config,
    ).plan()
    shadow_steps = sorted({job.step for job in plan.jobs if job.pythonpath is not None})
    if shadow_steps:
        trees.check_shadow(python, project_root, shadow_steps[-1])
    stored = sum(1 for outcome in plan.outcomes for unit in outcome.units if unit.result is not None)
    info(
        f"{stored} result(s) from the verdict store {verdicts.root}"
        + ("" if config.use_cache else " (--no-cache: none read)")
        + f"; {len(plan.jobs)} pytest process(es) to run, {len(shadow_steps)} step(s) laid over "
        f"{installed_package} in {time.monotonic() - started:.1f}s"
    )
    base_env = base_environment(config.jobs)
    base_env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(workdir / "hypothesis")
    setup = time.monotonic() - started
    report = Runner(plan, verdicts, config, info).execute(base_env)
    report.setup_seconds = setup
    return report
