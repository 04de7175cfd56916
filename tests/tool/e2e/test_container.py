"""The image path's pieces that need no engine: the base's tar stream, the run command, the entrypoint."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import tarfile
from pathlib import Path

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay.e2e import container
from vllm_overlay.image import engine


def _load_preflight():
    """overlay/vllm_overlay_status/preflight.py (standard library only), loaded from its file: the status
    package ships into images, it is not a module of the tool, and this process's path stays as it is."""
    path = REPO_ROOT / "overlay" / "vllm_overlay_status" / "preflight.py"
    spec = importlib.util.spec_from_file_location("overlay_status_preflight", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


preflight = _load_preflight()


def _rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr" / "lib" / "python3.11").mkdir(parents=True)
    (root / "usr" / "local").mkdir(parents=True)
    (root / "usr" / "lib" / "python3.11" / "os.py").write_text("# stdlib\n")
    tar = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tar), "."], check=True)
    return tar


def test_the_base_stream_is_the_rootfs_then_the_runtime_at_purelib(tmp_path):
    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("version = 1\n")
    (site / "vllm" / "alias.py").symlink_to("__init__.py")
    (site / "vllm" / "__pycache__").mkdir()
    (site / "vllm" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"host bytecode")
    sink = io.BytesIO()
    count = container._stream_rootfs(_rootfs(tmp_path), site, "/usr/local/lib/python3.11/dist-packages", sink)
    sink.seek(0)
    with tarfile.open(fileobj=sink) as made:
        members = {m.name.removeprefix("./"): m for m in made.getmembers()}
        body = made.extractfile(members["usr/local/lib/python3.11/dist-packages/vllm/__init__.py"]).read()
    assert count == 3  # vllm/, vllm/__init__.py, vllm/alias.py: never the host interpreter's bytecode
    assert not [name for name in members if "__pycache__" in name]
    assert body == b"version = 1\n"
    assert members["usr/lib/python3.11/os.py"].isreg()
    # the directories above site-packages that the rootfs lacks come before what they hold
    names = [m.removeprefix("./") for m in members]
    for parent in ("usr/local/lib", "usr/local/lib/python3.11", "usr/local/lib/python3.11/dist-packages"):
        assert members[parent].isdir()
        assert names.index(parent) < names.index("usr/local/lib/python3.11/dist-packages/vllm/__init__.py")
    link = members["usr/local/lib/python3.11/dist-packages/vllm/alias.py"]
    assert link.issym() and link.linkname == "__init__.py"
    assert all(m.uid == 0 and m.gid == 0 for m in members.values() if m.name.startswith("usr/local"))


def test_a_container_server_shares_only_loopback_and_pids_and_mounts_the_model_read_only(tmp_path):
    eng = engine.Engine("podman", "/usr/bin/podman", container.RUN_OPTIONS["podman"])
    spec = container.spec_for("patched image")
    server = container.ContainerServer(eng, "localhost/x:1", spec, tmp_path / "model", tmp_path / "s.log")
    argv = server.run_argv()
    assert argv[:3] == ["/usr/bin/podman", "--runtime", "runc"] and argv[3] == "run"
    joined = " ".join(argv)
    for flag in ("--network host", "--pid host", f"--cidfile {tmp_path / 's.cid'}", "--rm"):
        assert flag in joined
    assert f"-v {tmp_path / 'model'}:/model:ro" in joined
    assert "-e HF_HUB_OFFLINE=1" in joined and "-e VLLM_CPU_KVCACHE_SPACE=1" in joined
    image_at = argv.index("localhost/x:1")
    assert argv[image_at + 1 : image_at + 4] == ["nice", "-n", "10"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--entrypoint" not in argv
    server.entrypoint = ["sh", "-c", 'exec "$@"', "sh"]
    argv = server.run_argv()
    assert argv[argv.index("--entrypoint") + 1] == "sh"
    assert argv[argv.index("localhost/x:1") + 1 :][:3] == ["-c", 'exec "$@"', "sh"]


def test_the_entrypoint_runs_preflight_then_the_base_entrypoint_with_the_arguments(tmp_path):
    script = tmp_path / "entrypoint"
    preflight.write_script(script, "/usr/bin/python3", "vllm serve")
    text = script.read_text()
    assert "/usr/bin/python3 -m vllm_overlay_status preflight || exit $?" in text
    assert text.rstrip().endswith('exec vllm serve "$@"')
    assert script.stat().st_mode & 0o111
    preflight.write_script(script, "/usr/bin/python3", "")
    assert script.read_text().rstrip().endswith('exec "$@"')


def test_the_entrypoint_stops_when_preflight_refuses(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho refused >&2\nexit 2\n")
    fake.chmod(0o755)
    script = tmp_path / "entrypoint"
    preflight.write_script(script, str(fake), "echo")
    done = subprocess.run([str(script), "served"], capture_output=True, text=True)
    assert done.returncode == 2 and "served" not in done.stdout and "refused" in done.stderr
    fake.write_text("#!/bin/sh\nexit 0\n")
    done = subprocess.run([str(script), "served"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "served"


def test_preflight_reads_vllm_plugins_as_vllm_does():
    assert not [p for p in preflight.problems({}) if p.startswith("plugins-excluded")]
    excluded = [p for p in preflight.problems({"VLLM_PLUGINS": "a, vllm_overlay_status"}) if "plugins-excluded" in p]
    assert excluded, "vLLM compares split(',') names exactly: ' vllm_overlay_status' is not the plugin"
    assert not [p for p in preflight.problems({"VLLM_PLUGINS": "a,vllm_overlay_status"}) if "plugins-excluded" in p]
    assert [p for p in preflight.problems({"VLLM_PLUGINS": ""}) if "plugins-excluded" in p]
