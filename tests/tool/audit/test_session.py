"""Moving to a new upstream: AST target drift, the audit, bump with a conflict, and the round trip."""

from __future__ import annotations

import datetime as dt
import json

import git
import pytest

from tests.tool.helpers.repos import FORWARDED, REPO_ROOT, change_line_20, replace_line, retarget, write_upstream
from vllm_overlay import bump, cli, series
from vllm_overlay.audit import targets
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees

MODULE_V1 = "class Engine:\n    def step(self, x):\n        return x + 1\n\n    def other(self):\n        return 0\n"


def reader(text: str | None):
    return lambda path: text if path == "vllm/engine.py" else None


def test_target_drift_is_by_ast_not_by_text():
    moved = (
        "\n\n# a comment\nclass Engine:\n    def step(self,   x):\n        return (x + 1)\n\n"
        "    def other(self):\n        return 1\n"
    )
    assert targets.compare("vllm.engine:Engine.step", reader(MODULE_V1), reader(moved)).drift is targets.Drift.UNCHANGED
    assert targets.compare("vllm.engine:Engine.other", reader(MODULE_V1), reader(moved)).drift is targets.Drift.CHANGED
    assert targets.compare("vllm.engine:Engine.gone", reader(MODULE_V1), reader(moved)).drift is targets.Drift.ABSENT
    assert targets.compare("vllm.engine:Engine.step", reader(MODULE_V1), reader(None)).drift is targets.Drift.REMOVED
    broken = targets.compare("vllm.engine:Engine.step", reader(MODULE_V1), reader("def (:\n"))
    assert broken.drift is targets.Drift.UNPARSABLE


def with_engine(tree, body=MODULE_V1):
    (tree / "vllm" / "engine.py").write_text(body)
    return tree


