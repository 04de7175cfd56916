"""verify (in-image code, run tool-side) on a fake site-packages: pristine, replaced files, tampering, bytecode."""

from __future__ import annotations

import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tool.helpers.installs import make_site, seed_wheel_record, sha, site_record
from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import cli
from vllm_overlay.env import record
from vllm_overlay.env.wheel_record import WheelRecord
from vllm_overlay.image import build_context, verify
from vllm_overlay.upstream import lock

OVERLAY = REPO_ROOT / "overlay"


def manifest_for(files: dict[str, bytes], wheel: str | None = None) -> dict:
    """A manifest as staging writes it; ``wheel``: the wheel RECORD it states (default: the fake site's)."""
    return {
        "expected_record": {
            "sha256": record.text_sha256(wheel or WHEEL_RECORD),
            "path": "vllm_overlay_status/wheel.RECORD",
        },
        "format": 1,
        "upstream": {"project": "vllm", "version": "0.33.0", "commit": "g4ba787ec9"},
        "series_sha256": "0" * 64,
        "series": [{"name": "demo", "layer": "01-demo", "patches": [], "files": []}],
        "files": {rel: sha(data) for rel, data in files.items()},
        "overlay_files": {},
        "unshipped": [],
    }


WHEEL_RECORD = site_record(make_site(Path(__import__("tempfile").mkdtemp()) / "wheel"))  # as the wheel has it


@pytest.fixture
def site(tmp_path: Path, store_env: Path) -> Path:
    """The fake vllm install; its wheel's RECORD is in the cache as if downloaded and checked."""
    made = make_site(tmp_path / "site-packages")
    assert site_record(made) == WHEEL_RECORD
    seed_wheel_record(store_env, lock.load(REPO_ROOT / "upstream.lock"), WHEEL_RECORD)
    return made


def check(site: Path, manifest: dict, expected: str | None = WHEEL_RECORD) -> list[str]:
    """Tool-side (the wheel's RECORD given); ``expected=None``: in-image (the copy the status package carries)."""
    if expected is None:
        verify.status_package(OVERLAY)
        return __import__("importlib").import_module("vllm_overlay_status.checks").verify(site, manifest)
    return verify.verify_site_packages(site, manifest, OVERLAY, expected)


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


