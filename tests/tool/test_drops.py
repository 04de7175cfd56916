"""The drop step's parts: which patches leave, where their tests go, and the headers of those that stay."""

from __future__ import annotations

from tests.tool.helpers.repos import change_line_20, replace_line, write_upstream
from vllm_overlay import drops, series
from vllm_overlay.audit.lines import LineCheck


def checks(locked: bool, cpu: bool | None) -> list[LineCheck]:
    cpu_check = LineCheck("cpu", "0.33.0", carried=cpu is not None, has_it=bool(cpu))
    return [LineCheck("locked", "0.34.0", carried=True, has_it=locked), cpu_check]


def test_the_plan_drops_what_every_carrying_line_has_and_holds_the_rest():
    plan = drops.DropPlan(
        "0.34.0",
        {
            "a/both.patch": checks(True, True),
            "a/locked-only.patch": checks(True, False),
            "a/cpu-lacks-it.patch": checks(True, None),
            "a/neither.patch": checks(False, False),
        },
    )
    assert plan.drop == ["a/both.patch", "a/cpu-lacks-it.patch"]
    assert plan.held == ["a/locked-only.patch"]


def test_a_test_a_remaining_patch_lists_stays(project, make_patch, tmp_path):
    old = write_upstream(tmp_path / "old")
    make_patch(old, change_line_20, "first")
    patch = series.load_series(project / "patches")[0]
    listed = "tests/patches/demo/test_demo.py"
    assert drops._move_tests(project, patch, {listed}) == [listed]
    assert (project / listed).is_file()
    assert drops._move_tests(project, patch, set()) == ["tests/upstream-behaviour/demo/test_demo.py"]
    assert not (project / listed).exists() and (project / "tests/upstream-behaviour/demo/test_demo.py").is_file()


def test_trailers_replace_a_folded_forwarded_and_the_patch_still_parses(project, make_patch, tmp_path):
    old = write_upstream(tmp_path / "old")
    make_patch(old, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "five")
    path = project / "patches" / "demo" / "five.patch"
    before = series.load_patch(project / "patches", "demo/five.patch")
    drops.set_trailers(path, {"Applied-Upstream": "0.34.0 (locked line)", "Forwarded": "not-needed (cpu 0.33.0)"})
    after = series.load_patch(project / "patches", "demo/five.patch")
    assert after.values("Forwarded") == ["not-needed (cpu 0.33.0)"]
    assert after.value("Applied-Upstream") == "0.34.0 (locked line)"
    assert after.value("Series") == before.value("Series") and after.diff.modified_files[0].path == "vllm/core.py"
