"""The drop rule across carried lines: a fix upstream on one line only keeps the patch."""

from __future__ import annotations

import json
import shutil

from tests.tool.helpers.repos import replace_line, write_upstream
from vllm_overlay import cli
from vllm_overlay.audit import lines


def carry_on_cpu(project):
    """A CPU carry beside the locked series: the same lock and the same patches (as a fresh carry has)."""
    (project / "cpu").mkdir()
    shutil.copy(project / "upstream.lock", project / "cpu" / "upstream.lock")
    shutil.copytree(project / "patches", project / "cpu" / "patches")


def landed(tree, *numbers):
    for number in numbers:
        replace_line(tree / "vllm" / "core.py", f"line_{number} = {number}\n", f"line_{number} = {number}0\n")
    return tree


def test_a_fix_on_one_line_only_is_kept_and_on_every_line_dropped(project, make_patch, tmp_path, store_env):
    old = write_upstream(tmp_path / "old")
    make_patch(old, lambda t: landed(t, 35), "everywhere")
    make_patch(old, lambda t: landed(t, 10), "locked only")
    carry_on_cpu(project)
    new = landed(write_upstream(tmp_path / "new"), 35, 10)  # the locked line's next release has both fixes
    cpu_new = landed(write_upstream(tmp_path / "cpu-new"), 35)  # the CPU line's upstream has only one
    out = tmp_path / "audit.json"
    args = ["audit-upstream", "--project", str(project), "--from", str(old), "--upstream", str(new), "--offline"]
    code = cli.main(
        [*args, "--line-upstream", f"cpu={cpu_new}", "--json", str(out), "--markdown", str(tmp_path / "a.md")]
    )
    assert code == 1
    audit = json.loads(out.read_text())
    rows = {row["patch"]: row for row in audit["rows"]}
    everywhere, locked_only = rows["demo/everywhere.patch"], rows["demo/locked-only.patch"]
    assert everywhere["status"] == locked_only["status"] == "already-upstream"
    assert everywhere["decision"] == "drop"
    assert [line.split(":")[-1] for line in everywhere["lines"]] == [" has it", " has it"]
    assert locked_only["decision"] == "keep"
    assert locked_only["lines"][0].endswith(": has it") and locked_only["lines"][1].startswith("cpu ")
    assert locked_only["lines"][1].endswith(": lacks it")
    assert "-> keep: kept until every carried line has the fix" in locked_only["reason"]
    assert set(audit["lines"]) == {"locked", "cpu"}
    assert "Carried lines checked" in (tmp_path / "a.md").read_text()


def test_without_a_cpu_carry_the_locked_line_decides(project, make_patch, tmp_path, store_env):
    old = write_upstream(tmp_path / "old")
    make_patch(old, lambda t: landed(t, 35), "everywhere")
    new = landed(write_upstream(tmp_path / "new"), 35)
    out = tmp_path / "audit.json"
    args = ["audit-upstream", "--project", str(project), "--from", str(old), "--upstream", str(new), "--offline"]
    assert cli.main([*args, "--json", str(out)]) == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert row["decision"] == "drop" and len(row["lines"]) == 1 and row["lines"][0].endswith(": has it")
    assert [line.name for line in lines.carried_lines(project)] == ["locked"]


def test_a_patch_the_cpu_line_does_not_carry_does_not_hold_the_drop():
    checks = [
        lines.LineCheck("locked", "0.34.0", carried=True, has_it=True),
        lines.LineCheck("cpu", "0.33.0", carried=False, has_it=False),
    ]
    assert lines.every_line_has_it(checks)
    assert lines.verdict(checks) == "locked 0.34.0: has it / cpu 0.33.0: does not carry it -> drop"
    assert not lines.every_line_has_it([lines.LineCheck("cpu", "0.33.0", carried=False, has_it=False)])


def test_an_unknown_line_is_an_input_error(project, tmp_path, store_env):
    code = cli.main(["audit-upstream", "--project", str(project), "--upstream", "x", "--line-upstream", "gpu=1.0"])
    assert code == 2