def test_audit_rows_for_each_decision(project, make_patch, tmp_path, store_env, capsys):
    old = with_engine(write_upstream(tmp_path / "old"))
    p_keep = make_patch(old, change_line_20, "keep me")
    p_drift = make_patch(old, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "drift")
    retarget(p_drift, "vllm.engine:Engine.step")
    make_patch(old, lambda t: replace_line(t / "vllm" / "core.py", "line_35 = 35\n", "line_35 = 350\n"), "landed")
    make_patch(old, lambda t: replace_line(t / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 300\n"), "clash")
    new = with_engine(write_upstream(tmp_path / "new"), MODULE_V1.replace("x + 1", "x + 2"))
    replace_line(new / "vllm" / "core.py", "line_35 = 35\n", "line_35 = 350\n")  # upstream took "landed"
    replace_line(new / "vllm" / "core.py", "line_30 = 30\n", "line_30 = 31\n")  # upstream clashes with "clash"
    assert p_keep.exists()
    out_json = tmp_path / "audit.json"
    code = cli.main(
        [
            "audit-upstream",
            "--project",
            str(project),
            "--from",
            str(old),
            "--upstream",
            str(new),
            "--offline",
            "--json",
            str(out_json),
            "--range-diff",
            str(tmp_path / "rd.txt"),
        ]
    )
    assert code == 1
    rows = {row["patch"].split("/")[1]: row for row in json.loads(out_json.read_text())["rows"]}
    assert rows["keep-me.patch"]["decision"] == "keep"
    assert rows["drift.patch"]["decision"] == "refresh"
    assert "applied cleanly, target changed: vllm.engine:Engine.step" in rows["drift.patch"]["reason"]
    assert rows["landed.patch"]["decision"] == "drop" and rows["landed.patch"]["status"] == "already-upstream"
    assert rows["clash.patch"]["decision"] == "resolve" and rows["clash.patch"]["status"] == "conflict"
    assert rows["keep-me.patch"]["forwarded"] == FORWARDED.removeprefix("Forwarded: ")
    range_diff = (tmp_path / "rd.txt").read_text()
    assert "keep me" in range_diff and "clash" in range_diff
    assert "| drift.patch" in capsys.readouterr().out.replace("demo/", "| ").replace("| | ", "| ")


def test_staleness_warning_counts_releases():
    dates = {"1.0": dt.date(2026, 1, 1), "1.1": dt.date(2026, 2, 1), "1.2": dt.date(2026, 3, 1)}
    from vllm_overlay.audit import decisions

    assert decisions.releases_since("2025-12-01", dates, "1.2") == 3
    assert decisions.releases_since("2026-01-15", dates, "1.1") == 1
    assert decisions.releases_since("not a date", dates, "1.2") is None


def test_bump_stops_at_conflict_then_continues(project, make_patch, tmp_path, store_env):
    old = write_upstream(tmp_path / "old")
    make_patch(old, change_line_20, "change 20")
    make_patch(old, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "change 5")
    new = write_upstream(tmp_path / "new")
    replace_line(new / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 5  # upstream\n")
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    store = Store()
    old_up = upstream_trees.obtain(str(old), the_lock, store)  # the series' base: 3-way merges need its blobs
    upstream = upstream_trees.obtain(str(new), the_lock, store)
    repo_dir = tmp_path / "bump"
    patches = series.load_series(project / "patches")
    with pytest.raises(bump.BumpError) as stopped:
        bump.start(patches, upstream, store, repo_dir, str(new), seed_base=old_up.commit)
    message = str(stopped.value)
    assert "bump stopped at: change 5" in message and "vllm/core.py" in message and "--continue" in message
    core = repo_dir / "vllm" / "core.py"
    text = core.read_text()
    assert "<<<<<<<" in text
    resolved = text.split("<<<<<<<")[0] + "line_5 = 50  # upstream\n" + text.split(">>>>>>>")[1].split("\n", 1)[1]
    core.write_text(resolved)
    git.Repo(repo_dir).git.add("vllm/core.py")
    bump.resume(repo_dir)
    changed = bump.finish(repo_dir, project / "patches")
    assert "demo/change-5.patch" in changed
    assert "line_5 = 50  # upstream" in (project / "patches" / "demo" / "change-5.patch").read_text()
    assert "Patch-File" not in (project / "patches" / "demo" / "change-5.patch").read_text()


def test_bump_there_and_back_is_byte_identical(project, make_patch, tmp_path, store_env):
    old = write_upstream(tmp_path / "old")
    make_patch(old, change_line_20, "change 20")
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    store = Store()
    old_up = upstream_trees.obtain(str(old), the_lock, store)
    cli.main(["apply-patches", "--project", str(project), "--upstream", str(old), "--base-upstream", str(old)])
    cli.main(["export-patches", "--allow-other-upstream", "--project", str(project)])
    before = {p.name: p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}
    new = write_upstream(tmp_path / "new")
    (new / "vllm" / "core.py").write_text("header = 0\n" + (new / "vllm" / "core.py").read_text())
    new_up = upstream_trees.obtain(str(new), the_lock, store)
    for upstream in (new_up, old_up):
        bump.start(series.load_series(project / "patches"), upstream, store, tmp_path / "bump", "x", old_up.commit)
        bump.finish(tmp_path / "bump", project / "patches")
    after = {p.name: p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}
    assert after == before


def test_new_lock_takes_everything_from_the_release(tmp_path, store_env, monkeypatch):
    tree = write_upstream(
        tmp_path / "rel",
        extra={
            "PKG-INFO": "Metadata-Version: 2.1\nName: vllm\n"
            "Requires-Dist: torch==2.99.0\nRequires-Dist: flashinfer-python==9.9\n"
            'Requires-Dist: pytest==1.0; extra == "test"\n'
        },
    )
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    store = Store()
    imported = upstream_trees.obtain(str(tree), the_lock, store)
    release = upstream_trees.Upstream(**{**imported.to_json(), "kind": "release", "version": "9.9.9"})
    files = [
        upstream_trees.IndexFile("vllm-9.9.9.tar.gz", "u", "a" * 64, None),
        upstream_trees.IndexFile("vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl", "u", "b" * 64, None),
        upstream_trees.IndexFile("vllm-9.9.9-cp38-abi3-manylinux_2_28_aarch64.whl", "u", "c" * 64, None),
    ]
    monkeypatch.setattr(upstream_trees, "release_files", lambda project, version: files)
    relocked = bump.new_lock(the_lock, release, store)
    assert relocked.version == "9.9.9" and relocked.commit == "gdeadbeef"
    assert relocked.sdist.sha256 == "a" * 64 and relocked.wheels["aarch64"].sha256 == "c" * 64
    assert relocked.base_image == "vllm/vllm-openai:v9.9.9" and relocked.base_digest == ""
    assert relocked.pins == {"torch": "2.99.0", "flashinfer-python": "9.9"}
    lock.parse(lock.render(relocked))
