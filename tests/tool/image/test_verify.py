"""verify (in-image code, run tool-side) on a fake site-packages: pristine, replaced files, tampering, bytecode."""

from __future__ import annotations

import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tool.helpers import REPO_ROOT, make_site, sha
from vllm_overlay import cli
from vllm_overlay.image import verify

OVERLAY = REPO_ROOT / "overlay"


def manifest_for(files: dict[str, bytes]) -> dict:
    return {
        "format": 1,
        "upstream": {"project": "vllm", "version": "0.33.0", "commit": "g4ba787ec9"},
        "series_sha256": "0" * 64,
        "series": [{"name": "demo", "layer": "01-demo", "patches": [], "files": []}],
        "files": {rel: sha(data) for rel, data in files.items()},
        "overlay_files": {},
        "unshipped": [],
    }


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return make_site(tmp_path / "site-packages")


def check(site: Path, manifest: dict) -> list[str]:
    return verify.verify_site_packages(site, manifest, OVERLAY)


def test_pristine_site_verifies(site):
    assert check(site, manifest_for({})) == []


def test_replaced_and_added_files_verify_against_the_manifest(site):
    patched = {"vllm/core.py": b"value = 2\n", "vllm/new.py": b"NEW = 1\n"}
    for rel, data in patched.items():
        (site / rel).write_bytes(data)
    assert check(site, manifest_for(patched)) == []
    assert any("core.py" in p for p in check(site, manifest_for({})))  # without the manifest: a difference


def test_tampered_files_are_named(site):
    patched = {"vllm/core.py": b"value = 2\n"}
    (site / "vllm/core.py").write_bytes(patched["vllm/core.py"] + b"# tampered\n")
    (site / "vllm/utils/math.py").write_bytes(b"def cdiv(a, b):\n    return 0\n")
    (site / "vllm/sneaky.py").write_bytes(b"")
    problems = check(site, manifest_for(patched))
    assert any(p.startswith("replaced-mismatch: vllm/core.py") for p in problems)
    assert any("vllm/utils/math.py" in p for p in problems)
    assert any(p.startswith("unrecorded: vllm/sneaky.py") for p in problems)


def test_wrong_version_and_missing_dist(tmp_path):
    assert check(make_site(tmp_path / "a", version="0.32.0"), manifest_for({}))[0].startswith("version:")
    (tmp_path / "empty").mkdir()
    assert check(tmp_path / "empty", manifest_for({}))[0].startswith("no-dist:")


