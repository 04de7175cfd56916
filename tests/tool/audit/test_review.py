"""audit-upstream findings: files to resolve vs files that merge, broken merges, moved targets."""

from __future__ import annotations

import json

from tests.tool.helpers.repos import replace_line, retarget, write_upstream
from vllm_overlay import cli
from vllm_overlay.audit import review, session

ENGINE = "class Engine:\n    def step(self, x):\n        return x + 1\n\n    def other(self):\n        return 0\n"
MOVER = "class Mover:\n    def run(self):\n        return 1\n"


def add_helper(tree):
    replace_line(
        tree / "vllm" / "engine.py",
        "        return 0\n",
        "        return 0\n\n    def helper(self):\n        return 7\n",
    )
    replace_line(tree / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 200\n")
    with open(tree / "vllm" / "engine.py", "a") as handle:
        handle.write("\n\ndef lookup(x):\n    return x\n")


def use_helper(tree):
    replace_line(tree / "vllm" / "engine.py", "return x + 1\n", "return x + self.helper() + lookup(x)\n")


def touch_mover(tree):
    replace_line(tree / "vllm" / "gone.py", "return 1\n", "return 2\n")


def test_audit_findings(project, make_patch, tmp_path, store_env):
    old = write_upstream(tmp_path / "old", extra={"vllm/engine.py": ENGINE, "vllm/gone.py": MOVER})
    make_patch(old, add_helper, "add helper")
    make_patch(old, use_helper, "use helper")
    retarget(make_patch(old, touch_mover, "touch mover"), "vllm.gone:Mover.run")
    new = write_upstream(tmp_path / "new", extra={"vllm/engine.py": ENGINE.replace("return 0", "return 5")})
    (new / "vllm" / "moved").mkdir()
    (new / "vllm" / "moved" / "place.py").write_text("import os\n\n\n" + MOVER)
    # Two lines above the patched line: plain apply fails on the context, a 3-way merge succeeds.
    replace_line(new / "vllm" / "core.py", "line_18 = 18\n", "line_18 = 18  # upstream\n")
    out = tmp_path / "audit.json"
    code = cli.main(
        ["audit-upstream", "--project", str(project), "--from", str(old), "--upstream", str(new), "--offline",
         "--json", str(out), "--range-diff", str(tmp_path / "rd.txt")]
    )  # fmt: skip
    assert code == 1
    rows = {row["patch"].split("/")[1]: row for row in json.loads(out.read_text())["rows"]}

    conflict = rows["add-helper.patch"]
    assert (conflict["status"], conflict["decision"]) == ("conflict", "resolve")
    assert list(conflict["resolve_files"]) == ["vllm/engine.py"], conflict["reason"]
    assert conflict["resolve_files"]["vllm/engine.py"], conflict["reason"]  # the conflict regions' lines
    assert conflict["merge_files"] == ["vllm/core.py"]
    hows = {(h["file"], h["hunk"]): h["how"] for h in conflict["hunks"]}
    assert hows[("vllm/engine.py", 1)] == "does not apply; conflicts in a 3-way merge"
    assert hows[("vllm/core.py", 1)] == "does not apply; merges in a 3-way merge"
    assert conflict["reason"].startswith("conflict: resolve vllm/engine.py (conflict at line ")
    assert "merge in 3-way: vllm/core.py" in conflict["reason"]

    broken = rows["use-helper.patch"]
    assert broken["status"] in ("clean", "offset", "merged-3way") and broken["decision"] == "resolve"
    found = "\n".join(broken["unresolved_names"])
    assert "vllm/engine.py:3: self.helper is not defined by Engine here" in found
    assert "vllm/engine.py:3: undefined name 'lookup'" in found
    assert "self.x" not in found and "'x'" not in found

    moved = rows["touch-mover.patch"]
    assert moved["status"] == "target-missing" and moved["decision"] == "resolve"
    assert moved["moved_targets"] == ["Mover.run is in vllm/moved/place.py there"]
    assert "Mover.run is in vllm/moved/place.py there" in moved["reason"]

    range_diff = (tmp_path / "rd.txt").read_text()
    skipped = range_diff.split("add helper", 1)[1]
    assert skipped.lstrip("\n").startswith("    did not apply on the new base; as on the old base:")
    assert "+    def helper(self):" in skipped.split("use helper")[0]
    use_row = next(
        line for line in range_diff.splitlines() if session.RANGE_DIFF_ROW_RE.match(line) and "use helper" in line
    )
    assert "!" in use_row and use_row.endswith("[context only]"), range_diff


def test_markdown_summarises_and_json_lists_every_hunk():
    hunks = [review.Hunk(f"vllm/f{i}.py", 1, 10 * i, "does not apply; merges in a 3-way merge") for i in range(5)]
    report = review.ConflictReport({"vllm/x.py": [12, 40]}, [h.file for h in hunks], hunks)
    full, short = review.summary(report), review.summary(report, limit=3)
    assert all(str(h) in full for h in hunks) and "more" not in full
    assert short.endswith("vllm/f2.py hunk #1 (line 20): does not apply; merges in a 3-way merge; and 2 more")
    assert short.startswith("resolve vllm/x.py (conflict at line 12, 40); merge in 3-way: vllm/f0.py")