def install_status_package(
    site: Path, manifest: dict, wheel: str = WHEEL_RECORD, extra: dict[str, bytes] | None = None
) -> None:
    """What the image's overlay layer holds, as staging makes it: the package, a copy of record.py, the
    wheel's RECORD, a dist-info, the manifest stating every file of them, and their RECORD."""
    shutil.copytree(
        OVERLAY / "vllm_overlay_status", site / "vllm_overlay_status", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(OVERLAY / "vllm_overlay_status-0.1.0.dist-info", site / "vllm_overlay_status-0.1.0.dist-info")
    shutil.copy(REPO_ROOT / "vllm_overlay/env/record.py", site / "vllm_overlay_status/_record.py")
    for name, data in (extra or {}).items():
        (site / "vllm_overlay_status" / name).write_bytes(data)
    build_context.seal_status_package(site, manifest, WheelRecord("vllm-0.33.0-fake.whl", "0" * 64, wheel))


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
    install_status_package(site, manifest_for({}), extra={"sbom.cdx.json": b'{"bomFormat": "CycloneDX"}\n'})
    status = site / "vllm_overlay_status"
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


# --- what an attacker with write access to site-packages does after editing a module ----------------
# Each attack passed (rc 0, "verified") while the installed RECORD was the expectation. Checked both
# ways: tool-side (the lock's wheel RECORD given) and in-image (the copy the manifest states).

EDIT = b"value = 666  # edited\n"


@pytest.fixture
def image_site(site: Path) -> Path:
    """The fake vllm with the status package installed as an image carries it (no patches)."""
    install_status_package(site, manifest_for({}))
    return site


def both(site: Path) -> list[list[str]]:
    manifest = json.loads((site / "vllm_overlay_status/manifest.json").read_text())
    return [check(site, manifest), check(site, manifest, expected=None)]


def dist_info(site: Path) -> Path:
    return site / "vllm-0.33.0.dist-info"


def test_an_edited_module_with_record_deleted_fails(image_site):
    (image_site / "vllm/core.py").write_bytes(EDIT)
    (dist_info(image_site) / "RECORD").unlink()
    for problems in both(image_site):
        assert "record-missing: vllm-0.33.0.dist-info/RECORD (the installed RECORD is gone)" in problems
        assert any(p.startswith(("size: vllm/core.py", "modified: vllm/core.py")) for p in problems), problems


def test_an_edited_module_with_record_emptied_fails(image_site):
    (image_site / "vllm/core.py").write_bytes(EDIT)
    (dist_info(image_site) / "RECORD").write_text("")
    for problems in both(image_site):
        assert "record-missing: vllm-0.33.0.dist-info/RECORD (the installed RECORD is empty)" in problems


def test_an_edited_module_with_its_record_row_rewritten_fails(image_site):
    (image_site / "vllm/core.py").write_bytes(EDIT)
    rows = (dist_info(image_site) / "RECORD").read_text().splitlines()
    forged = f"vllm/core.py,{record.record_hash(sha(EDIT))},{len(EDIT)}"
    (dist_info(image_site) / "RECORD").write_text(
        "\n".join(forged if r.startswith("vllm/core.py,") else r for r in rows)
    )
    for problems in both(image_site):
        assert any(p.startswith("size: vllm/core.py") for p in problems), problems
        assert any(p.startswith("record-altered: vllm-0.33.0.dist-info/RECORD (row vllm/core.py") for p in problems)


def test_the_carried_wheel_record_rewritten_for_an_edit_fails(image_site):
    """The copy in the image is held to the manifest's sha256 (and the manifest to the label)."""
    (image_site / "vllm/core.py").write_bytes(EDIT)
    forged = WHEEL_RECORD.replace(
        next(r for r in WHEEL_RECORD.splitlines() if r.startswith("vllm/core.py,")),
        f"vllm/core.py,{record.record_hash(sha(EDIT))},{len(EDIT)}",
    )
    (image_site / "vllm_overlay_status/wheel.RECORD").write_text(forged)
    (dist_info(image_site) / "RECORD").write_text(forged)
    in_image = both(image_site)[1]
    assert any(p.startswith("expected-record: vllm_overlay_status/wheel.RECORD is missing or is not") for p in in_image)


def test_the_status_package_without_its_record_or_dist_info_and_a_no_op_plugin_fails(image_site):
    plugin = image_site / "vllm_overlay_status/plugin.py"
    plugin.write_text("def register() -> None:\n    pass\n")
    own = image_site / "vllm_overlay_status-0.1.0.dist-info"
    (own / "RECORD").unlink()
    for problems in both(image_site):
        assert "overlay-mismatch: vllm_overlay_status/plugin.py" in problems, problems
        assert "record-missing: vllm_overlay_status-0.1.0.dist-info/RECORD" in problems
    shutil.rmtree(own)
    for problems in both(image_site):
        assert "overlay-mismatch: vllm_overlay_status/plugin.py" in problems
        assert "overlay-missing: vllm_overlay_status-0.1.0.dist-info/entry_points.txt" in problems


def test_a_symlinked_directory_inside_vllm_fails(image_site, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "__init__.py").write_text("print('runs on import vllm.extras')\n")
    (image_site / "vllm/extras").symlink_to(outside, target_is_directory=True)
    for problems in both(image_site):
        assert f"symlink: vllm/extras (directory -> {outside})" in problems, problems


def test_a_recorded_module_replaced_by_a_symlink_fails(image_site, tmp_path):
    copy = tmp_path / "core.py"
    copy.write_bytes((image_site / "vllm/core.py").read_bytes())  # same bytes today; it can change any time
    (image_site / "vllm/core.py").unlink()
    (image_site / "vllm/core.py").symlink_to(copy)
    for problems in both(image_site):
        assert f"symlink: vllm/core.py (-> {copy})" in problems, problems


def test_the_in_image_command_fails_on_a_deleted_record(image_site, tmp_path):
    """python3 -m vllm_overlay_status verify, as the image and the entrypoint's preflight run it."""
    (image_site / "vllm/core.py").write_bytes(EDIT)
    (dist_info(image_site) / "RECORD").unlink()
    code = (
        f"import sys, runpy; sys.path.insert(0, {str(image_site)!r}); "
        f"sys.argv = ['x', 'verify', '--site-packages', {str(image_site)!r}]; "
        "runpy.run_module('vllm_overlay_status', run_name='__main__')"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 1 and "record-missing: vllm-0.33.0.dist-info/RECORD" in done.stderr, done.stdout


def test_the_entrypoint_holds_preflight_to_the_manifest_the_build_verified(image_site, tmp_path):
    """The manifest says what every file must be: edited to bless an edit, the preflight refuses it."""
    shutil.copy(OVERLAY / "vllm_overlay_status_gate.py", image_site / "vllm_overlay_status_gate.py")
    manifest_file = image_site / "vllm_overlay_status/manifest.json"
    script = tmp_path / "entrypoint"
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(image_site)}

    def main(*argv: str) -> subprocess.CompletedProcess:
        run = "runpy.run_module('vllm_overlay_status', run_name='__main__')"
        code = f"import sys, runpy; sys.argv = ['x', *{list(argv)!r}]; {run}"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)

    assert main("entrypoint", "--write", str(script), "--then", "").returncode == 0
    line = next(x for x in script.read_text().splitlines() if " preflight" in x)
    assert line.endswith(f"preflight --expect manifest_sha256={sha(manifest_file.read_bytes())} || exit $?")
    argv = line.split(" -m vllm_overlay_status ", 1)[1].split(" ||")[0].split()
    ok = main(*argv, "--site-packages", str(image_site))
    assert ok.returncode == 0, ok.stderr
    (image_site / "vllm/core.py").write_bytes(EDIT)
    manifest = json.loads(manifest_file.read_text())
    manifest["files"]["vllm/core.py"] = sha(EDIT)  # the edit, blessed by the manifest
    manifest_file.write_text(json.dumps(manifest))
    refused = main(*argv, "--site-packages", str(image_site))
    assert refused.returncode == 1 and "label manifest_sha256 says" in refused.stderr, refused.stderr