def test_stale_bytecode_of_a_replaced_file(site):
    source = site / "vllm/core.py"
    new = b"value = 2\n"
    stale = py_compile.compile(str(source), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    source.write_bytes(new)
    problems = check(site, manifest_for({"vllm/core.py": new}))
    assert any(p.startswith("stale-bytecode:") for p in problems), problems
    Path(stale).unlink()
    py_compile.compile(str(source), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert check(site, manifest_for({"vllm/core.py": new})) == []


def install_status_package(site: Path, manifest: dict) -> None:
    """What the image's overlay layer does: the package, a copy of record.py, the manifest, a dist-info."""
    shutil.copytree(
        OVERLAY / "vllm_overlay_status", site / "vllm_overlay_status", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(OVERLAY / "vllm_overlay_status-0.1.0.dist-info", site / "vllm_overlay_status-0.1.0.dist-info")
    shutil.copy(REPO_ROOT / "vllm_overlay/record.py", site / "vllm_overlay_status/_record.py")
    (site / "vllm_overlay_status/manifest.json").write_text(json.dumps(manifest))


def test_in_image_command_and_plugin_without_the_tool(site, tmp_path):
    """python -m vllm_overlay_status verify/status and the plugin, with only site-packages on the path."""
    patched = {"vllm/core.py": b"value = 2\n"}
    (site / "vllm/core.py").write_bytes(patched["vllm/core.py"])
    install_status_package(site, manifest_for(patched))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-I", *argv], capture_output=True, text=True, env=env, cwd=tmp_path)

    def module(command: str) -> subprocess.CompletedProcess:
        code = (
            f"import sys, runpy; sys.path.insert(0, {str(site)!r}); "
            f"sys.argv = ['x', {command!r}, '--site-packages', {str(site)!r}]; "
            "runpy.run_module('vllm_overlay_status', run_name='__main__')"
        )
        return run("-c", code)

    verify_ok = module("verify")
    assert verify_ok.returncode == 0, verify_ok.stderr
    assert "verified" in verify_ok.stdout
    status = module("status")
    assert status.returncode == 0 and "series 1: demo" in status.stdout, status.stdout + status.stderr
    plugin = (
        f"import sys; sys.path.insert(0, {str(site)!r}); from vllm_overlay_status.plugin import register; register()"
    )
    assert run("-c", plugin).returncode == 0
    (site / "vllm/core.py").write_bytes(b"value = 3\n")
    failed = run("-c", plugin)
    assert failed.returncode != 0 and "OverlayMismatch" in failed.stderr
    tampered = module("verify")
    assert tampered.returncode == 1 and "replaced-mismatch: vllm/core.py" in tampered.stderr


def test_verify_install_command(site, tmp_path, capsys):
    assert cli.main(["verify-install", "--site-packages", str(site)]) == 0
    (site / "vllm/core.py").write_bytes(b"tampered\n")
    report = tmp_path / "verify.json"
    assert cli.main(["verify-install", "--site-packages", str(site), "--json", str(report)]) == 1
    assert json.loads(report.read_text())["ok"] is False
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(manifest_for({"vllm/core.py": b"tampered\n"})))
    assert cli.main(["verify-install", "--site-packages", str(site), "--manifest", str(manifest)]) == 0


def test_verify_checks_what_the_labels_state(site, tmp_path):
    """verify --expect: the image build passes its labels; one that misstates the image fails the build."""
    install_status_package(site, manifest_for({}))
    status = site / "vllm_overlay_status"
    (status / "sbom.cdx.json").write_bytes(b'{"bomFormat": "CycloneDX"}\n')
    truth = {
        "upstream_version": "0.33.0",
        "upstream_commit": "g4ba787ec9",
        "series_sha256": "0" * 64,
        "series": "demo",
        "manifest_sha256": sha((status / "manifest.json").read_bytes()),
        "sbom_sha256": sha((status / "sbom.cdx.json").read_bytes()),
    }

    def verify_expecting(facts: dict[str, str]) -> subprocess.CompletedProcess:
        argv = ["x", "verify", "--site-packages", str(site)]
        for name, value in facts.items():
            argv += ["--expect", f"{name}={value}"]
        code = f"import sys, runpy; sys.path.insert(0, {str(site)!r}); sys.argv = {argv!r}; " + (
            "runpy.run_module('vllm_overlay_status', run_name='__main__')"
        )
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)

    ok = verify_expecting(truth)
    assert ok.returncode == 0 and "the 6 label fact(s) given match it" in ok.stdout, ok.stdout + ok.stderr
    for name in truth:
        wrong = verify_expecting({**truth, name: "stale"})
        assert wrong.returncode == 1, name
        assert f"label {name} says 'stale'" in wrong.stderr and "--sync-dockerfile" in wrong.stderr
    (status / "sbom.cdx.json").write_bytes(b"{}\n")  # the SBOM changed after the label was computed
    assert "label sbom_sha256 says" in verify_expecting(truth).stderr
    unknown = verify_expecting({"series_sha": "x"})
    assert unknown.returncode == 1 and "--expect series_sha: unknown" in unknown.stderr


def test_a_forged_pyc_of_a_module_the_series_does_not_replace_is_named(site):
    """Python runs a timestamp pyc whose recorded mtime and size match the source, whatever it holds."""
    source = site / "vllm/utils/math.py"
    cached = Path(py_compile.compile(str(source)))  # what pip's install leaves: a timestamp pyc
    assert check(site, manifest_for({})) == []
    forged_code = compile("def cdiv(a, b):\n    return 0\n", str(source), "exec")
    header = cached.read_bytes()[:16]
    cached.write_bytes(header + __import__("marshal").dumps(forged_code))
    problems = check(site, manifest_for({}))
    assert problems == ["unverified-bytecode: vllm/utils/__pycache__/" + cached.name + " holds other code than "
                        "vllm/utils/math.py, and Python would run it"]  # fmt: skip
    # an unchecked hash pyc is never compared with its source by Python: the same forgery
    unchecked = py_compile.compile(str(source), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    data = Path(unchecked).read_bytes()
    Path(unchecked).write_bytes(data[:16] + __import__("marshal").dumps(forged_code))
    assert any(p.startswith("unverified-bytecode: vllm/utils/__pycache__/") for p in check(site, manifest_for({})))
