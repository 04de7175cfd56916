"""testrun.plan: the units a run needs, which the verdict store already holds, and the pytest jobs for the rest.

A real two-patch series (made with git by the make_patch fixture), its real steps (Trees over that
repository, shadows of a fake installed vllm) and a real verdict store in a temporary cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.tool.helpers.installs import make_installed
from tests.tool.helpers.repos import PatchMaker, change_line_20, git, replace_line, write_upstream
from vllm_overlay import series
from vllm_overlay.junit import Case
from vllm_overlay.store import Store
from vllm_overlay.testrun import plan as planning
from vllm_overlay.testrun.execute import Config
from vllm_overlay.testrun.outcome import Unit
from vllm_overlay.testrun.trees import Trees
from vllm_overlay.testrun.verdict_store import VerdictStore
from vllm_overlay.testrun.verdicts import Result

TESTS = "tests/patches/demo/test_demo.py"
UPSTREAM_TESTS = "tests/test_demo_upstream.py"
FIRST, SECOND = "demo/change-line-20.patch", "demo/change-line-5.patch"


@pytest.fixture
def series_setup(tmp_path: Path, project: Path, make_patch: PatchMaker, store_env: Path) -> dict:
    upstream = write_upstream(tmp_path / "up", extra={UPSTREAM_TESTS: "def test_u():\n    assert True\n"})
    make_patch(upstream, change_line_20, "Change line 20")
    make_patch(
        upstream, lambda root: replace_line(root / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "Change line 5"
    )
    repo = tmp_path / "patchwork"
    upstream_commit, *commits = git(repo, "rev-list", "--reverse", "HEAD").split()
    return {
        "project": project,
        "workdir": tmp_path / "work",
        "trees": Trees(tmp_path / "work", repo, upstream_commit, commits, make_installed(tmp_path / "site")),
        "patches": series.load_series(project / "patches"),
        "verdicts": VerdictStore(Store(), "test-scope"),
    }


def _planner(setup: dict, selected: list[str]) -> planning.Planner:
    return planning.Planner(
        project_root=setup["project"],
        workdir=setup["workdir"],
        trees=setup["trees"],
        patches=setup["patches"],
        selected=selected,
        python=Path(sys.executable),
        tool_python=None,
        verdicts=setup["verdicts"],
        config=Config(tool_tests=False),
    )


def test_units_of_equal_keys_are_one_and_each_step_costs_one_process(series_setup: dict) -> None:
    made = _planner(series_setup, [FIRST, SECOND]).plan()
    first, second = made.outcomes
    assert (first.step, second.step, first.tests, first.upstream_tests) == (1, 2, [TESTS], [UPSTREAM_TESTS])
    assert first.green_units[0] is second.red_units[0]  # patch 1's green is patch 2's red: the same tree, same file
    assert first.baseline_units[0] is second.baseline_units[0]  # one pristine baseline per Upstream-Test
    assert first.upstream_unit is not second.upstream_unit
    assert [(j.kind, j.step, j.targets) for j in made.jobs] == [
        ("tests", 0, [TESTS]),
        ("tests", 1, [TESTS]),
        ("baseline", 0, [UPSTREAM_TESTS]),
        ("upstream", 1, [UPSTREAM_TESTS]),
        ("tests", 2, [TESTS]),
        ("upstream", 2, [UPSTREAM_TESTS]),
        ("final", 2, [TESTS]),
    ]
    names = [j.log.name for j in made.jobs]
    assert names[:2] == [
        "01-tests-step000-red_demo-change-line-20.log",
        "02-tests-step001-red_demo-change-line-5,_green_demo-change-line-20.log",
    ]
    assert all(j.junit_file.parent == series_setup["workdir"] / "junit" for j in made.jobs)
    assert {id(u) for u in made.units_of(made.jobs[1])} == {id(first.green_units[0])}
    assert made.final is not None and made.final.job is made.jobs[-1] and made.tool is None


def test_jobs_run_where_their_tests_are(series_setup: dict) -> None:
    made = _planner(series_setup, [FIRST, SECOND]).plan()
    trees: Trees = series_setup["trees"]
    by_kind = {(j.kind, j.step): j for j in made.jobs}
    assert by_kind[("tests", 1)].cwd == series_setup["project"]
    assert by_kind[("baseline", 0)].cwd == trees.upstream_tests(0)
    assert (by_kind[("baseline", 0)].cwd / UPSTREAM_TESTS).is_file()
    shadow = by_kind[("upstream", 2)].pythonpath
    assert shadow == trees.step(2).shadow
    assert "line_5 = 50" in (shadow / "vllm" / "core.py").read_text()  # the step's patched file in its shadow
    assert all(j.python == Path(sys.executable) for j in made.jobs)


def test_results_in_the_verdict_store_need_no_job(series_setup: dict) -> None:
    made = _planner(series_setup, [FIRST, SECOND]).plan()
    store: VerdictStore = series_setup["verdicts"]
    units = {id(u): u for o in made.outcomes for u in o.units}
    for unit in [*units.values(), made.final]:
        assert unit is not None
        case_id = f"{unit.specs[0]}::test_x"
        assert store.save(unit.key, Result(0, False, {case_id: Case(case_id, unit.specs[0], "passed")}), unit.what)
    again = _planner(series_setup, [FIRST, SECOND]).plan()
    assert again.jobs == []
    assert all(u.result is not None and u.result.cached and u.job is None for o in again.outcomes for u in o.units)
    assert [u.key for o in again.outcomes for u in o.units] == [u.key for o in made.outcomes for u in o.units]


def test_a_selection_plans_only_its_patches(series_setup: dict) -> None:
    made = _planner(series_setup, [SECOND]).plan()
    (only,) = made.outcomes
    assert only.name == SECOND and only.step == 2
    assert [(j.kind, j.step) for j in made.jobs] == [
        ("tests", 1),
        ("tests", 2),
        ("baseline", 0),
        ("upstream", 2),
        ("final", 2),
    ]


def _unit(*specs: str) -> Unit:
    return Unit("tests", 1, list(specs), "|".join(specs), {})


def test_files_of_one_basename_in_two_folders_never_share_a_process() -> None:
    a, b = _unit("tests/patches/a/test_demo.py"), _unit("tests/patches/b/test_demo.py")
    a2, c = _unit("tests/patches/a/test_demo.py::test_one"), _unit("tests/patches/c/test_other.py")
    groups = planning._importable_together([a, b, a2, c])
    assert [[u.specs[0] for u in group] for group in groups] == [
        ["tests/patches/a/test_demo.py", "tests/patches/a/test_demo.py::test_one", "tests/patches/c/test_other.py"],
        ["tests/patches/b/test_demo.py"],
    ]
    assert planning._importable_together([]) == []


ORACLE = "tests/patches/demo/oracle_demo.py"


def test_a_series_oracle_runs_on_its_last_patch_with_its_profile_and_database(series_setup: dict) -> None:
    (series_setup["project"] / ORACLE).write_text("def test_o():\n    assert True\n")
    planner = _planner(series_setup, [FIRST, SECOND])
    planner.config = Config(tool_tests=False, oracle_db=Path("/cache/oracle-examples"))
    made = planner.plan()
    assert list(made.oracles) == ["demo"]
    oracle = made.oracles["demo"]
    assert (oracle.kind, oracle.step, oracle.specs) == ("oracle", 2, [ORACLE])
    (job,) = [j for j in made.jobs if j.kind == "oracle"]
    assert made.jobs[-1] is job and job.step == 2 and job.targets == [ORACLE]
    assert not job.timeout_flag  # it bounds its own waits; one hypothesis test outlasts a per-test timeout
    assert job.env == {
        "VLLM_OVERLAY_ORACLE_PROFILE": "ci",
        "VLLM_OVERLAY_ORACLE_DB": "/cache/oracle-examples/demo",
    }
    planner = _planner(series_setup, [FIRST, SECOND])
    planner.config = Config(tool_tests=False, oracle_profile="deep")
    deep = planner.plan().oracles["demo"]
    assert deep.key != oracle.key  # a deep run's verdict never answers for the fixed budget, nor back


def test_no_oracle_until_the_series_last_patch_is_selected(series_setup: dict) -> None:
    (series_setup["project"] / ORACLE).write_text("def test_o():\n    assert True\n")
    assert _planner(series_setup, [FIRST]).plan().oracles == {}
    assert list(_planner(series_setup, [SECOND]).plan().oracles) == ["demo"]


def test_a_series_without_oracle_files_has_none(series_setup: dict) -> None:
    assert _planner(series_setup, [FIRST, SECOND]).plan().oracles == {}
