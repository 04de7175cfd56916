"""audit-upstream's command module: its flags, the run_audit call they make, and the reports it writes.

run_audit obtains two upstream releases (downloads) and applies the series to both; release_dates
asks the package index. The tests stand in for those two calls alone, at the attributes the command
looks them up by (``from vllm_overlay.audit import session`` and ``from vllm_overlay import
upstream_trees`` inside run). The lock and the series are read for real, and the table is the real
markdown of the rows the stand-in returns.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from tests.tool.helpers.repos import change_line_20
from vllm_overlay import cli, series
from vllm_overlay.audit import session
from vllm_overlay.audit.decisions import AuditRow, Decision, markdown
from vllm_overlay.upstream import indexes, lock
from vllm_overlay.upstream import trees as upstream_trees

OPTIONS = (
    "--project",
    "--index-url",
    "--upstream",
    "--from",
    "--max-age-releases",
    "--markdown",
    "--json",
    "--range-diff",
    "--offline",
)


def row(decision: Decision) -> AuditRow:
    return AuditRow("demo/a.patch", "demo", "clean", decision, "why", "no", "", "2026-11-29", 1)


def upstream(label: str) -> upstream_trees.Upstream:
    return upstream_trees.Upstream("release", label, f"release/{label}", "c" * 40, label, None, None, "index")


@pytest.fixture
def audited(monkeypatch):
    """run_audit and release_dates replaced by recorders; run_audit returns ``audited.result``."""
    recorded = SimpleNamespace(calls=[], dates_asked=[], indexes_read=[], rows=[row(Decision.KEEP)])

    def fake_release_dates(project):
        recorded.dates_asked.append(project)
        return {"0.34.0": "2026-12-01"}

    def fake_run_audit(patches, the_lock, store, spec, max_age, dates, progress=None, old_spec=None, other_lines=None):
        recorded.calls.append(
            {"patches": patches, "lock": the_lock, "store": store.root, "spec": spec, "max_age": max_age}
            | {"dates": dates, "old_spec": old_spec, "other_lines": other_lines}
        )
        recorded.indexes_read.append(indexes.configured())
        progress(1, 1, "demo/a.patch")
        return SimpleNamespace(
            old=upstream("0.33.0"),
            new=upstream("0.34.0"),
            rows=recorded.rows,
            range_diff="1:  aaa = 1:  bbb core: change line 20\n",
            seconds={"obtain upstreams": 1.5, "apply": 0.5},
            lines={"locked": "0.34.0"},
        )

    monkeypatch.setattr(upstream_trees, "release_dates", fake_release_dates)
    monkeypatch.setattr(session, "run_audit", fake_run_audit)
    return recorded


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("audit-upstream", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "Exit codes: 0 every row is keep; 1 some patch needs refresh, drop or resolve" in text


def test_upstream_is_required_and_max_age_a_number(audited, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit-upstream"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --upstream" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit-upstream", "--upstream", "0.34.0", "--max-age-releases", "old"])
    assert exit_info.value.code == 2
    assert audited.calls == []


def test_defaults_reach_run_audit(project, store_env, make_patch, upstream_dir, audited):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert cli.main(["audit-upstream", "--project", str(project), "--upstream", "0.34.0"]) == 0
    the_lock = lock.load(project / "upstream.lock")
    assert audited.dates_asked == [the_lock.project]
    assert audited.calls == [
        {
            "patches": series.load_series(project / "patches"),
            "lock": the_lock,
            "store": store_env,
            "spec": "0.34.0",
            "max_age": 3,
            "dates": {"0.34.0": "2026-12-01"},
            "old_spec": None,
            "other_lines": [],  # the project carries no other line (no cpu/)
        }
    ]


def test_every_flag_reaches_run_audit(project, store_env, audited):
    argv = ["audit-upstream", "--project", str(project), "--upstream", "/src/vllm", "--from", "repo@v0.32.0"]
    argv += ["--max-age-releases", "7", "--offline", "--index-url", "file:///srv/index"]
    assert cli.main(argv) == 0
    [call] = audited.calls
    assert (call["spec"], call["old_spec"], call["max_age"], call["dates"]) == ("/src/vllm", "repo@v0.32.0", 7, {})
    assert audited.dates_asked == []  # --offline: the index is not asked for release dates
    assert audited.indexes_read == [["file:///srv/index"]]  # the index the audit reads
    assert indexes.configured() != ["file:///srv/index"]  # and only that run's


def test_the_table_goes_to_stdout_and_the_range_diff_after_it(project, store_env, audited, capsys):
    assert cli.main(["audit-upstream", "--project", str(project), "--upstream", "0.34.0"]) == 0
    captured = capsys.readouterr()
    table = markdown(audited.rows, "0.33.0", "0.34.0")
    assert captured.out == table + "\n" + "1:  aaa = 1:  bbb core: change line 20\n\n"
    assert captured.err.splitlines() == [
        "[1/1] demo/a.patch",
        "range-diff (old series vs the series on the new upstream):",
        "audit took obtain upstreams 1.5 s, apply 0.5 s",
    ]


def test_the_reports_are_written_where_the_flags_say(project, store_env, audited, tmp_path, capsys):
    md, js, rd = tmp_path / "a" / "audit.md", tmp_path / "b" / "audit.json", tmp_path / "c" / "range.diff"
    argv = ["audit-upstream", "--project", str(project), "--upstream", "0.34.0"]
    assert cli.main([*argv, "--markdown", str(md), "--json", str(js), "--range-diff", str(rd)]) == 0
    table = markdown(audited.rows, "0.33.0", "0.34.0")
    assert md.read_text() == table
    assert rd.read_text() == "1:  aaa = 1:  bbb core: change line 20\n"
    assert json.loads(js.read_text()) == {
        "old": upstream("0.33.0").to_json(),
        "new": upstream("0.34.0").to_json(),
        "rows": [audited.rows[0].to_json()],
        "seconds": {"obtain upstreams": 1.5, "apply": 0.5},
        "lines": {"locked": "0.34.0"},
    }
    captured = capsys.readouterr()
    assert captured.out == table + "\n"  # the range-diff went to its file, not to stdout
    assert "range-diff (old series" not in captured.err


@pytest.mark.parametrize("decision", [Decision.REFRESH, Decision.DROP, Decision.RESOLVE])
def test_any_row_but_keep_is_exit_1(project, store_env, audited, decision):
    audited.rows = [row(Decision.KEEP), row(decision)]
    assert cli.main(["audit-upstream", "--project", str(project), "--upstream", "0.34.0"]) == 1


def test_a_project_without_a_lock_is_exit_2_in_one_line(tmp_path, store_env, audited, capsys):
    assert cli.main(["audit-upstream", "--project", str(tmp_path), "--upstream", "0.34.0"]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"
    assert audited.calls == [] and audited.dates_asked == []
