"""export-patches' command module: its flags, the locks it takes, and what it writes and says.

Exporting is cheap and local, so it runs for real on a project whose build/patched apply-patches
made from a tiny upstream directory (a tree on another upstream than the lock's: the refusal
--allow-other-upstream lifts). Only where the test is about which locks the command takes is
staging.output_lock stood in for, at the attribute the command looks it up by (``from
vllm_overlay import staging`` inside run).
"""

from __future__ import annotations

import contextlib

import pytest

from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.cli import verb_help
from tests.tool.helpers.repos import change_line_20, snapshot
from vllm_overlay import cli
from vllm_overlay.apply import staging

PATCH = "demo/core-change-line-20.patch"


@pytest.fixture
def built(project, make_patch, upstream_dir, store_env):
    """A project whose build/patched holds the applied one-patch series, patches/ as export writes it."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    assert export(project) == 0  # the fixture's series file in export's layout (grouped, with its header)
    return project


def export(project, *extra: str) -> int:
    return cli.main(["export-patches", "--project", str(project), "--allow-other-upstream", *extra])


def test_help_lists_every_option(capsys):
    text = verb_help("export-patches", capsys)
    for option in ("--project", "--repo", "--check", "--allow-other-upstream", "--no-wait"):
        assert option in text
    assert "--no-wait exits 2" in " ".join(text.split())


def test_without_a_patched_repository_it_is_exit_2_in_one_line(project, tmp_path, capsys):
    assert cli.main(["export-patches", "--project", str(project)]) == 2
    tree = project.resolve() / "build" / "patched"
    assert capsys.readouterr().err == f"error: {tree}: no patched repository; run scripts/apply-patches first\n"
    assert cli.main(["export-patches", "--project", str(project), "--repo", str(tmp_path / "elsewhere")]) == 2
    assert str(tmp_path / "elsewhere") in capsys.readouterr().err  # --repo is the tree looked for


def test_a_tree_on_another_upstream_is_refused_without_the_flag(built, capsys):
    before = snapshot(built / "patches")
    assert cli.main(["export-patches", "--project", str(built)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert snapshot(built / "patches") == before


def test_check_on_an_unchanged_series_is_exit_0(built, capsys):
    assert export(built, "--check") == 0
    captured = capsys.readouterr()
    assert captured.err == "patches/ is up to date (1 patches)\n" and captured.out == ""


def test_check_on_a_stale_series_prints_the_diff_and_writes_nothing(built, capsys):
    patch = built / "patches" / PATCH
    patch.write_text(patch.read_text().replace("line_20 = 200", "line_20 = 201"))
    before = snapshot(built / "patches")
    assert export(built, "--check") == 1
    captured = capsys.readouterr()
    assert "-+line_20 = 201" in captured.out and "++line_20 = 200" in captured.out
    assert captured.err == "error: patches/ is stale: run scripts/export-patches\n"
    assert snapshot(built / "patches") == before


def test_export_writes_the_missing_patch_back_and_names_it(built, capsys):
    expected = (built / "patches" / PATCH).read_bytes()
    (built / "patches" / PATCH).unlink()
    assert export(built) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == f"wrote patches/{PATCH}"
    assert "1 patches exported; 1 file(s) changed" in captured.err
    # No Dockerfile in this project: its generated parts cannot follow, a warning and not a failure.
    assert f"warning: Dockerfile not updated ({built.resolve() / 'Dockerfile'}: not found)" in captured.err
    assert (built / "patches" / PATCH).read_bytes() == expected
    assert export(built) == 0  # byte-stable: nothing more to write
    assert "1 patches exported; 0 file(s) changed" in capsys.readouterr().err


@pytest.mark.parametrize("argv, wait, locked", [([], True, 2), (["--check"], True, 1), (["--no-wait"], False, 2)])
def test_the_locks_taken_follow_check_and_no_wait(built, monkeypatch, argv, wait, locked):
    taken = []

    @contextlib.contextmanager
    def fake_lock(path, *, wait=True, on_wait=None):
        taken.append((path, wait))
        yield

    monkeypatch.setattr(staging, "output_lock", fake_lock)
    assert export(built, *argv) == 0
    tree, patches = (built / "build" / "patched").resolve(), built.resolve() / "patches"
    assert taken == [(tree, wait), (patches, wait)][:locked]  # the tree first, then patches/ (never with --check)


def test_no_wait_while_another_run_holds_the_tree_is_exit_2(built, capsys):
    """The real lock: held here as an apply-patches run would hold it."""
    before = snapshot(built / "patches")
    with staging.output_lock((built / "build" / "patched").resolve()):
        assert export(built, "--no-wait") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert snapshot(built / "patches") == before
