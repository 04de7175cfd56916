"""apply-patches as a test runs it: the CLI's exit code and JSON report."""

from __future__ import annotations

import json
from pathlib import Path

import git

from vllm_overlay import cli
from vllm_overlay.apply import engine as apply
from vllm_overlay.apply import run as apply_run
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees


def run_apply(project: Path, upstream: Path, *extra: str, base: Path | None = None) -> tuple[int, dict]:
    """apply-patches onto ``upstream``; ``base`` is the tree the patches were made on (default: the same)."""
    report = project / "report.json"
    code = cli.main(
        [
            "apply-patches",
            "--project",
            str(project),
            "--upstream",
            str(upstream),
            "--base-upstream",
            str(base or upstream),
            "--json",
            str(report),
            *extra,
        ]
    )
    return code, json.loads(report.read_text())


def statuses(report: dict) -> list[str]:
    return [p["status"] for p in report["patches"]]


def apply_no_patches(project: Path, upstream: Path) -> None:
    """build/patched as the pristine upstream: apply-patches refuses an empty series, the engine does not."""
    store = Store()
    up = upstream_trees.obtain(str(upstream), lock.load(project / "upstream.lock"), store)
    result = apply_run.apply_series([], up, store, project / "build/patched", apply.Options())
    assert result.ok


def apply_json(project: Path, upstream: Path, output: Path, *extra: str) -> dict:
    """apply-patches of ``upstream`` into ``output``: its JSON report, with the exit code as ``code``."""
    report = project / "report.json"
    where = ["--project", str(project), "--upstream", str(upstream), "-o", str(output)]
    code = cli.main(["apply-patches", *where, "--json", str(report), *extra])
    data = json.loads(report.read_text())
    data["code"] = code
    return data


def apply_locked(project: Path, index: str, output: Path, *extra: str) -> dict:
    """apply-patches of the locked upstream (no --upstream): the run a record may answer alone."""
    report = project / "report.json"
    where = ["--project", str(project), "--index-url", index, "-o", str(output)]
    code = cli.main(["apply-patches", *where, "--json", str(report), *extra])
    data = json.loads(report.read_text())
    data["code"] = code
    return data


def apply_code(project, upstream_dir) -> int:
    """apply-patches of ``upstream_dir`` into the project's build/patched: its exit code."""
    where = ["--project", str(project), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    return cli.main(["apply-patches", *where])


def patched_head(project) -> str:
    """The commit build/patched holds."""
    return git.Repo(project / "build" / "patched").head.commit.hexsha
