"""cache: listing the cache and pruning test environments of other locks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import cache, cli
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock


def fake_environment(store: Store, key: str, payload: int) -> Path:
    """A published environment as testenv.ensure leaves it: a hidden build dir and a symlink to it."""
    real = store.envs / f".{key}.123-456"
    (real / "bin").mkdir(parents=True)
    (real / "bin" / "python").write_bytes(b"x" * payload)
    (store.envs / key).symlink_to(real.name)
    (store.envs / f"{key}.build.log").write_text("log\n")
    return real


def test_prune_removes_other_locks_environments_and_unfinished_builds(project, store_env, capsys):
    the_lock = lock.load(project / "upstream.lock")
    store = Store()
    current = cache.current_key(the_lock)
    kept = fake_environment(store, current, 10)
    stale = fake_environment(store, "0123456789abcdef01234567", 1000)
    stray_link = store.envs / f".{current}.link-42"  # left by a build killed mid-publication
    stray_link.symlink_to(kept.name)
    unfinished = store.envs / f".{current}.999-999"
    unfinished.mkdir()
    (unfinished / "partial").write_bytes(b"y" * 100)
    (store.root / "downloads").mkdir()
    (store.root / "downloads" / "a.tar.gz").write_bytes(b"z" * 7)

    listed = {e.path.name: e for e in cache.entries(store, the_lock)}
    assert listed[current].status == cache.CURRENT and listed[current].size == 10
    assert listed["0123456789abcdef01234567"].status == cache.STALE and listed["0123456789abcdef01234567"].size == 1000
    assert listed[unfinished.name].status == cache.ORPHAN
    assert listed["downloads"].status == cache.KEPT and listed["downloads"].size == 7

    assert cli.main(["cache", "--project", str(project), "--prune", "--dry-run"]) == 0
    assert stale.exists() and unfinished.exists()
    assert "would remove 4 item(s)" in capsys.readouterr().err

    assert cli.main(["cache", "--project", str(project), "--prune"]) == 0
    assert not stale.exists() and not (store.envs / "0123456789abcdef01234567").exists()
    assert not (store.envs / "0123456789abcdef01234567.build.log").exists()
    assert not unfinished.exists() and not stray_link.is_symlink()
    assert kept.exists() and (store.envs / current).resolve() == kept.resolve()
    assert (store.envs / f"{current}.build.log").exists()
    assert (store.root / "downloads" / "a.tar.gz").exists()


def test_listing_an_empty_cache(project, store_env, capsys):
    assert cli.main(["cache", "--project", str(project)]) == 0
    assert "--prune would free 0.00 GB" in capsys.readouterr().err


def test_dry_run_needs_prune(project, store_env):
    assert cli.main(["cache", "--project", str(project), "--dry-run"]) == 2


def test_tool_requirements_of_an_installed_tool_come_from_its_metadata(tmp_path, monkeypatch):
    """Without pyproject.toml beside the package (pip install ., the Dockerfile's tool stage), the
    installed distribution's Requires-Dist gives the same list, extras left out (and the same env key).

    The installed distribution is made here (a dist-info on sys.path, as pip writes one), so the
    test does not depend on whether this checkout was pip-installed into the running interpreter.
    """
    import tomllib

    from vllm_overlay.env import testenv

    from_checkout = testenv.tool_requirements()
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    site = tmp_path / "site"
    dist_info = site / "vllm_overlay_installed_copy-0.1.0.dist-info"
    dist_info.mkdir(parents=True)
    requires = [f"Requires-Dist: {text}" for text in project["dependencies"]]
    requires += [f'Requires-Dist: {text}; extra == "test"' for text in project["optional-dependencies"]["test"]]
    metadata = ["Metadata-Version: 2.1", "Name: vllm-overlay-installed-copy", "Version: 0.1.0", *requires]
    (dist_info / "METADATA").write_text("\n".join(metadata) + "\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(testenv, "TOOL_PYPROJECT", tmp_path / "absent" / "pyproject.toml")
    monkeypatch.setattr(testenv, "TOOL_DISTRIBUTION", "vllm-overlay-installed-copy")
    assert testenv.tool_requirements() == from_checkout
    assert not any("extra" in text or text.startswith("pytest") for text in from_checkout)
    monkeypatch.setattr(testenv, "TOOL_DISTRIBUTION", "vllm-overlay-not-installed")
    with pytest.raises(testenv.EnvError, match="dependencies"):
        testenv.tool_requirements()


def test_prune_keeps_the_cpu_runtime_of_this_checkout(project, store_env, monkeypatch):
    from vllm_overlay.cpu import runtime as cpu_runtime

    the_lock = lock.load(project / "upstream.lock")
    store = Store()
    runtime = fake_environment(store, "cpu-0123456789abcdef0123", 10)
    old_runtime = fake_environment(store, "cpu-fedcba9876543210fedc", 10)
    monkeypatch.setattr(cpu_runtime, "cached_key", lambda store, lock_path=None: "cpu-0123456789abcdef0123")
    listed = {e.path.name: e for e in cache.entries(store, the_lock)}
    assert listed["cpu-0123456789abcdef0123"].status == cache.CURRENT
    assert listed["cpu-fedcba9876543210fedc"].status == cache.STALE
    cache.prune(store, the_lock)
    assert runtime.exists() and (store.envs / "cpu-0123456789abcdef0123.build.log").exists()
    assert not old_runtime.exists()


def test_the_listing_asks_the_store_what_the_cache_holds(project, store_env):
    """Every folder the store names is listed as what it holds, one it does not name too; the end-to-end
    suite's verdicts are listed apart from test-patches' scopes and kept by --prune."""
    from vllm_overlay.e2e import verdict

    the_lock = lock.load(project / "upstream.lock")
    store = Store()
    made_of = {"files": {}}
    e2e_verdict = verdict.keep(store, verdict.key(made_of), made_of, {"ok": True}, "| table |\n")
    for path in (store.ci / "docker", store.oracle_examples / "demo", store.dependencies, store_env / "by-hand"):
        path.mkdir(parents=True)
    listed = {e.path: e for e in cache.entries(store, the_lock)}
    assert (listed[store.verdicts / "e2e"].kind, listed[store.verdicts / "e2e"].status) == ("verdicts", cache.KEPT)
    assert listed[store.ci].kind == "CI stand-ins" and listed[store.oracle_examples].kind == "oracle examples"
    assert listed[store.dependencies].kind == "dependency code"
    assert (listed[store_env / "by-hand"].kind, listed[store_env / "by-hand"].status) == ("unknown folder", cache.KEPT)
    assert store.verdicts not in listed  # its scopes are listed one by one
    assert all(e.status == cache.KEPT for e in listed.values())
    assert cache.prune(store, the_lock) == [] and e2e_verdict.is_file()
