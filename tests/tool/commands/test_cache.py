"""cache's command module: its flags, which library call each mode makes, and what it prints.

The listing and pruning calls (vllm_overlay.cache.entries / prune) are cheap on an isolated cache
and run for real where the output is asserted from them; testenv.ensure (--env-python) builds a
~10 GB environment when missing, so that one call is stood in for, at the attribute the command
looks it up by (``from vllm_overlay.env import testenv`` inside run).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import cache, cli
from vllm_overlay.env import testenv
from vllm_overlay.upstream import lock

OPTIONS = ("--project", "--prune", "--dry-run", "--env-python")
GB = 1000**3


def entry(name: str, status: str, size: int, kind: str = "environment") -> cache.Entry:
    return cache.Entry(Path("/cache/envs") / name, kind, status, size)


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("cache", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "Exit codes: 0 done; 2 usage or input error." in text


def test_dry_run_without_prune_is_exit_2_in_one_line(project, store_env, capsys, monkeypatch):
    monkeypatch.setattr(cache, "prune", lambda *a, **k: pytest.fail("prune was called"))
    assert cli.main(["cache", "--project", str(project), "--dry-run"]) == 2
    assert capsys.readouterr().err == "error: --dry-run only goes with --prune\n"


def test_a_project_without_a_lock_is_exit_2_in_one_line(tmp_path, store_env, capsys):
    assert cli.main(["cache", "--project", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"


def test_env_python_prints_the_interpreter_of_this_locks_environment(project, store_env, capsys, monkeypatch):
    asked = []

    def fake_ensure(the_lock, store):
        asked.append((the_lock, store.root))
        return SimpleNamespace(python=Path("/cache/envs/k/bin/python"))

    monkeypatch.setattr(testenv, "ensure", fake_ensure)
    assert cli.main(["cache", "--project", str(project), "--env-python"]) == 0
    assert capsys.readouterr().out == "/cache/envs/k/bin/python\n"
    assert asked == [(lock.load(project / "upstream.lock"), store_env)]


@pytest.mark.parametrize("extra", [["--prune"], ["--dry-run"], ["--prune", "--dry-run"]])
def test_env_python_with_prune_or_dry_run_is_refused_not_half_done(project, store_env, capsys, monkeypatch, extra):
    monkeypatch.setattr(testenv, "ensure", lambda *a: pytest.fail("--env-python ran beside a prune option"))
    try:  # argparse refuses --prune beside --env-python; run() refuses --dry-run without --prune
        code = cli.main(["cache", "--project", str(project), "--env-python", *extra])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "not allowed with argument" in err or err == "error: --dry-run only goes with --prune\n"


@pytest.mark.parametrize("dry_run, verb", [(False, "removed"), (True, "would remove")])
def test_prune_passes_dry_run_and_prints_each_removed_entry(project, store_env, capsys, monkeypatch, dry_run, verb):
    asked = []

    def fake_prune(store, the_lock, dry_run=False):
        asked.append((store.root, the_lock, dry_run))
        return [entry("old", "stale", 2 * GB), entry("half", "orphan", GB // 2)]

    monkeypatch.setattr(cache, "prune", fake_prune)
    argv = ["cache", "--project", str(project), "--prune", *(["--dry-run"] if dry_run else [])]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"{verb} environment /cache/envs/old (2.00 GB, stale)",
        f"{verb} environment /cache/envs/half (0.50 GB, orphan)",
    ]
    assert captured.err == f"{verb} 2 item(s), 2.50 GB\n"
    assert asked == [(store_env, lock.load(project / "upstream.lock"), dry_run)]


def test_prune_of_an_empty_cache_removes_nothing(project, store_env, capsys):
    assert cli.main(["cache", "--project", str(project), "--prune", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "would remove 0 item(s), 0.00 GB\n"


def test_the_listing_prints_one_row_per_entry_and_what_prune_would_free(project, store_env, capsys, monkeypatch):
    listed = [entry("cur", "current", 10 * GB), entry("old", "stale", 3 * GB), entry("tmp", "orphan", GB)]
    listed.append(cache.Entry(store_env / "downloads", "cache folder", "kept", GB // 4))
    monkeypatch.setattr(cache, "entries", lambda store, the_lock: listed)
    assert cli.main(["cache", "--project", str(project)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "current    10.00 GB  environment       /cache/envs/cur",
        "stale       3.00 GB  environment       /cache/envs/old",
        "orphan      1.00 GB  environment       /cache/envs/tmp",
        f"kept        0.25 GB  cache folder      {store_env / 'downloads'}",
    ]
    key = cache.current_key(lock.load(project / "upstream.lock"))
    assert captured.err.splitlines() == [
        f"cache {store_env}; upstream.lock's environment key {key}",
        "14.25 GB in all; --prune would free 4.00 GB",
    ]


def test_the_listing_of_a_real_empty_cache(project, store_env, capsys):
    assert cli.main(["cache", "--project", str(project)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == "0.00 GB in all; --prune would free 0.00 GB"
