"""report: the apply table people read, the JSON machines read, and report paths proved writable first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import PatchMaker, change_line_20, replace_line, write_upstream
from vllm_overlay import report
from vllm_overlay.apply.classify import HunkNote, PatchResult, Status
from vllm_overlay.apply.engine import Report
from vllm_overlay.errors import InputError
from vllm_overlay.upstream.trees import Upstream

UPSTREAM = Upstream(
    kind="release",
    label="0.33.0",
    tag="upstream/0.33.0",
    commit="c0ffee",
    version="0.33.0",
    release_commit="abc123",
    sha256="5" * 64,
    origin="an index",
)


def _result(name: str, status: Status, accepted: bool, **extra: object) -> PatchResult:
    return PatchResult(name=name, series=name.split("/")[0], subject=name, status=status, accepted=accepted, **extra)


def test_table_lists_each_patch_with_its_mark_status_notes_and_warnings() -> None:
    results = [
        _result("demo/a.patch", Status.CLEAN, True, detail="never shown for clean"),
        _result(
            "demo/longer-name.patch",
            Status.OFFSET,
            False,
            detail="shifted",
            hunks=[HunkNote("vllm/core.py", 1, 17, "offset +5")],
            warnings=["Targets names nothing"],
        ),
    ]
    text = report.apply_table(Report(UPSTREAM, "/out/patched", results, published=False))
    assert text.splitlines() == [
        f"upstream: 0.33.0 (release; release commit abc123; sdist sha256 {'5' * 64})",
        "  ok clean             demo/a.patch          ",
        "  NO offset            demo/longer-name.patch",
        "      shifted",
        "      vllm/core.py hunk #1 (line 17): offset +5",
        "      warning: Targets names nothing",
        "1/2 patches accepted; nothing written to /out/patched "
        "(see the statuses above; --allow-offset, --allow-fuzz and --3way widen what is accepted)",
    ]


def test_table_says_published_or_unchanged_and_marks_unknown_commits() -> None:
    bare = Upstream("directory", "dir-x", "t", "c", None, None, None, "/src")
    results = [_result("s/a.patch", Status.MERGED_3WAY, True, detail="applies through a 3-way merge")]
    published = report.apply_table(Report(bare, "/o", results, published=True)).splitlines()
    assert published[0] == "upstream: dir-x (directory; release commit ?)"
    assert published[2] == "      applies through a 3-way merge"
    assert published[-1] == "1/1 patches applied; patched tree: /o"
    unchanged = report.apply_table(Report(bare, "/o", results, published=True, unchanged=True)).splitlines()[-1]
    assert (
        unchanged.startswith("1/1 patches applied; patched tree: /o (unchanged: same lock")
        and "nothing rebuilt" in unchanged
    )
    empty = report.apply_table(Report(bare, "/o", [], published=True)).splitlines()
    assert empty[1:] == ["0/0 patches applied; patched tree: /o"]


def test_a_real_apply_prints_the_table_and_writes_the_same_report_as_json(
    tmp_path: Path, project: Path, upstream_dir: Path, make_patch: PatchMaker, capsys
) -> None:
    make_patch(upstream_dir, change_line_20, "Change line 20")
    moved = write_upstream(tmp_path / "upstream-b")
    replace_line(moved / "vllm" / "core.py", "line_1 = 1\n", "line_0 = 0\nline_1 = 1\n")
    code, data = run_apply(project, moved, base=upstream_dir)
    assert code == 1  # an offset is not accepted by default
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "  NO offset            demo/change-line-20.patch",
        "      vllm/core.py hunk #1 (line 17): offset +1",
        f"0/1 patches accepted; nothing written to {data['output']} "
        "(see the statuses above; --allow-offset, --allow-fuzz and --3way widen what is accepted)",
    ]
    assert data["patches"][0]["status"] == "offset" and data["published"] is False
    assert (project / "report.json").read_text().endswith("}\n")


def test_write_json_is_sorted_indented_and_masks_secrets(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    report.write_json({"b": 1, "a": {"url": "https://me:secret@example.invalid/simple"}}, path)
    text = path.read_text()
    assert text == '{\n  "a": {\n    "url": "https://me:****@example.invalid/simple"\n  },\n  "b": 1\n}\n'
    assert json.loads(text)["b"] == 1


def test_write_json_makes_its_folder_and_a_file_in_the_way_is_a_report_path_error(tmp_path: Path) -> None:
    report.write_json([], tmp_path / "missing" / "r.json")
    assert (tmp_path / "missing" / "r.json").read_text() == "[]\n"
    (tmp_path / "plain").write_text("")
    with pytest.raises(report.ReportPathError, match=r"^--json .*plain/r\.json: cannot write there \("):
        report.write_json({}, tmp_path / "plain" / "r.json")
    assert issubclass(report.ReportPathError, InputError) and issubclass(report.ReportPathError, ValueError)


def test_check_destinations_creates_parents_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "report.xml"
    report.check_destinations(junit=target, json=None)
    assert target.parent.is_dir() and list(target.parent.iterdir()) == []


def test_check_destinations_names_the_option_of_a_directory(tmp_path: Path) -> None:
    with pytest.raises(report.ReportPathError) as caught:
        report.check_destinations(json=tmp_path / "ok.json", range_diff=tmp_path)
    assert str(caught.value) == f"--range-diff {tmp_path}: is a directory; name a file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_check_destinations_refuses_a_read_only_folder(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(report.ReportPathError, match=r"--markdown .*: cannot write there"):
        report.check_destinations(markdown=locked / "a.md")


def test_check_destinations_refuses_a_file_where_a_folder_must_be(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    with pytest.raises(report.ReportPathError, match=r"^--json .*plain/r\.json: cannot write there \(File exists\)"):
        report.check_destinations(json=tmp_path / "plain" / "r.json")
